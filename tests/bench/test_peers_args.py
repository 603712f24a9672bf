"""bench_peers refuses a malformed --base-env before it starts a stack (a lever that is a setting), and
runs a --base checkout on its own shipped config."""

from __future__ import annotations

import pytest
import yaml

from bench.bench_peers import main


@pytest.mark.parametrize("pairs", [["GRPC_EXPERIMENTS"], ["=x"], ["A=1", "A=2"]])
def test_a_malformed_base_env_is_refused_before_anything_starts(pairs: list[str], capsys) -> None:
    argv = [arg for pair in pairs for arg in ("--base-env", pair)]
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert "--base-env takes NAME=VALUE" in capsys.readouterr().err


def test_a_base_checkout_runs_on_its_own_shipped_config(tmp_path) -> None:
    from bench.bench_peers import base_config
    from tests.stack_config import ROOT
    data = yaml.safe_load((ROOT / "modelyard.yaml").read_text())
    data["models"] = [m for m in data["models"] if m["name"] == "demo-gpt"]  # an older tree's, say
    (tmp_path / "modelyard.yaml").write_text(yaml.safe_dump(data))
    base = base_config(tmp_path)
    assert [m["name"] for m in base["models"]] == ["demo-gpt"]
    assert base["listener"]["port"] != data["listener"]["port"]  # on free ports, as this tree's
    assert len(base_config(None)["models"]) > 1  # no base: this tree's own
