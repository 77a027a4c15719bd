"""Who did what: the audit trail (trail.py), each instance's history (history.py) and the request
id that ties them to the log lines (request_ids.py). Imports the kernel and store/ only: context
builds on it."""
