"""Budgets: spend caps per key and per tenant over a UTC period, enforced before a call is routed.

Pure core: `periods` (the UTC windows and their reset), `decision` (refuse / soft / allow over
numbers), `ledger` (spend per scope and day: the store's totals plus this process's unflushed
spend). Shells: `store` (the shared SQL tables, behind one class), `webhook` (the soft-limit POST,
in its own thread), `report` (`modelyard spend`, from the metering rows). The request path's part
is `extproc/admission/budget_guard.py`.
"""

from .decision import Standing, refusal, verdict
from .ledger import Ledger
from .periods import Window, window

__all__ = ["Ledger", "Standing", "Window", "refusal", "verdict", "window"]
