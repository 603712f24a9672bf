"""The response cache (docs/cache.md): an identical request answered from a stored answer at the
request-body step, no upstream call. Pure parts: key.py (what makes two requests the same),
policy.py (may this call read or write the cache), entry.py (the stored form), replay.py (a
stored answer as stream events, and a stream assembled into an answer), semantic_key.py and
vector_index.py (the semantic lookup's partition and text; the NumPy index). Shells: lookup.py (the
interface a store implements), sqlite_store.py, redis_store.py, embedder.py (the prompt embedded by
the gateway's own embedding deployment), semantic.py (the process's index, rebuilt and refreshed
from the store), part.py (the Gateway's part: timeouts, metrics)."""
