"""`modelyard cache stats|purge` and the admin API's `/admin/v1/cache`: the store a config names,
opened outside the request path, and its stats as JSON."""

from __future__ import annotations

from pathlib import Path

from contracts.config import GatewayConfig
from extproc.cache.lookup import ResponseLookup, StoreStats


def open_store(config: GatewayConfig, base: Path | None = None) -> ResponseLookup:
    """The configured store; a relative SQLite path is taken from `base` (the config file's folder, as
    `modelyard up` runs it) when given."""
    rc = config.response_cache
    if rc.store == "redis":
        from extproc.cache.redis_store import RedisResponseStore
        return RedisResponseStore(rc.redis_url, rc.redis_prefix, rc.max_bytes)
    from extproc.cache.sqlite_store import SqliteResponseStore
    path = Path(rc.sqlite_path)
    return SqliteResponseStore(path if base is None or path.is_absolute() else base / path, rc.max_bytes)


def stats_view(s: StoreStats) -> dict[str, object]:
    return {"entries": s.entries, "bytes": s.bytes, "max_bytes": s.max_bytes,
            "by_model": dict(sorted(s.by_model.items())), "by_tenant": dict(sorted(s.by_tenant.items()))}
