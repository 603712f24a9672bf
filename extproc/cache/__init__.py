"""The response cache (docs/cache.md): an identical request answered from a stored answer at the
request-body step, no upstream call. Pure parts: key.py (what makes two requests the same),
policy.py (may this call read or write the cache), entry.py (the stored form), replay.py (a
stored answer as stream events, and a stream assembled into an answer). Shells: lookup.py (the
interface a store implements: the exact stores here, a semantic one beside them later),
sqlite_store.py, redis_store.py, part.py (the Gateway's part: timeouts, metrics)."""
