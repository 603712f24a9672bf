"""Virtual keys through a real Envoy, two extproc workers and the SDKs: `modelyard keys` and the
admin API write the store (SQLite beside the run files); every worker serves a created key at its
first call (a key new to a worker is looked up in the store, within bounds a flood of invalid keys
cannot pass) and refuses a revoked one within 2 s; a key's model list reads like the unknown model's 404."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
import tritonclient.grpc as triton_grpc

from keys.secret import digest_of
from modelyard.cli import main as cli_main
from tests.stack_config import demo_config_free_ports, free_ports_run, small_config, start_stack

pytestmark = pytest.mark.e2e
ADMIN_KEY = "adm-e2e-admin-key"
CREATED_WITHIN_S = 1.0
REVOKED_WITHIN_S = 2.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    workdir = tmp_path_factory.mktemp("keys-stack")
    data = small_config()
    twin = copy.deepcopy(data["models"][0])  # a second model on the same upstream: the one a key leaves out
    twin["name"], twin["groups"] = "demo-gpt-b", []
    data["models"].append(twin)
    grpc_port, metrics_port = free_ports_run(2), free_ports_run(2)
    data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                           workers=2, audit_db="audit.sqlite", tasks=None, batches=None)
    data["keys"] = {"admin_keys": [digest_of(ADMIN_KEY)]}  # the store: its default, run/keys.db
    with start_stack(workdir, data) as s:
        s.test_metrics = [f"127.0.0.1:{metrics_port + i}" for i in range(2)]  # worker i's
        s.test_config = workdir / "modelyard.yaml"
        s.test_audit = workdir / "audit.sqlite"
        s.test_metering = workdir / "metering.sqlite"
        yield s


def _cli(stack: Any, *args: str) -> Any:
    """`modelyard keys ...` in this process (tests/keys/test_cli.py runs it as a subprocess): the
    stack's processes see another writer on their store either way, and the clock starts at its commit."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli_main(["keys", *args, "--json", "--config", str(stack.test_config)])
    assert code == 0, out.getvalue()
    return json.loads(out.getvalue())


def _oai(stack: Any, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key=key, max_retries=0, timeout=20)


def _ant(stack: Any, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.url, api_key=key, max_retries=0, timeout=20)


def _chat(stack: Any, key: str, model: str = "demo-gpt") -> str:
    reply = _oai(stack, key).chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}])
    return reply.choices[0].message.content or ""


def _until(ok: Callable[[], bool], within: float) -> float:
    """Seconds until `ok()` first held, each try started within `within` (bounded: then it fails)."""
    start = time.monotonic()
    while True:
        tried_at = time.monotonic() - start
        if ok():
            return tried_at
        assert tried_at < within, f"not within {within} s"
        time.sleep(0.05)


def _works(stack: Any, key: str) -> Callable[[], bool]:
    def ok() -> bool:
        try:
            return bool(_chat(stack, key))
        except openai.AuthenticationError:
            return False
    return ok


def _refused(stack: Any, key: str) -> Callable[[], bool]:
    def ok() -> bool:
        try:
            _chat(stack, key)
        except openai.AuthenticationError:
            return True
        return False
    return ok


def test_a_created_key_serves_on_every_worker_within_1s(stack: Any) -> None:
    created = _cli(stack, "create", "--tenant", "demo", "--name", "e2e")
    # Envoy spreads streams over both workers round robin: four answers in a row are both workers'.
    works = _works(stack, created["key"])
    waited = _until(lambda: all(works() for _ in range(4)), CREATED_WITHIN_S)
    reply = _ant(stack, created["key"]).messages.create(model="demo-gpt", max_tokens=20,
                                                        messages=[{"role": "user", "content": "hi"}])
    assert reply.content[0].type == "text"
    print(f"created key served after {waited:.2f} s")


