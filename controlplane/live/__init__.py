"""Live configuration: the control plane that serves Envoy over ADS and the extprocs over the
long-poll of contracts/live_config.py, and applies a new config to both without a restart
(docs/live-config.md)."""
