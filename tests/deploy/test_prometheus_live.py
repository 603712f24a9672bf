"""A real Prometheus (Debian's package) scrapes a running stack with deploy/prometheus/prometheus.yml
(its targets moved to the test's ports) and loads the shipped rules; after traffic of every kind the
dashboard and the alerts need, every dashboard query and every alert's signal returns data, and
two alerts are driven into firing condition (a saturated GPU, Redis gone)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import anthropic
import httpx
import openai
import pytest
import yaml

from contracts.config import hash_api_key
from controlplane.environments import EnvironmentConfig
from tests.conftest import DEMO_KEY
from tests.deploy.tools import tool
from tests.ratelimit.redis_server import RedisServer
from tests.stack_config import ROOT, demo_config_free_ports, free_port, start_stack
from tests.vision_stack import classify_form

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PROMETHEUS_DIR = ROOT / "deploy/prometheus"
DASHBOARD = ROOT / "deploy/grafana/dashboards/modelyard.json"
LIMITED = "sk-modelyard-demo-limited"
BROKE = "sk-modelyard-demo-broke"  # a tenant whose budget is $0: every call is refused
# Grafana's $__rate_interval: at a 1 s scrape, a minute holds every sample of the test's traffic.
WINDOW = "1m"
_ALERT = re.compile(r"^(?P<signal>.+?)\s*(?P<op>>|<|>=|<=|==|!=)\s*(?P<threshold>-?[0-9.]+)$", re.S)


def _stack_config(redis_url: str, workdir: Path) -> dict[str, Any]:
    """The demo config, trimmed to one chat model (standard + fast, each with a GPU agent) and the
    image model, on Redis buckets; budgets on the demo tenant (roomy) and a broke one."""
    data, _ = demo_config_free_ports()
    data["models"] = [m for m in data["models"]
                      if m["name"] in ("demo-gpt", "demo-colors", "demo-gpt-cached", "demo-learn")]
    data["response_cache"] = {"sqlite_path": str(workdir / "rcache.sqlite")}
    for m in data["models"]:
        for d in m["deployments"]:
            d.pop("api_key_env", None)
    # A concurrency limit on the standard deployment: the queue panels have series (waits of 0 s).
    data["models"][0]["deployments"][0]["max_inflight"] = 16
    data["ratelimit"]["backend"] = "redis"
    data["ratelimit"]["redis"] = {"url": redis_url, "replicas": 1, "failure_policy": "fallback", "timeout_ms": 50}
    data["tenants"][0]["budget"] = {"usd": 1000, "period": "month"}
    data["tenants"].append({"name": "demo-broke", "tier": "L3", "api_keys": [f"sha256:{hash_api_key(BROKE)}"],
                            "budget": {"usd": 0, "period": "day"}})
    data["keys"] = {"store": f"sqlite:///{workdir / 'keys.db'}"}
    return data


def _agents(data: dict[str, Any]) -> list[str]:
    return sorted({urlparse(d["watermark"]["url"]).netloc for m in data["models"] for d in m["deployments"]
                   if d.get("watermark")})


def _prometheus_config(workdir: Path, targets: dict[str, list[str]]) -> Path:
    """The shipped scrape config with the test's targets, a 1 s cadence and the shipped rules."""
    cfg = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    cfg["rule_files"] = [str(PROMETHEUS_DIR / f) for f in cfg["rule_files"]]
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == set(targets), "the test must scrape every job the shipped config scrapes"
    for name, job in jobs.items():
        job["static_configs"] = [{"targets": targets[name]}]
    path = workdir / "prometheus.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path


class Prometheus:
    def __init__(self, workdir: Path, config: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = workdir / "prometheus.log"
        self.argv = [tool("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{self.port}"]

    def __enter__(self) -> Prometheus:
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"prometheus not ready; see {self.log}")

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=15)

    def query(self, expr: str) -> list[dict[str, Any]]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", (expr, body)
        return body["data"]["result"]

    def finite(self, expr: str) -> list[dict[str, Any]]:
        """The series of `expr` whose value is a number (a quantile over no observations is NaN)."""
        return [s for s in self.query(expr) if math.isfinite(float(s["value"][1]))]

    def wait_targets_up(self, timeout: float) -> dict[tuple[str, str], str]:
        """(job, address) -> health ('up', or the scrape error), once all are up or at the timeout."""
        deadline = time.monotonic() + timeout
        while True:
            active = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
            health = {(t["labels"]["job"], t["labels"]["instance"]): t["health"] if t["health"] == "up"
                      else f"{t['health']}: {t['lastError']}" for t in active}
            if (health and set(health.values()) == {"up"}) or time.monotonic() > deadline:
                return health
            time.sleep(0.3)

    def wait_finite(self, exprs: list[str], timeout: float) -> dict[str, list[dict[str, Any]]]:
        """Poll until every expression has data; returns each one's last result (empty = none)."""
        deadline = time.monotonic() + timeout
        while True:
            results = {e: self.finite(e) for e in exprs}
            if all(results.values()) or time.monotonic() > deadline:
                return results
            time.sleep(0.5)