def test_a_keys_model_list_narrows_it_like_an_unknown_model(stack: Any) -> None:
    created = _cli(stack, "create", "--tenant", "demo", "--models", "demo-gpt")
    _until(_works(stack, created["key"]), CREATED_WITHIN_S)
    client = _oai(stack, created["key"])
    with pytest.raises(openai.NotFoundError) as left_out:
        client.chat.completions.create(model="demo-gpt-b", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    assert left_out.value.code == unknown.value.code == "model_not_found"
    assert left_out.value.response.text.replace("demo-gpt-b", "X") == unknown.value.response.text.replace(
        "no-such-model", "X")
    assert [m.id for m in client.models.list()] == ["demo-gpt"]
    with pytest.raises(anthropic.NotFoundError) as ant_left_out:
        _ant(stack, created["key"]).messages.create(model="demo-gpt-b", max_tokens=20,
                                                    messages=[{"role": "user", "content": "hi"}])
    assert ant_left_out.value.status_code == 404
    # The tenant's own key still reaches the model the store key leaves out.
    assert _chat(stack, "sk-modelyard-demo", model="demo-gpt-b")


def test_rotate_then_revoke(stack: Any) -> None:
    created = _cli(stack, "create", "--tenant", "demo")
    _until(_works(stack, created["key"]), CREATED_WITHIN_S)
    rotated = _cli(stack, "rotate", created["id"])
    assert rotated["id"] == created["id"] and rotated["key"] != created["key"]
    _until(_works(stack, rotated["key"]), CREATED_WITHIN_S)
    _until(_refused(stack, created["key"]), REVOKED_WITHIN_S)
    assert _cli(stack, "revoke", created["id"])["status"] == "revoked"
    refused = _refused(stack, rotated["key"])
    # Four refusals in a row: both workers (round robin) refuse it.
    waited = _until(lambda: all(refused() for _ in range(4)), REVOKED_WITHIN_S)
    with pytest.raises(anthropic.AuthenticationError) as ant:
        _ant(stack, rotated["key"]).messages.create(model="demo-gpt", max_tokens=20,
                                                    messages=[{"role": "user", "content": "hi"}])
    assert ant.value.body["type"] == "error"  # type: ignore[index]
    print(f"revoked key refused after {waited:.2f} s")


def test_an_expired_key_gets_401(stack: Any) -> None:
    created = _cli(stack, "create", "--tenant", "demo", "--expires", "3s")
    t0 = time.monotonic()
    _until(_works(stack, created["key"]), CREATED_WITHIN_S)
    time.sleep(max(0.0, 3.0 - (time.monotonic() - t0)))
    _until(_refused(stack, created["key"]), REVOKED_WITHIN_S)
    with pytest.raises(openai.AuthenticationError) as e:
        _chat(stack, created["key"])
    assert "expired" in e.value.message
    [view] = [k for k in _cli(stack, "list") if k["id"] == created["id"]]
    assert view["status"] == "expired"


def test_the_admin_api_needs_an_admin_key_and_is_audited(stack: Any) -> None:
    url = f"{stack.url}/admin/v1/keys"
    for headers in ({}, {"authorization": "Bearer sk-modelyard-demo"}):
        r = httpx.get(url, headers=headers, timeout=20)
        assert r.status_code == 401 and r.json()["error"]["message"] == "invalid or missing admin key"
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    r = httpx.post(url, headers=admin, json={"tenant": "nobody"}, timeout=20)
    assert r.status_code == 400 and "unknown tenant 'nobody'" in r.json()["error"]["message"]
    r = httpx.post(url, headers=admin, json={"tenant": "demo", "models": ["demo-gpt"], "budget_usd": 1.5,
                                             "budget_period": "day"}, timeout=20)
    assert r.status_code == 201, r.text
    created = r.json()
    # Served within 1 s everywhere (at once by the worker that wrote it).
    _until(_works(stack, created["key"]), CREATED_WITHIN_S)
    listed = httpx.get(url, headers=admin, timeout=20).json()["data"]
    assert created["id"] in [k["id"] for k in listed] and created["key"] not in json.dumps(listed)
    r = httpx.post(f"{url}/{created['id']}/revoke", headers=admin, timeout=20)
    assert r.status_code == 200 and r.json()["status"] == "revoked"
    _until(_refused(stack, created["key"]), REVOKED_WITHIN_S)

    def rows() -> list[dict[str, Any]]:
        conn = sqlite3.connect(stack.test_audit)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(x) for x in conn.execute("SELECT * FROM audit WHERE event = 'key_admin' ORDER BY id")]
        finally:
            conn.close()

    _until(lambda: len(rows()) >= 6, 5.0)  # the audit writer commits in its thread
    got = [(json.loads(x["detail"])["op"], x["status"], x["key_id"]) for x in rows()]
    admin_id = digest_of(ADMIN_KEY)[:12]
    # Two workers' audit writers commit in their own batches: the rows' order across workers is not the calls'.
    assert sorted(got) == sorted([("auth", 401, ""), ("auth", 401, digest_of("sk-modelyard-demo")[:12]), ("create", 400, admin_id),
                   ("create", 201, admin_id), ("list", 200, admin_id), ("revoke", 200, admin_id)])
    [made] = [x for x in rows() if json.loads(x["detail"])["op"] == "create" and x["status"] == 201]
    assert json.loads(made["detail"])["key"] == created["id"]
    everything = b"".join(p.read_bytes() for p in Path(stack.test_audit).parent.glob("audit.sqlite*"))
    assert created["key"].encode() not in everything


