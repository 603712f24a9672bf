from __future__ import annotations

import pytest

from tests.chaos.stacks import slow_streams, twin_config
from tests.stack_config import start_stack


@pytest.fixture(scope="package")
def twins(tmp_path_factory: pytest.TempPathFactory):
    """Model `twin` on two peer deployments with agents; shared by the scenarios that break one part."""
    with slow_streams(start_stack(tmp_path_factory.mktemp("twins"), twin_config())) as stack:
        yield stack


@pytest.fixture
def fresh_twins(twins):
    """A new extproc: nothing learnt from an earlier scenario's faults, counters from zero."""
    twins.restart("extproc")
    return twins
