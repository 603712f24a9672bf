"""Which build of the request path runs (contracts/compiled.py): the compiled one where `make compiled`
built it, the pure-Python one when asked (MODELYARD_PURE_PYTHON=1) or when nothing is built.

`make test` runs the suite on the pure build and `make test-compiled` a subset on the compiled one,
each with MODELYARD_EXPECT_BUILD set: this module then checks that the build under test is the one loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from contracts import compiled

ROOT = Path(__file__).resolve().parents[2]
_PROBE = ("import json, importlib, sys; from contracts.compiled import MODULES, loaded; "
          "files = [importlib.import_module(m).__file__ for m in MODULES]; print(json.dumps([loaded(), files]))")


def _probe(pure: bool) -> tuple[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k != compiled.PURE_ENV}
    if pure:
        env[compiled.PURE_ENV] = "1"
    out = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         check=True, timeout=120)
    build, files = json.loads(out.stdout.strip().splitlines()[-1])
    return build, files


def _built() -> bool:
    return all(compiled.extension_of(m).exists() for m in compiled.MODULES)


def test_the_build_under_test_is_the_one_loaded() -> None:
    import extproc.session  # noqa: F401  (loaded() reads the module actually imported)

    expected = os.environ.get("MODELYARD_EXPECT_BUILD")
    if expected is None:
        pytest.skip("MODELYARD_EXPECT_BUILD unset: `make test` sets it for each build it runs")
    assert compiled.loaded() == expected
    assert compiled.select() == expected


def test_pure_python_when_asked_even_beside_a_compiled_build() -> None:
    build, files = _probe(pure=True)
    assert build == "pure"
    assert all(f.endswith(".py") for f in files), files


def test_compiled_where_built() -> None:
    if not _built():
        pytest.skip("no compiled build in this tree (`make compiled`)")
    if compiled._stale():  # an edit since `make compiled`: the pure modules run, by design (test below)
        pytest.skip("the compiled build is older than its sources (`make compiled` rebuilds it)")
    build, files = _probe(pure=False)
    assert build == "compiled"
    assert not [f for f in files if f.endswith(".py")]  # every listed module from its extension


def test_every_listed_module_has_its_source() -> None:
    # The pure build is the truth: a listed module without a .py could not fall back.
    assert all(compiled.source_of(m).exists() for m in compiled.MODULES)
    assert len(set(compiled.MODULES)) == len(compiled.MODULES)


def test_every_listed_package_decides_before_its_modules_load() -> None:
    # select() runs in these packages' __init__: a listed module elsewhere would skip the pure switch.
    assert {m.partition(".")[0] for m in compiled.MODULES} <= {"extproc", "adapters", "ratelimit"}
    for pkg in ("extproc", "adapters", "ratelimit"):
        assert "_select_build()" in (ROOT / pkg / "__init__.py").read_text()


def test_every_request_path_module_imports_on_the_build_under_test() -> None:
    # mypyc's classes refuse interpreted subclasses: a decoder left out of MODULES that subclasses a
    # compiled one fails on import, only in the compiled build (adapters.completions.stream did).
    import importlib
    import pkgutil

    failed = []
    for pkg in ("adapters", "extproc", "contracts", "ratelimit"):
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, f"{pkg}."):
            if not info.name.endswith("__main__"):
                try:
                    importlib.import_module(info.name)
                except TypeError as e:
                    failed.append(f"{info.name}: {e}")
    assert not failed


def test_no_interpreted_class_subclasses_a_compiled_one() -> None:
    # mypyc's native classes refuse an interpreted subclass when it is instantiated, not when it is
    # defined: CompletionsFlow(ChatFlow) imported fine and failed every /v1/completions call, only in the
    # compiled build. Read from the list, so the pure build (make test) catches it too.
    import importlib
    import inspect
    import pkgutil

    listed = set(compiled.MODULES)
    wrong = []
    for pkg in ("adapters", "extproc", "contracts", "ratelimit"):
        for info in pkgutil.walk_packages(importlib.import_module(pkg).__path__, f"{pkg}."):
            if info.name in listed or info.name.endswith("__main__"):
                continue
            mod = importlib.import_module(info.name)
            for name, cls in vars(mod).items():
                if not inspect.isclass(cls) or cls.__module__ != info.name:
                    continue
                native = [b.__qualname__ for b in cls.__mro__[1:] if b.__module__ in listed]
                if native:
                    wrong.append(f"{info.name}.{name} subclasses {native}")
    assert not wrong
