"""The Dockerfile passes hadolint, copies only what exists and is not ignored, and its entry point
starts each role and health-checks it (run here as a plain script: there is no Docker daemon)."""

from __future__ import annotations

import fnmatch
import json
import os
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import yaml

from tests.deploy.entrypoint import ENTRYPOINT, wait_healthy
from tests.deploy.tools import tool
from tests.stack_config import ROOT, free_port


def test_hadolint_finds_no_errors() -> None:
    out = subprocess.run([tool("hadolint"), "--format", "json", str(ROOT / "Dockerfile")], capture_output=True,
                         text=True, timeout=60)
    findings = json.loads(out.stdout or "[]")
    assert [f for f in findings if f["level"] == "error"] == [], findings
    # Warnings too: the image is small enough to keep them at zero.
    assert findings == [], findings


def _ignored(path: str, patterns: list[str]) -> bool:
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/") for p in patterns)


def test_every_copy_source_exists_and_reaches_the_build_context() -> None:
    patterns = [ln.strip() for ln in (ROOT / ".dockerignore").read_text().splitlines()
                if ln.strip() and not ln.startswith("#")]
    sources = []
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words and words[0] == "COPY" and not any(w.startswith("--from") for w in words):
            sources += [w for w in words[1:-1] if not w.startswith("--")]
    assert "modelyard" in sources and "deploy/docker/entrypoint.sh" in sources
    for src in sources:
        assert (ROOT / src).exists(), src
        assert not _ignored(src, patterns), f"{src} is excluded by .dockerignore"
    # Every package setuptools installs (pyproject's packages.find) is copied into the build stage.
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = [p.rstrip("*") for p in found["include"]]
    assert "contracts" in packages and "extproc" in packages, packages
    for pkg in packages:
        assert pkg in sources, pkg


def _entrypoint_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    # The image puts the venv's bin first on PATH; here, this interpreter's venv plays that part.
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
            "MODELYARD_ROLE_FILE": str(tmp_path / "role"), **extra}


def test_entrypoint_runs_the_agent_role_and_health_checks_it(tmp_path: Path) -> None:
    port = free_port()
    env = _entrypoint_env(tmp_path, MODELYARD_AGENT_PORT=str(port))
    proc = subprocess.Popen(["sh", str(ENTRYPOINT), "agent", "--fake", "--fake-util", "0.4", "--port", str(port)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        healthy = wait_healthy(env, tmp_path / "role")
        assert healthy is not None and healthy.returncode == 0, healthy and healthy.stderr
        assert (tmp_path / "role").read_text().strip() == "agent"
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    dead = subprocess.run(["sh", str(ENTRYPOINT), "healthcheck"], env=env, capture_output=True, text=True,
                          timeout=30)
    assert dead.returncode == 1 and "unhealthy" in dead.stderr


def test_entrypoint_runs_other_commands_as_given(tmp_path: Path) -> None:
    out = subprocess.run(["sh", str(ENTRYPOINT), "modelyard", "hash-key", "sk-modelyard-demo"],
                         env=_entrypoint_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "sha256:c898d9f492d2577070136e9b8f2852e4f208ee9f1f4a5dff1385dcea7966f81e"
    # A one-off command has nothing to probe: healthy.
    assert subprocess.run(["sh", str(ENTRYPOINT), "healthcheck"], env=_entrypoint_env(tmp_path),
                          timeout=30).returncode == 0


def _configmap_swap(folder: Path, generation: str, text: str) -> None:
    """What the kubelet does to a ConfigMap volume: a new timestamped folder, then `..data` swapped
    to it by an atomic rename; the file itself is a fixed symlink through `..data`."""
    (folder / generation).mkdir()
    (folder / generation / "modelyard.yaml").write_text(text)
    (folder / "..data_tmp").symlink_to(generation)
    os.replace(folder / "..data_tmp", folder / "..data")
    if not (folder / "modelyard.yaml").is_symlink():
        (folder / "modelyard.yaml").symlink_to("..data/modelyard.yaml")


def test_entrypoint_runs_the_watching_control_plane_and_a_configmap_update_reaches_it(tmp_path: Path) -> None:
    # The Kubernetes Deployment's container, as a process: the entrypoint's controlplane role with the
    # Deployment's args, on the shipped config (its addresses name the Service, which is no address
    # here: the role listens on MODELYARD_CONTROLPLANE_BIND at their ports), in a ConfigMap-shaped folder.
    from contracts.live_config import config_version

    cfg = yaml.safe_load((ROOT / "deploy/kubernetes/base/modelyard.yaml").read_text())
    xds, api = free_port(), free_port()
    cfg["controlplane"] = {**cfg["controlplane"], "xds_address": f"controlplane:{xds}",
                           "api_address": f"controlplane:{api}"}
    first = yaml.safe_dump(cfg, sort_keys=False)
    cfg["tenants"].append({**cfg["tenants"][0], "name": "added-live"})
    second = yaml.safe_dump(cfg, sort_keys=False)
    folder = tmp_path / "configmap"
    folder.mkdir()
    _configmap_swap(folder, "..2026_01_01_00_00_00.1", first)
    env = _entrypoint_env(tmp_path, MODELYARD_CONFIG=str(folder / "modelyard.yaml"),
                          MODELYARD_CONTROLPLANE_BIND="127.0.0.1", MODELYARD_CONTROLPLANE_API_PORT=str(api))
    args = yaml.safe_load((ROOT / "deploy/kubernetes/base/controlplane-deployment.yaml").read_text())
    container_args = args["spec"]["template"]["spec"]["containers"][0]["args"]
    proc = subprocess.Popen(["sh", str(ENTRYPOINT), *container_args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)

    def running_version(deadline_s: float, want: str) -> str | None:
        seen = None
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{api}/v1/status", timeout=5) as resp:
                    seen = json.loads(resp.read())["version"]
            except OSError:
                seen = None
            if seen == want:
                break
            time.sleep(0.2)
        return seen

    try:
        assert running_version(30, config_version(first.encode())) == config_version(first.encode())
        healthy = subprocess.run(["sh", str(ENTRYPOINT), "healthcheck"], env=env, capture_output=True, text=True,
                                 timeout=30)
        assert healthy.returncode == 0, healthy.stderr
        assert (tmp_path / "role").read_text().strip() == "controlplane"
        _configmap_swap(folder, "..2026_01_01_00_01_00.2", second)
        assert running_version(15, config_version(second.encode())) == config_version(second.encode())
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err.decode()[-2000:]
