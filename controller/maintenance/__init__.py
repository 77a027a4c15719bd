"""An admin's work on hosts and drift: drain a host (drain.py), evacuate a dead one (evacuate.py),
compare the database with the hosts and repair (reconcile.py). Imports any package below it."""
