"""`modelyard keys` as an operator runs it: a subprocess on a config file and its default store."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from keys.secret import digest_of
from tests.stack_config import ROOT


@pytest.fixture(scope="module")
def config_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("keys-cli")
    path = d / "modelyard.yaml"
    path.write_text((ROOT / "modelyard.yaml").read_text())
    return path


def keys(config_file: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "modelyard.cli", "keys", *args, "--config", str(config_file)],
                          capture_output=True, text=True, timeout=60, env=env, cwd="/")


def test_create_list_rotate_revoke(config_file: Path) -> None:
    out = keys(config_file, "create", "--tenant", "demo-l2", "--models", "demo-gpt,demo-mini", "--budget-usd", "12.5",
               "--budget-period", "week", "--expires", "30d", "--name", "ci bot", "--json")
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    assert set(created) == {"id", "key"} and created["key"].startswith("my-")
    # The default store sits in the run dir beside the config file, and holds the digest only.
    db = config_file.parent / "run" / "keys.db"
    rows = sqlite3.connect(db).execute("SELECT id, tenant, digest, name FROM keys").fetchall()
    assert rows == [(created["id"], "demo-l2", digest_of(created["key"]), "ci bot")]
    assert created["key"].encode() not in b"".join(p.read_bytes() for p in db.parent.glob("keys.db*"))

    listed = json.loads(keys(config_file, "list", "--json").stdout)
    [view] = [k for k in listed if k["id"] == created["id"]]
    assert view["status"] == "active" and view["models"] == ["demo-gpt", "demo-mini"]
    assert view["budget_usd"] == 12.5 and view["budget_period"] == "week" and view["expires_at"].endswith("Z")
    assert view["hash_prefix"] == digest_of(created["key"])[:12]
    assert "key" not in view and created["key"] not in json.dumps(listed)
    table = keys(config_file, "list")
    assert table.returncode == 0 and created["id"] in table.stdout and "12.5/week" in table.stdout

    plain = keys(config_file, "rotate", created["id"])
    assert plain.returncode == 0 and "not shown again" in plain.stderr
    new_key = plain.stdout.split("key:")[1].strip()
    assert new_key.startswith("my-") and new_key != created["key"]
    assert sqlite3.connect(db).execute("SELECT digest FROM keys WHERE id = ?", (created["id"],)).fetchone() == (
        digest_of(new_key),)

    updated = keys(config_file, "update", created["id"], "--models", "demo-mini", "--budget-usd", "2", "--json")
    assert updated.returncode == 0, updated.stderr
    assert json.loads(updated.stdout)["models"] == ["demo-mini"] and json.loads(updated.stdout)["budget_usd"] == 2
    wider = keys(config_file, "update", created["id"], "--models", "demo-gpt")
    assert wider.returncode == 2 and "only narrows" in wider.stderr

    revoked = keys(config_file, "revoke", created["id"], "--json")
    assert revoked.returncode == 0 and json.loads(revoked.stdout)["status"] == "revoked"
    again = keys(config_file, "rotate", created["id"])
    assert again.returncode == 1 and "is revoked" in again.stderr and "Traceback" not in again.stderr


def test_create_with_its_own_rate_limits(config_file: Path) -> None:
    out = keys(config_file, "create", "--tenant", "demo", "--rpm", "3", "--tpm", "20000", "--json")
    assert out.returncode == 0, out.stderr
    created = json.loads(out.stdout)
    [view] = [k for k in json.loads(keys(config_file, "list", "--json").stdout) if k["id"] == created["id"]]
    assert (view["rpm"], view["tpm"]) == (3, 20000)
    [row] = [line for line in keys(config_file, "list").stdout.splitlines() if created["id"] in line]
    assert "3rpm 20000tpm" in row


@pytest.mark.parametrize("args,code,message", [
    (("create", "--tenant", "nobody"), 2, "tenant: unknown tenant 'nobody'"),
    (("create", "--tenant", "demo", "--budget-usd", "-3"), 2, "budget_usd: must be a finite amount of 0 or more"),
    (("create", "--tenant", "demo", "--expires", "2027-13-45"), 2, "expires: '2027-13-45' is neither"),
    (("create", "--tenant", "demo", "--rpm", "0"), 2, "rpm: must be from 1 to 4500000 per minute, got 0"),
    (("create", "--tenant", "demo", "--tpm", "ten"), 2, "tpm: expected a whole number per minute, got 'ten'"),
    (("revoke", "key_0000000000000000"), 1, "no key with id 'key_0000000000000000'"),
], ids=["unknown-tenant", "negative-budget", "bad-expiry", "zero-rpm", "tpm-not-a-number", "revoke-unknown-id"])  # every other field's refusal: tests/keys/test_store.py::test_spec_checks_every_field
def test_bad_input_is_one_clear_line(config_file: Path, args: tuple[str, ...], code: int, message: str) -> None:
    out = keys(config_file, *args)
    assert out.returncode == code, (out.stdout, out.stderr)
    assert message in out.stderr and "Traceback" not in out.stderr
    assert out.stdout == ""


def test_an_unreachable_store_is_exit_1(tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["keys"] = {"store": "postgresql://nobody:s3cret@127.0.0.1:1/keys"}
    path = tmp_path / "modelyard.yaml"
    path.write_text(yaml.safe_dump(data))
    out = keys(path, "list")
    assert out.returncode == 1 and "key store" in out.stderr
    assert "s3cret" not in out.stderr and "Traceback" not in out.stderr
