"""Inside a deployment: which replica (endpoint) serves a request.

Pure parts: `readings` (the model servers' Prometheus text -> `ReplicaReading`), `prefix` (which
replica a prompt's first blocks were last sent to), `picker` (the score). The one shell is
`board` (the background pollers and the gateway's own in-flight count per replica). docs/routing.md.
"""