def _dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"].replace("$__rate_interval", WINDOW)))
    return out


def _rules() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    groups = yaml.safe_load((PROMETHEUS_DIR / "modelyard.rules.yml").read_text())["groups"]
    rules = [r for g in groups for r in g["rules"]]
    return [r for r in rules if "record" in r], [r for r in rules if "alert" in r]


def _drive_traffic(url: str) -> None:
    """Every kind of request some panel or alert signal needs to see."""
    oa = openai.OpenAI(base_url=f"{url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=20)
    for i in range(4):
        r = oa.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": f"count {i}"}])
        assert r.usage is not None and r.usage.completion_tokens > 0
    # Prompt-cache reads and writes of the prompt before the last message (the demo upstream reports
    # them on these words; a chat caller has a field for the reads only).
    for cue in ("cache-hit", "cache-write"):
        r = oa.chat.completions.create(model="demo-gpt", messages=[{"role": "system", "content": "a long prefix"},
                                                                   {"role": "user", "content": cue}])
        assert r.usage is not None and (cue != "cache-hit" or r.usage.prompt_tokens_details is not None)
    for _ in range(2):  # time to first token
        chunks = list(oa.chat.completions.create(model="demo-gpt", stream=True,
                                                 messages=[{"role": "user", "content": "stream me"}]))
        assert chunks
    # The response cache (docs/cache.md): the same call twice on the cached model, a miss then hits
    # (the second drive finds the first one's entry).
    for _ in range(2):
        oa.chat.completions.create(model="demo-gpt-cached", messages=[{"role": "user", "content": "cache this"}])
    # The fast channel (tier L1 asks for it and the fast deployment's GPU is well below the limit).
    fast = oa.chat.completions.with_raw_response.create(
        model="demo-gpt", messages=[{"role": "user", "content": "fast"}],
        extra_headers={"x-modelyard-channel": "fast"})
    assert fast.headers.get("x-modelyard-channel") == "fast", dict(fast.headers)
    # The learning strategy's arms (demo-learn's bandit) and the shipped A/B experiment's (speed).
    for i in range(4):
        oa.chat.completions.create(model="demo-learn", messages=[{"role": "user", "content": f"learn {i}"}])
        oa.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": f"ab {i}"}],
                                   extra_headers={"x-modelyard-strategy": "speed"})
    # An Anthropic caller with a bad key: an error in another protocol.
    an = anthropic.Anthropic(base_url=url, api_key="sk-wrong", max_retries=0, timeout=20)
    with pytest.raises(anthropic.AuthenticationError):
        an.messages.create(model="demo-gpt", max_tokens=20, messages=[{"role": "user", "content": "hi"}])
    # Rate-limit refusals: the limited tenant's bucket holds 3.
    limited = openai.OpenAI(base_url=f"{url}/v1", api_key=LIMITED, max_retries=0, timeout=20)
    refused = 0
    for _ in range(6):
        try:
            limited.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "x"}])
        except openai.RateLimitError:
            refused += 1
    assert refused >= 2
    # A spent budget: 429 insufficient_quota (and, at $0, past its soft share from the start).
    with pytest.raises(openai.RateLimitError) as broke:
        openai.OpenAI(base_url=f"{url}/v1", api_key=BROKE, max_retries=0, timeout=20).chat.completions.create(
            model="demo-gpt", messages=[{"role": "user", "content": "x"}])
    assert broke.value.code == "insufficient_quota"
    # Image classification through the batcher.
    body, ctype = classify_form("demo-colors", ["red", "green", "blue"])
    r = httpx.post(f"{url}/v1/images/classify", content=body, timeout=30,
                   headers={"authorization": f"Bearer {DEMO_KEY}", "content-type": ctype})
    assert r.status_code == 200, r.text


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


