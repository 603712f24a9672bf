"""The control plane: Envoy environments and the bootstrap rendered from the gateway config."""
