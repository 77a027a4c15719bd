"""The qcow2 files that reach a host: a base image opened once and checked from that descriptor
(image_source.py), an instance's disk copied to another host checked and re-pointed
(disk_copy.py). Imports hypervisor.py (its units) only."""