def test_every_dashboard_query_and_alert_signal_has_data(tmp_path: Path, redis_server: RedisServer) -> None:
    started = time.monotonic()
    data = _stack_config(redis_server.url, tmp_path)
    admin, stats = free_port(), free_port()
    env = EnvironmentConfig.model_validate({"name": "test", "concurrency": 1,
                                            "admin": {"address": "127.0.0.1", "port": admin},
                                            "stats": {"address": "127.0.0.1", "port": stats}})
    with start_stack(tmp_path, data, env, shared_demos=True) as stack:
        agents = _agents(data)
        targets = {"envoy": [f"127.0.0.1:{stats}"], "modelyard-extproc": [data["extproc"]["metrics_address"]],
                   "gpu-agent": agents}
        with Prometheus(tmp_path, _prometheus_config(tmp_path, targets)) as prom:
            # Two waves: a labelled series first appears with its count already up, and rate() needs
            # an increase between two scrapes, as steady traffic gives it in production.
            _drive_traffic(stack.url)
            assert prom.wait_finite(["modelyard_batch_size_count", "modelyard_ratelimit_decisions_total"],
                                    timeout=15), "the first wave was never scraped"
            time.sleep(1.5)
            _drive_traffic(stack.url)
            # The image's HEALTHCHECK for an extproc, against the live replica.
            probe = subprocess.run([sys.executable, "-m", "modelyard.probe", "grpc", data["extproc"]["address"]],
                                   capture_output=True, text=True, timeout=30)
            assert probe.returncode == 0, probe.stderr

            # Every scrape target is up.
            health = prom.wait_targets_up(timeout=20)
            assert sorted(health) == sorted((job, t) for job, ts in targets.items() for t in ts)
            assert set(health.values()) == {"up"}, health

            panels = _dashboard_queries()
            assert len(panels) >= 25
            results = prom.wait_finite([e for _, e in panels], timeout=20)
            empty = [(title, e) for title, e in panels if not results[e]]
            assert not empty, f"dashboard queries without data: {empty}"

            recorded, alerts = _rules()
            signals = {}
            for rule in alerts:
                m = _ALERT.match(rule["expr"].strip())
                assert m, f"{rule['alert']}: expected `signal OP threshold`, got {rule['expr']!r}"
                signals[rule["alert"]] = m["signal"]
            signal_results = prom.wait_finite([*signals.values(), *(r["record"] for r in recorded)], timeout=10)
            assert not [a for a, s in signals.items() if not signal_results[s]], signal_results
            assert not [r["record"] for r in recorded if not signal_results[r["record"]]]
            rules = httpx.get(f"{prom.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
            bad = [(r["name"], r.get("lastError")) for g in rules for r in g["rules"] if r["health"] != "ok"]
            assert not bad and sum(len(g["rules"]) for g in rules) == len(recorded) + len(alerts), bad

            # Into firing condition: the fast deployment's GPUs fill up (standard requests still go to
            # the other node), then Redis goes away.
            fast_agent = _agent_of(data, "demo-openai-fast")
            httpx.post(f"http://{fast_agent}/fake", json={"util": 0.97, "mem": 0.5}, timeout=5).raise_for_status()
            saturated = prom.wait_finite([_alert_expr(alerts, "ModelyardGpuSaturated")], timeout=15)
            assert [s["metric"]["instance"] for s in next(iter(saturated.values()))] == [fast_agent]
            redis_server.stop()
            oa = openai.OpenAI(base_url=f"{stack.url}/v1", api_key=DEMO_KEY, max_retries=0, timeout=20)
            oa.chat.completions.create(model="demo-gpt", messages=[{"role": "user", "content": "no redis"}])
            fallback = prom.wait_finite([_alert_expr(alerts, "ModelyardRateLimitRedisFallback")], timeout=15)
            assert next(iter(fallback.values())), "the Redis fallback alert's condition never held"
            quiet = prom.query(_alert_expr(alerts, "ModelyardHighErrorRate"))
            assert quiet == [], "no 5xx was served: the error-rate alert must stay quiet"
    assert time.monotonic() - started < 120


def _agent_of(data: dict[str, Any], cluster: str) -> str:
    return next(urlparse(d["watermark"]["url"]).netloc for m in data["models"] for d in m["deployments"]
                if d["cluster"] == cluster)


def _alert_expr(alerts: list[dict[str, Any]], name: str) -> str:
    return next(r["expr"] for r in alerts if r["alert"] == name)
