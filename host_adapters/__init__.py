"""Host adapters: what the controller does to hosts, a package per effect, each with its interface,
real implementation(s) and fake side by side.

files/ (a host's files, read and removed without parsing), homes/ (home directories and their
quotas), accounts/ (system accounts and UNIX groups, local or LDAP), guests/ (what a guest is
told, shares and prints), network/ (the guests' NIC rules in nftables), images/ (base images and
moved disks checked), libvirt/ (the real Hypervisor); at the top the Hypervisor interface
(hypervisor.py), its fake (fake_hypervisor.py), many hosts (host_pool.py), the set the service
uses (factory.py), and what every package uses: subp.py (the one way to run a host command),
names.py (name checks), fail_on.py (the fakes' failing steps). The floors they stand on:
tests/ci/test_import_layers.py (HOST_ADAPTERS_FLOORS) and docs/architecture.md. Imports only
common/, never controller/, api/ or agent/.
"""
