"""What the service tells its monitoring: the health checks of /healthz and `cloud-agent check`
(health.py) and the Prometheus metrics (metrics.py). Imports the kernel, context, security/, hosts/."""
