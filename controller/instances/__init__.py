"""Server-instances: create, delete and list (instances.py), the claim on an instance's host
state (instance_claims.py), what its guest is told (guests.py), power tasks (power_tasks.py), its
console (console.py), the admin's table of all (instance_table.py). Imports the kernel, context,
lookups, store/, audit/ and hosts/."""
