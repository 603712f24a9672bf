from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.stack_config import demo_config_free_ports

DEMO_KEY = "sk-modelyard-demo"
UPSTREAM_KEYS = {"DEMO_OPENAI_KEY": "sk-upstream-openai-secret", "DEMO_ANTHROPIC_KEY": "sk-ant-upstream-secret",
                 "DEMO_GEMINI_KEY": "upstream-gemini-secret", "DEMO_AZURE_KEY": "azure-upstream-secret"}


def _cuda_device_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_device_present():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (run `make gpu-check` on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def demo_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """Envoy + extproc + every demo upstream of the shipped config, on free ports, shared by e2e tests."""
    from tests.stack_config import start_stack

    workdir = tmp_path_factory.mktemp("stack")
    data, _ = demo_config_free_ports()
    # Provider keys: the demo upstreams demand them, so every 200 proves the gateway injected them.
    for name, value in UPSTREAM_KEYS.items():
        os.environ.setdefault(name, value)
    with start_stack(workdir, data, shared_demos=True) as stack:
        yield stack
