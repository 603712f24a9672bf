"""Endpoint-picker mode (`modelyard epp`): the replica picker served as a Gateway API Inference
Extension endpoint picker for one InferencePool. `decision` (pure: body, subset hint, shedding),
`stream` (one ext_proc stream, sans-I/O), `members` (pool membership: list, file, environment),
`server` (the grpc.aio shell). docs/routing.md "Endpoint-picker mode".
"""
