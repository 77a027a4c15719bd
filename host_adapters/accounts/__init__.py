"""System accounts and UNIX groups: the Directory interface and fake (directory.py) with
local_directory.py (useradd) and ldap_directory.py (posixAccount); the UnixGroups interface and
fake (unix_groups.py) with local_groups.py (groupadd) and ldap_groups.py (posixGroup); the system
root the local commands act in (sysroot.py). Imports subp, names and fail_on only."""
