"""Where a config's key store is: `keys.store`, else `keys.db` in the run directory.

The CLI and every extproc resolve it from the same config file, so they meet on one store
wherever each was started from."""

from __future__ import annotations

from pathlib import Path

from contracts.config import GatewayConfig
from keys.db import sqlite_path

DEFAULT_FILE = "keys.db"


def run_dir(config: GatewayConfig, config_file: Path) -> Path:
    """`devstack.run_dir` under the config file's directory (as `modelyard up` puts its run files)."""
    return (config_file.resolve().parent / config.devstack.run_dir).resolve()


def store_dsn(config: GatewayConfig, config_file: Path) -> str:
    """The DSN to open: PostgreSQL as written; SQLite with a relative path under the run dir."""
    store = config.keys.store
    if store is None:
        return f"sqlite:///{run_dir(config, config_file) / DEFAULT_FILE}"
    if store.startswith("sqlite:///"):
        path = sqlite_path(store)
        if path != ":memory:" and not Path(path).is_absolute():
            return f"sqlite:///{run_dir(config, config_file) / path}"
    return store
