"""Which build of the request path runs: mypyc-compiled modules, or the pure-Python ones beside them.

`make compiled` (setup.py, MODELYARD_COMPILE=1) builds the modules listed here into extension
modules next to their sources; Python's import system then prefers the extension. The pure modules
stay the truth and stay importable: `MODELYARD_PURE_PYTHON=1` (inherited by every process a stack
starts) makes the packages import the `.py` files, and so does an extension older than its source
(a stale build must never run code that is not in the tree). docs/performance.md has the measures.

`select()` runs in the `__init__` of every package that holds a listed module, before any of them
is imported; it imports nothing of ours.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("modelyard.compiled")

PURE_ENV = "MODELYARD_PURE_PYTHON"

# The request path's modules that pay compiled (docs/performance.md, "Compiled Python"); the setup
# script compiles these and only these, as one mypyc group.
MODULES: tuple[str, ...] = (
    "extproc.session",
    "extproc.messages",
    "extproc.public_headers",
    "extproc.audit_trail",
    "extproc.accounting",
    "extproc.flows.chat",
    "extproc.flows.upstream",
    "extproc.flows.xlate",  # ChatFlow's subclass: an interpreted class cannot inherit from a compiled one
    "extproc.flows.completions",  # ChatFlow's subclass too (it failed at its first call, compiled)
    "extproc.context",
    "extproc.routes",
    "extproc.errors",
    "extproc.admission.auth",
    "extproc.routing.scheduler",
    "extproc.routing.score",
    "extproc.routing.filters",
    "extproc.routing.admission",
    "extproc.routing.decision",
    "extproc.routing.feedback",
    "ratelimit.bucket",
    "ratelimit.limiter",
    "ratelimit.rules",
    "ratelimit.decision",
    "adapters.sse",
    "adapters.internal",
    "adapters.injected_usage",
    "adapters.stream_usage",
    "adapters.openai.request",
    "adapters.openai.render",
    "adapters.openai.response",
    "adapters.openai.stream",
    "adapters.openai.usage",
    "adapters.fields",
    "adapters.json_shape",
    "adapters.limits",
    "adapters.registry",
    # SSEDecoder's and the OpenAI stream's subclasses
    "adapters.anthropic.stream",
    "adapters.gemini.stream",
    "adapters.responses.stream",
    "adapters.azure_openai.stream",
    "adapters.completions.stream",  # a StreamDecoder: an interpreted class cannot subclass a compiled one
)

# mypyc's one shared library for every listed module: contracts/request_path__mypyc.<suffix>.
GROUP = "contracts.request_path"

_ROOT = Path(__file__).resolve().parent.parent
_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def source_of(module: str) -> Path:
    return _ROOT.joinpath(*module.split(".")).with_suffix(".py")


def extension_of(module: str) -> Path:
    return _ROOT.joinpath(*module.split(".")).with_name(module.rpartition(".")[2] + _SUFFIX)


def _stale() -> list[str]:
    """Compiled modules whose source changed since they were built."""
    out = []
    for m in MODULES:
        ext = extension_of(m)
        try:
            if ext.stat().st_mtime < source_of(m).stat().st_mtime:
                out.append(m)
        except FileNotFoundError:
            continue
    return out


class _PureFinder(importlib.abc.MetaPathFinder):
    """Finds the listed modules' `.py` files ahead of the extensions built beside them."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _LISTED:
            return None
        src = source_of(fullname)
        return importlib.util.spec_from_file_location(fullname, src) if src.exists() else None


_LISTED = frozenset(MODULES)
_choice: str | None = None


def select() -> str:
    """Decide once per process: "compiled" when every built extension is fresh and the pure build
    is not asked for, else "pure" (the listed modules then import from source)."""
    global _choice
    if _choice is not None:
        return _choice
    built = any(extension_of(m).exists() for m in MODULES)
    stale = _stale() if built else []
    if os.environ.get(PURE_ENV, "") not in ("", "0") or not built or stale:
        if stale:
            log.warning("compiled modules older than their source (%s): running the pure-Python build; "
                        "`make compiled` rebuilds them", ", ".join(stale))
        if built:
            sys.meta_path.insert(0, _PureFinder())
        _choice = "pure"
    else:
        _choice = "compiled"
    return _choice


def loaded() -> str:
    """What actually runs: "compiled" when the listed modules imported so far are extension modules
    (the session's, where it is imported), "pure" otherwise."""
    mods = [sys.modules[m] for m in MODULES if m in sys.modules]
    return "compiled" if mods and all((m.__file__ or "").endswith(_SUFFIX) for m in mods) else "pure"
