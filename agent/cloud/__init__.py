"""`cloud`: the cluster user's command, a thin layer over common.client (docs/client.md)."""
