"""bench_peers refuses a malformed --base-env before it starts a stack (a lever that is a setting)."""

from __future__ import annotations

import pytest

from bench.bench_peers import main


@pytest.mark.parametrize("pairs", [["GRPC_EXPERIMENTS"], ["=x"], ["A=1", "A=2"]])
def test_a_malformed_base_env_is_refused_before_anything_starts(pairs: list[str], capsys) -> None:
    argv = [arg for pair in pairs for arg in ("--base-env", pair)]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert "--base-env takes NAME=VALUE" in capsys.readouterr().err
