"""Virtual keys as data: a store (SQLite embedded, PostgreSQL for replicas), the in-memory copy the
request path reads, and `modelyard keys`. The secret is shown once; only its sha256 is stored."""
