"""Real KServe v2 servers as upstreams for tests, each in its own venv; absent, their tests skip:
Seldon's MLServer serving a scikit-learn model trained here (no downloads, `make mlserver`), and
NVIDIA Triton through nvidia-pytriton on the CPU (`make pytriton`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.stack_config import ROOT, free_port

MLSERVER_VENV = ROOT / ".venv-mlserver"
PYTRITON_VENV = ROOT / ".venv-pytriton"
MODEL = "iris"  # the upstream's name for it; the gateway calls it something else
FEATURES = 4

_TRAIN = """
import json, sys
import joblib
import numpy as np
from sklearn.linear_model import LogisticRegression
rng = np.random.default_rng(7)
X = rng.normal(size=(300, {features}))
y = (X[:, 0] + 0.5 * X[:, 1] - X[:, 2] > 0).astype(np.int64) + (X[:, 3] > 1).astype(np.int64)
model = LogisticRegression(max_iter=500).fit(X, y)
joblib.dump(model, sys.argv[1] + "/model.joblib")
probe = rng.normal(size=(6, {features}))
json.dump({{"x": probe.tolist(), "predict": model.predict(probe).tolist()}}, open(sys.argv[1] + "/expected.json", "w"))
"""


def mlserver_missing() -> str | None:
    """Why MLServer cannot run here, or None."""
    if not (MLSERVER_VENV / "bin" / "mlserver").exists():
        return f"MLServer is not installed ({MLSERVER_VENV} missing: run `make mlserver`)"
    return None


def prepare_mlserver(workdir: Path) -> dict[str, Any]:
    """Train the model with MLServer's own scikit-learn, write its settings; ports and expectations."""
    repo = workdir / "models"
    model_dir = repo / MODEL
    model_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([str(MLSERVER_VENV / "bin" / "python"), "-c", _TRAIN.format(features=FEATURES), str(model_dir)],
                   check=True, timeout=120)
    (model_dir / "model-settings.json").write_text(json.dumps({
        "name": MODEL, "implementation": "mlserver_sklearn.SKLearnModel", "platform": "sklearn",
        "versions": ["v1"],
        "inputs": [{"name": "features", "datatype": "FP64", "shape": [-1, FEATURES]}],
        "outputs": [{"name": "predict", "datatype": "INT64", "shape": [-1, 1]}],
        "parameters": {"uri": "./model.joblib", "version": "v1"},
    }))
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    (repo / "settings.json").write_text(json.dumps({
        "http_port": ports["http"], "grpc_port": ports["grpc"], "metrics_port": ports["metrics"],
        "host": "127.0.0.1", "parallel_workers": 0, "debug": False}))
    expected = json.loads((model_dir / "expected.json").read_text())
    return {"repo": repo, "ports": ports, "expected": expected}


def mlserver_child(repo: Path, http_port: int) -> Any:
    from devstack.launcher import Child

    return Child("mlserver", [str(MLSERVER_VENV / "bin" / "mlserver"), "start", str(repo)],
                 ("http", f"http://127.0.0.1:{http_port}/v2/models/{MODEL}/ready"))


def triton_missing() -> str | None:
    if not (PYTRITON_VENV / "bin" / "python").exists() or not (PYTRITON_VENV / ".installed-stamp").exists():
        return f"Triton is not installed ({PYTRITON_VENV} missing: run `make pytriton`)"
    return None


def triton_child(ports: dict[str, int]) -> Any:
    """Triton on `ports` (http, grpc, metrics). Its Python backend stub must load the libpython of
    the venv's own interpreter: on a pyenv build the system's libpython3.11 would be found first
    and its older C runtime meets the newer stdlib (`_recursion_count` missing)."""
    from devstack.launcher import Child

    python = PYTRITON_VENV / "bin" / "python"
    home = next(line.split("=", 1)[1].strip() for line in (PYTRITON_VENV / "pyvenv.cfg").read_text().splitlines()
                if line.startswith("home"))
    return Child("triton", [str(python), str(ROOT / "tests" / "triton_server.py"), str(ports["http"]),
                            str(ports["grpc"]), str(ports["metrics"])],
                 ("http", f"http://127.0.0.1:{ports['http']}/v2/models/double/ready"),
                 env={"LD_LIBRARY_PATH": str(Path(home).parent / "lib")})
