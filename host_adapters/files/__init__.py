"""A hypervisor host's files read and removed as bytes, never parsed (the kept consoles): the
HostFiles interface (host_files.py), this machine's (local_host_files.py), another's over ssh
(ssh_host_files.py), the fake (fake_host_files.py) and which one a libvirt URI gets
(host_files_choice.py). Imports subp only."""
