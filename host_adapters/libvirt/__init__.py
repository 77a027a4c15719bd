"""Instances as libvirt domains: the Hypervisor of host_adapters/hypervisor.py, by job (see driver.py)."""
