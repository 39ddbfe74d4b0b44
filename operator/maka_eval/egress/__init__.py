"""Egress: the contamination blocklist, the metering proxy's addons, the provider-usage
checkpoint, per-cell network namespaces and the cluster's egress gateway."""
