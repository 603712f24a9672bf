"""The ground floor holds: a GPU node's agent and the control plane load no request-path module,
and the contracts load nothing of ours but the error tree (each checked in a fresh interpreter,
so modules an earlier test imported cannot hide an import)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.stack_config import ROOT

OURS = ("modelyard", "contracts", "extproc", "adapters", "kernels", "ratelimit", "keys", "controlplane", "devstack",
        "gpuagent")


def _loaded_after(module: str) -> list[str]:
    """The names of our packages' modules a fresh interpreter has loaded after importing `module`."""
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            f"print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] in {OURS!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


@pytest.mark.parametrize("module", ["gpuagent.agent", "controlplane.bootstrap", "devstack.launcher"])
def test_no_extproc_module_is_loaded(module: str) -> None:
    loaded = _loaded_after(module)
    assert module in loaded  # the probe saw the import itself
    assert [m for m in loaded if m.split(".")[0] == "extproc"] == []


def test_the_gpu_agent_loads_only_the_watermark_contract() -> None:
    loaded = _loaded_after("gpuagent.agent")
    assert "contracts.watermarks" in loaded
    # Not the config model (pydantic) nor the scheduler: a GPU node needs the wire format only.
    assert [m for m in loaded if m.startswith("contracts.config")] == []


@pytest.mark.parametrize("module", ["contracts.config", "contracts.envoy_names", "contracts.failover", "contracts.keys",
                                    "contracts.watermarks", "contracts.workers"])
def test_contracts_load_nothing_of_ours_but_the_error_tree(module: str) -> None:
    loaded = _loaded_after(module)
    assert module in loaded
    assert [m for m in loaded if m.split(".")[0] not in ("contracts", "modelyard")] == []
    assert [m for m in loaded if m.startswith("modelyard.") and m != "contracts.errors"] == []