def test_a_keys_own_budget_refuses_it_alone_and_the_spend_report_matches_metering(stack: Any) -> None:
    """A store key with a day budget: once its metered cost passes it, that key gets OpenAI's
    `insufficient_quota` 429 on every worker; the tenant's other key is untouched (the tenant has no
    budget); `modelyard spend --by key` equals the key's metering rows."""
    created = _cli(stack, "create", "--tenant", "demo", "--budget-usd", "0.1", "--budget-period", "day")
    _until(_works(stack, created["key"]), CREATED_WITHIN_S)
    refused = None
    for _ in range(16):  # about $0.045 a call at demo-gpt's prices: the budget goes in three calls
        try:
            _chat(stack, created["key"])
        except openai.AuthenticationError:  # the other worker's copy of the store is up to 1 s behind
            time.sleep(0.2)
            continue
        except openai.RateLimitError as e:
            refused = e
            break
        time.sleep(0.6)  # a ledger round: the other worker has heard of the spend
    assert refused is not None, "the key's budget never refused it"
    assert refused.status_code == 429 and refused.code == "insufficient_quota"
    assert f"key '{created['id']}'" in refused.message
    assert 0 < int(refused.response.headers["retry-after"]) <= 86400
    for _ in range(4):  # both workers refuse it now
        with pytest.raises(openai.RateLimitError):
            _chat(stack, created["key"])
    assert _chat(stack, "sk-modelyard-demo")  # the tenant's own key has no budget

    def metered() -> tuple[int, float]:
        with sqlite3.connect(stack.test_metering) as conn:
            return conn.execute("SELECT COUNT(*), SUM(cost) FROM requests WHERE key_id = ?",
                                (created["id"],)).fetchone()

    settled = metered()  # the writer threads commit in batches: wait until the key's rows stop changing
    for _ in range(20):
        time.sleep(0.5)
        settled, before = metered(), settled
        if settled == before:
            break
    spent = subprocess.run([sys.executable, "-m", "modelyard.cli", "spend", "--by", "key", "--json", "--config",
                            str(stack.test_config)], capture_output=True, text=True, timeout=60, check=True)
    [row] = [r for r in json.loads(spent.stdout) if r["key_id"] == created["id"]]
    n, usd = metered()
    assert row["requests"] == n >= 2 and row["spend_usd"] == pytest.approx(usd, abs=1e-9) and usd >= 0.1
    # The same report over the admin API (admin key only; a bad `by` is a 400).
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    r = httpx.get(f"{stack.url}/admin/v1/spend", params={"by": "key", "since": "1d"}, headers=admin, timeout=20)
    assert r.status_code == 200, r.text
    assert [x for x in r.json()["data"] if x["key_id"] == created["id"]] == [row]
    assert httpx.get(f"{stack.url}/admin/v1/spend", params={"by": "nope"}, headers=admin, timeout=20).status_code == 400
    assert httpx.get(f"{stack.url}/admin/v1/spend", headers={"authorization": "Bearer sk-modelyard-demo"},
                     timeout=20).status_code == 401


def _decisions(metrics_address: str) -> float:
    """The rate-limit decisions one worker made (a call with no bucket to charge makes none)."""
    text = httpx.get(f"http://{metrics_address}/metrics", timeout=5).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("modelyard_ratelimit_decisions_total{"))


