"""Guardrails (docs/guardrails.md): checks on what goes into a model and what comes out of it, pure.

`PolicySet` compiles the config's `guardrails:` section once; `for_call` picks a call's checks;
a `CallGuard` runs them over the hub's internal format (requests, answers) and a `StreamGuard`
over stream events with a bounded hold-back window. The chat flow is the thin step that calls them.
"""

from guardrails.json_rewrite import rewrite_json
from guardrails.policies import CallChecks, Check, PolicySet, Remote
from guardrails.scan import CallGuard, GuardrailBlocked, Verdict
from guardrails.stream import StreamGuard

__all__ = ["CallChecks", "CallGuard", "Check", "GuardrailBlocked", "PolicySet", "StreamGuard", "Verdict", "Remote",
           "rewrite_json"]
