"""Storage volumes, each user's home directory with a quota (volumes.py), and server-images with
server-flavors (images.py). Imports the kernel, context, lookups, store/, hosts/ and instances/."""
