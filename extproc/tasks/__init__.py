"""Async tasks: `Prefer: respond-async` answers 202 and a worker replays the request through Envoy.

`state` is the pure state machine (records, transitions, the public view), `marker` the replay
marker only this extproc can make, `store` and `redis_store` keep records durably, `worker`
replays them, `webhook` signs completion callbacks and `board` is the part the gateway holds.
"""