def test_a_keys_own_rpm_is_one_limit_across_workers_and_spares_its_tenant(stack: Any) -> None:
    """`keys create --rpm 3`: three quick calls answer, the next ones get OpenAI's 429 with retry-after
    from whichever worker takes them (one bucket for the host: 3, not 3 per worker), each refusal a
    `decisions` row limited by the key's bucket; another key of the tenant still answers."""
    limited = _cli(stack, "create", "--tenant", "demo", "--rpm", "3")
    other = _cli(stack, "create", "--tenant", "demo")  # written after: a worker that knows it knows both
    works = _works(stack, other["key"])
    # Four answers in a row: both workers (round robin) have read the store past the limited key.
    _until(lambda: all(works() for _ in range(4)), CREATED_WITHIN_S)
    before = [_decisions(m) for m in stack.test_metrics]
    client = _oai(stack, limited["key"])
    answered, refused = [], []
    for _ in range(6):  # well inside the 20 s one request takes to come back at 3 a minute
        try:
            raw = client.chat.completions.with_raw_response.create(
                model="demo-gpt", messages=[{"role": "user", "content": "hi"}])
            answered.append(raw.headers)
        except openai.RateLimitError as e:
            refused.append(e)
    decided = [_decisions(m) - b for m, b in zip(stack.test_metrics, before)]
    assert len(answered) == 3 and len(refused) == 3
    # Only this key's calls have a bucket here: both workers decided some of them, on one bucket.
    assert sum(decided) == 6 and min(decided) >= 1, decided
    assert [h["x-ratelimit-remaining-requests"] for h in answered] == ["2", "1", "0"]
    assert all(h["x-ratelimit-limit-requests"] == "3" for h in answered)
    for e in refused:
        assert e.status_code == 429 and e.code == "rate_limit_exceeded"
        assert f"key:{limited['id']}:requests" in e.message
        assert 1 <= int(e.response.headers["retry-after"]) <= 20
    assert _chat(stack, other["key"]) and _chat(stack, "sk-modelyard-demo")

    def rows() -> list[tuple[int, str]]:
        with sqlite3.connect(stack.test_metering) as conn:
            return conn.execute("SELECT allowed, limited_by FROM decisions WHERE key_id = ? ORDER BY ts",
                                (limited["id"],)).fetchall()

    _until(lambda: len(rows()) >= 6, 5.0)  # the metering writers commit in their threads
    assert sorted(rows()) == [(0, f"key:{limited['id']}:requests")] * 3 + [(1, "")] * 3


# -- the miss path: a key the workers' copies do not know yet is looked up in the store ---------------


