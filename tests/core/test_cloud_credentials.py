"""Cloud credentials: resolved in a worker thread, never on the event loop; replaced in the background
before they expire; rotated files take effect; a failure is a 502 that names no secret. The AWS
chain is botocore's own and the Google token comes from google-auth against the demo token endpoint."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from contracts.config import parse_config
from contracts.config.clouds import BedrockSettings, VertexSettings
from contracts.errors import UpstreamError
from extproc.cloud_credentials import TokenCache, aws_credentials, google_token, upstream_auth


class Fetches:
    """A fetch that records where it ran and can be held until released."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self.threads: list[int] = []
        self.gate = threading.Event()
        self.gate.set()
        self.fail = False

    def __call__(self) -> tuple[str, float]:
        self.threads.append(threading.get_ident())
        self.gate.wait(5)
        if self.fail:
            raise RuntimeError("metadata server unreachable")
        return f"token-{len(self.threads)}", time.time() + self.ttl


async def test_first_fetch_runs_off_the_loop_and_is_single_flight() -> None:
    f = Fetches(3600)
    cache = TokenCache("c", f, margin_s=300)
    got = await asyncio.gather(*(cache.current() for _ in range(20)))
    assert set(got) == {"token-1"} and len(f.threads) == 1
    assert f.threads[0] != threading.get_ident()  # a worker thread, not the loop's
    assert await cache.current() == "token-1" and len(f.threads) == 1  # fresh: no refetch


async def test_a_value_near_its_end_is_replaced_in_the_background() -> None:
    f = Fetches(10)  # expires inside the 300 s margin at once
    cache = TokenCache("c", f, margin_s=300)
    assert await cache.current() == "token-1"
    f.gate.clear()  # the next refresh hangs until released
    t0 = time.monotonic()
    assert await cache.current() == "token-1"  # answered from the current value, not waiting
    assert time.monotonic() - t0 < 1.0
    f.gate.set()
    for _ in range(100):
        if await cache.current() == "token-2":
            break
        await asyncio.sleep(0.01)
    assert await cache.current() in ("token-2", "token-3")


async def test_a_failed_background_refresh_keeps_the_current_value() -> None:
    f = Fetches(10)
    cache = TokenCache("c", f, margin_s=300)
    assert await cache.current() == "token-1"
    f.fail = True
    assert await cache.current() == "token-1"  # still valid: served while the refresh fails behind it
    for _ in range(100):
        if len(f.threads) >= 2 and cache._refresh is not None and cache._refresh.done():
            break
        await asyncio.sleep(0.01)
    assert await cache.current() == "token-1"
    f.fail = False
    await asyncio.sleep(0.05)
    assert await cache.current() in ("token-1", "token-3")


async def test_failure_is_a_502_without_the_secret_and_retried() -> None:
    f = Fetches(3600)
    f.fail = True
    cache = TokenCache("demo-vertex", f, margin_s=300)
    with pytest.raises(UpstreamError) as e:
        await cache.current()
    assert e.value.status == 502 and e.value.message == "no credentials for upstream demo-vertex"
    f.fail = False
    assert await cache.current() == "token-2"


def _write_profile(path: Path, key: str, secret: str) -> None:
    path.write_text(f"[team]\naws_access_key_id = {key}\naws_secret_access_key = {secret}\n")


def test_aws_chain_reads_the_profile_and_sees_a_rotated_file(tmp_path: Path) -> None:
    creds = tmp_path / "credentials"
    _write_profile(creds, "AKIAFIRST", "secret-1")
    fetch = aws_credentials(BedrockSettings(region="us-east-1", profile="team", credentials_file=str(creds)))
    first, expires = fetch()
    assert (first.access_key, first.secret_key, first.session_token) == ("AKIAFIRST", "secret-1", None)
    assert expires > time.time()
    _write_profile(creds, "AKIASECOND", "secret-2")
    assert fetch()[0].access_key == "AKIASECOND"  # static keys are re-resolved at every refresh


def test_aws_chain_without_credentials_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    fetch = aws_credentials(BedrockSettings(region="us-east-1", credentials_file=str(tmp_path / "missing")))
    with pytest.raises(Exception):  # noqa: B017  botocore raises one of several of its own errors here
        fetch()


async def test_google_token_from_a_service_account_against_the_demo_token_endpoint(tmp_path: Path) -> None:
    import httpx

    from devstack.demo.vertex_server import ServiceAccount, make_app
    from tests.stack_config import free_port

    port = free_port()
    sa = tmp_path / "sa.json"
    server = TestServer(make_app(ServiceAccount(str(sa), f"http://127.0.0.1:{port}/token", "p"), project="p",
                                 location="l"), port=port)
    await server.start_server()
    try:
        settings = VertexSettings(project="p", location="l", credentials_file=str(sa))
        token, expires = await asyncio.to_thread(google_token(settings))
        assert token.startswith("ya29.demo-") and expires > time.time() + 3000
        url = f"http://127.0.0.1:{port}/v1/projects/p/locations/l/publishers/google/models/g:generateContent"
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with httpx.AsyncClient() as c:
            ok = await c.post(url, headers={"authorization": f"Bearer {token}"}, json=body)
            forged = await c.post(url, headers={"authorization": "Bearer ya29.forged"}, json=body)
            other = await c.post(url.replace("/p/", "/q/"), headers={"authorization": f"Bearer {token}"}, json=body)
        assert ok.status_code == 200 and b"[demo-vertex] echo: hi" in ok.content
        assert forged.status_code == 401 and other.status_code == 403
    finally:
        await server.close()


def _dep(protocol: str, **extra: object) -> dict:
    return {"cluster": "c", "protocol": protocol, "endpoints": ["127.0.0.1:1"], **extra}


def _config(dep: dict) -> dict:
    return {"models": [{"name": "m", "deployments": [dep]}], "tenants": [{"name": "t", "api_keys": ["sha256:" + "0" * 64]}]}


@pytest.mark.parametrize(("dep", "error"), [
    (_dep("bedrock"), "needs a `bedrock:` section"),
    (_dep("openai", azure={"api_version": "2024-10-21"}), "`azure:` is for protocol azure-openai"),
    (_dep("vertex", vertex={"project": "p", "location": "us-central1"}, warmup={}), "warmup: not available"),
    (_dep("azure-openai", azure={"api_version": "2024-10-21", "auth": "password"}), "auth"),
], ids=["bedrock-without-section", "azure-section-on-openai", "warmup-on-vertex", "azure-unknown-auth"])
def test_config_refuses_mismatched_cloud_sections(dep: dict, error: str) -> None:
    with pytest.raises(Exception) as e:
        parse_config(_config(dep))
    assert error in str(e.value)


async def test_upstream_auth_for_azure_reads_the_key_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = parse_config(_config(_dep("azure-openai", azure={"api_version": "2024-10-21"}, api_key_env="AZ_KEY_T")))
    dep = cfg.models[0].deployments[0]
    monkeypatch.setenv("AZ_KEY_T", "one")
    assert (await upstream_auth(dep)).credential == "one"
    monkeypatch.setenv("AZ_KEY_T", "two")  # rotated without a restart
    auth = await upstream_auth(dep)
    assert auth.credential == "two" and auth.cloud is not None and "two" not in repr(auth.cloud)
