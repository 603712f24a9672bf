"""The tests' own shape (issue 25): helpers live in driver modules, so no test module imports
another, not even from a child process's script."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# `from tests.x.test_y import ...` or `import tests.x.test_y`, in code or in a script string.
TEST_MODULE_IMPORT = re.compile(r"^\s*(?:from|import)\s+tests(?:\.\w+)*\.test_\w+", re.MULTILINE)


def test_no_test_module_imports_another() -> None:
    offenders = {str(p.relative_to(TESTS)): TEST_MODULE_IMPORT.findall(p.read_text())
                 for p in TESTS.rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}
