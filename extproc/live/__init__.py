"""Live config: one atomic reload of the whole gateway, and the control plane's feed that drives it."""
