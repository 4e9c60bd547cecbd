"""Deploy a measured run: a systemd unit (with preflight and wait-ready), a Compose service, or a Kubernetes
Deployment + Service, all from the exact command line and environment that produced the result."""
