"""The client library alone (the cloud-controller-client distribution): `common.client`."""
