"""The ground floor: what the control plane, the extproc, the GPU agent and devstack agree on.

The config model (`contracts.config`), the names Envoy and the extproc share (`envoy_names`),
which deployments stand in for each other (`failover`), the GPU agent's watermark wire format
(`watermarks`) and the worker plan (`workers`). Everything may import this package; it imports
nothing of ours but `contracts.errors` (an import-linter contract in pyproject.toml says so).
"""
