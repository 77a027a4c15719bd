"""Cloud auth users and what they own on the cluster: users (users.py), their system accounts
(accounts.py) and the UNIX groups they share files through (groups.py). Imports the kernel,
context, lookups, store/, security/ and instances/ (to refresh guests), never auth/."""
