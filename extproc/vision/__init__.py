"""The vision path's shared parts: cross-caller image batches and the KServe upstream probe."""
