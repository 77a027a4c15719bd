"""Hypervisor hosts: their records and the admin's commands (host_records.py), which Hypervisor
answers (host_routing.py), where a new instance goes (placement.py), base images copied between
hosts (image_copy.py), statuses brought to the hosts' view (status_sync.py), what a libvirt URI
leaves open (libvirt_uri.py). Moving instances off a host (drain, evacuate) is in maintenance/.
Imports the kernel and context only."""