def _cli_subprocess(config: Path, *args: str) -> Any:
    """`modelyard keys ...` as a script runs it: its own process, returning once the row is committed."""
    done = subprocess.run([sys.executable, "-m", "modelyard.cli", "keys", *args, "--json", "--config", str(config)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _lookups(metrics_addresses: list[str]) -> dict[str, float]:
    """Store lookups of unknown keys (by result) and refusals without one (by reason), summed over workers."""
    out: dict[str, float] = {}
    for address in metrics_addresses:
        for line in httpx.get(f"http://{address}/metrics", timeout=5).text.splitlines():
            if line.startswith(("modelyard_key_store_lookups_total{", "modelyard_key_store_lookups_skipped_total{")):
                name, value = line.rsplit(" ", 1)
                out[name] = out.get(name, 0.0) + float(value)
    return out


@pytest.fixture(scope="module")
def unrefreshed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Two workers that read the store at start only (`refresh_s`: an hour): a key created after
    that serves only through the miss path, so an immediate 200 proves it (and a 401 its absence)."""
    workdir = tmp_path_factory.mktemp("keys-unrefreshed")
    data = small_config()
    shipped, _ = demo_config_free_ports()  # and the KServe demo model, for gRPC callers
    data["models"] += [m for m in shipped["models"] if m["name"] == "demo-colors"]
    grpc_port, metrics_port = free_ports_run(2), free_ports_run(2)
    data["extproc"].update(address=f"127.0.0.1:{grpc_port}", metrics_address=f"127.0.0.1:{metrics_port}",
                           workers=2, audit_db=None, tasks=None, batches=None)
    data["keys"] = {"admin_keys": [digest_of(ADMIN_KEY)], "refresh_s": 3600}
    with start_stack(workdir, data) as s:
        s.test_metrics = [f"127.0.0.1:{metrics_port + i}" for i in range(2)]
        s.test_config = workdir / "modelyard.yaml"
        yield s


def test_a_key_answers_at_once_when_keys_create_returns(unrefreshed: Any) -> None:
    created = _cli_subprocess(unrefreshed.test_config, "create", "--tenant", "demo", "--name", "script")
    # At once, four in a row: both workers (round robin), neither of which has refreshed since.
    assert [_chat(unrefreshed, created["key"]) != "" for _ in range(4)] == [True] * 4
    reply = _ant(unrefreshed, created["key"]).messages.create(model="demo-gpt", max_tokens=20,
                                                              messages=[{"role": "user", "content": "hi"}])
    assert reply.content[0].type == "text"
    # One lookup per worker; every later call is the copy's.
    assert _lookups(unrefreshed.test_metrics)['modelyard_key_store_lookups_total{result="found"}'] >= 2


def test_a_new_key_reaches_kserve_grpc_answers_at_once(unrefreshed: Any) -> None:
    # ModelReady and ModelMetadata are the extproc's own answers to gRPC callers, off the ext_proc path.
    created = _cli_subprocess(unrefreshed.test_config, "create", "--tenant", "demo")
    client = triton_grpc.InferenceServerClient(unrefreshed.url.removeprefix("http://"))
    auth = {"authorization": f"Bearer {created['key']}"}
    for _ in range(4):  # both workers
        assert client.is_model_ready("demo-colors", headers=auth)
        assert client.get_model_metadata("demo-colors", headers=auth).name == "demo-colors"


def test_a_key_the_admin_api_creates_answers_at_once_on_the_other_worker(unrefreshed: Any) -> None:
    r = httpx.post(f"{unrefreshed.url}/admin/v1/keys", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                   json={"tenant": "demo", "models": ["demo-gpt"]}, timeout=20)
    assert r.status_code == 201, r.text
    key = r.json()["key"]
    for _ in range(4):  # with httpx's default headers (Accept-Encoding: gzip and all)
        answer = httpx.post(f"{unrefreshed.url}/v1/chat/completions", headers={"authorization": f"Bearer {key}"},
                            json={"model": "demo-gpt", "messages": [{"role": "user", "content": "hi"}]}, timeout=20)
        assert answer.status_code == 200, answer.text


def test_a_key_used_at_once_then_revoked_is_refused_within_the_bound_and_stays_refused(stack: Any) -> None:
    created = _cli_subprocess(stack.test_config, "create", "--tenant", "demo")
    assert all(_chat(stack, created["key"]) for _ in range(4))  # both workers, at once
    _cli_subprocess(stack.test_config, "revoke", created["id"])
    refused = _refused(stack, created["key"])
    _until(lambda: all(refused() for _ in range(4)), REVOKED_WITHIN_S)
    # The miss path asks the store again and reads the revocation: never a second life.
    assert all(refused() for _ in range(8))


@pytest.fixture
def flood_stack(tmp_path: Path) -> Iterator[Any]:
    """One worker with a lookup budget of 5 that practically never refills (0.001 a second)."""
    data = small_config()
    data["extproc"].update(metrics_address=f"127.0.0.1:{free_ports_run(1)}", audit_db=None, tasks=None, batches=None)
    data["keys"] = {"admin_keys": [digest_of(ADMIN_KEY)], "lookup_burst": 5, "lookups_per_s": 0.001}
    with start_stack(tmp_path, data) as s:
        s.test_metrics = [data["extproc"]["metrics_address"]]
        yield s


def test_a_flood_of_invalid_keys_costs_the_store_a_bounded_number_of_lookups(flood_stack: Any) -> None:
    r = httpx.post(f"{flood_stack.url}/admin/v1/keys", headers={"authorization": f"Bearer {ADMIN_KEY}"},
                   json={"tenant": "demo"}, timeout=20)
    assert r.status_code == 201, r.text
    known = r.json()["key"]  # in the worker's copy (its admin API wrote it): no lookup, ever
    for _ in range(20):  # one invalid key again and again: one lookup, then the negative cache
        with pytest.raises(openai.AuthenticationError):
            _chat(flood_stack, "my-not-a-key-at-all")
    statuses = []
    for i in range(40):  # forty different invalid keys: four more lookups, then the budget is spent
        try:
            _chat(flood_stack, f"my-invalid-{i}")
        except openai.AuthenticationError as e:
            statuses.append(e.status_code)
        except openai.InternalServerError as e:
            assert e.status_code == 503 and e.response.headers["retry-after"] == "1"
            assert "cannot check this API key" in e.message
            statuses.append(e.status_code)
    assert statuses == [401] * 4 + [503] * 36
    counts = _lookups(flood_stack.test_metrics)
    assert counts['modelyard_key_store_lookups_total{result="absent"}'] == 5
    assert counts.get('modelyard_key_store_lookups_total{result="found"}', 0) == 0
    assert counts['modelyard_key_store_lookups_skipped_total{reason="absent"}'] == 19
    assert counts['modelyard_key_store_lookups_skipped_total{reason="limited"}'] == 36
    # Keys the worker knows are untouched by the spent budget: the store key and the config-file key.
    assert _chat(flood_stack, known) and _chat(flood_stack, "sk-modelyard-demo")
