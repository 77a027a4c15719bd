"""Service layer: configuration, storage, permissions and the operations the API exposes.

A package per domain (auth/, users/, hosts/, instances/, storage/, maintenance/, monitoring/,
portal/), the SQL in store/, secrets in security/, the records of what was done in audit/; the
modules every domain uses (errors, rules, permissions, locks, limits, addresses, config,
context, lookups, background, status_cursors) at the top. The floors they stand on:
tests/ci/test_import_layers.py (CONTROLLER_FLOORS) and docs/architecture.md.
"""
