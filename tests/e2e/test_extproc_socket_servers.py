"""Envoy reaches the real extproc over its Unix socket with either server behind it: h2 (the default,
extproc/h2_grpc.py) or grpc.aio (`extproc.unix_socket_server: grpcio`). Real SDKs with their default
headers (gzip asked for), a stream, a large body both ways, a refusal in the caller's protocol."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from bench.bench_gateway import _config
from tests.conftest import UPSTREAM_KEYS
from tests.stack_config import start_stack

pytestmark = pytest.mark.e2e
KEY = "sk-modelyard-demo"  # the bench tenant's key (bench/bench_gateway.py)


@pytest.mark.parametrize("server", ["h2", "grpcio"])
def test_calls_through_envoy_over_each_socket_server(tmp_path: Path, server: str) -> None:
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    sock = str(Path(tempfile.mkdtemp(prefix="srv-", dir="/tmp")) / "x.sock")  # short: a socket path's limit
    data = _config()
    data["extproc"].update(unix_socket=sock, unix_socket_server=server)
    data["models"][0]["capabilities"] = {"context_window": 4_000_000}  # room for the large body below
    with start_stack(tmp_path, data) as stack:
        oai = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=KEY)
        chat = oai.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "over the socket"}])
        assert chat.choices[0].message.content == "[demo-openai] echo: over the socket"
        chunks = list(oai.chat.completions.create(model="demo-gpt", stream=True,
                                                  messages=[{"role": "user", "content": "streamed"}]))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "[demo-openai] echo: streamed"
        msg = anthropic.Anthropic(base_url=stack.url, api_key=KEY).messages.create(
            model="demo-gpt", max_tokens=16, messages=[{"role": "user", "content": "translated"}])
        assert msg.content[0].text == "[demo-openai] echo: translated"
        big = "large body " * 600_000  # 6.6 MB each way: many frames, window updates on both sides of the socket
        echoed = oai.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": big}])
        assert echoed.choices[0].message.content == f"[demo-openai] echo: {big}"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{stack.url}/v1", api_key="sk-wrong").models.list()
        clusters = httpx.get(f"{stack.admin_url()}/clusters", timeout=5).text
        log = (stack.log_dir / "extproc.log").read_text()
    assert f"modelyard-extproc::{sock}::rq_total::" in clusters
    assert int(clusters.split(f"modelyard-extproc::{sock}::rq_total::")[1].split()[0]) >= 4
    assert f"unix:{sock} ({server})" in log
    assert "Traceback" not in log
