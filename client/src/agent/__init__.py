"""The `cloud` command alone (the cloud-controller-client distribution): `agent.cloud` and the
`agent.entry` it runs through; the admin's `cloud-agent` is not part of it."""
