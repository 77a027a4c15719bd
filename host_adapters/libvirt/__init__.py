"""Instances as libvirt domains: the Hypervisor of host_adapters/hypervisor.py, by job (see
driver.py), and the libvirt `qemu` hook that writes the guests' NIC rules on the host itself
(guest_rules_hook.py). Imports hypervisor.py, guests/, images/, network/, files/, names and subp;
only fake_hypervisor.py and factory.py stand above it."""
