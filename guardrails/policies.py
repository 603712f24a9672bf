"""The `guardrails:` section compiled once per config: which checks cover a call (tenant, key, model)."""

from __future__ import annotations

from dataclasses import dataclass

from adapters.json_types import JSONObject
from contracts.config.guardrails import REMOTE_TYPES, GuardCheck, GuardPolicy, GuardrailsConfig
from guardrails.detectors import Finder, finder
from guardrails.vault import label_of


@dataclass(frozen=True, slots=True)
class Remote:
    """A check another service answers: an operator's webhook, or a moderation or classification model
    of this gateway (`model`); `extproc/guard_hooks.py` asks it."""

    kind: str  # webhook | moderation | classify
    timeout_s: float
    fail_open: bool
    url: str | None = None  # webhook
    secret_env: str | None = None  # webhook
    model: str | None = None  # moderation, classify
    thresholds: tuple[tuple[str, float], ...] = ()  # moderation
    prompt: str | None = None  # classify
    cache_ttl_s: float = 0.0  # moderation, classify


@dataclass(frozen=True, slots=True)
class Check:
    policy: str
    name: str
    label: str  # the placeholder's label
    action: str  # block | redact | log
    on_input: bool
    on_output: bool
    restore: bool
    find: Finder | None  # None: a size, json_schema or remote check
    max_chars: int | None = None
    remote: Remote | None = None
    structured: bool = False  # a json_schema check: the whole answer against `schema` or the request's
    schema: JSONObject | None = None



@dataclass(frozen=True, slots=True)
class CallChecks:
    """The checks one call is under, by side; `window`: the stream hold-back (the largest asked)."""

    inputs: tuple[Check, ...]
    outputs: tuple[Check, ...]
    window: int
    restores: bool  # a redaction on input is put back into the answer
    # The checks that ask another service (webhooks, moderation and classification models), by side:
    # the flow awaits them (extproc/guard_hooks.py).
    remote_inputs: tuple[Check, ...] = ()
    remote_outputs: tuple[Check, ...] = ()

    @property
    def guards_output(self) -> bool:
        return bool(self.outputs) or self.restores


def _remote(c: GuardCheck) -> Remote | None:
    if c.type not in REMOTE_TYPES:
        return None
    return Remote(kind=c.type, timeout_s=c.timeout_ms / 1000, fail_open=c.fail == "open", url=c.url,
                  secret_env=c.secret_env, model=c.model, thresholds=tuple(sorted(c.thresholds.items())),
                  prompt=c.prompt, cache_ttl_s=c.cache_ttl_s)


def _compile(policy: GuardPolicy) -> list[Check]:
    out = []
    for c in policy.checks:
        out.append(Check(policy=policy.name, name=c.label, label=label_of(c.label), action=c.action,
                         on_input=c.direction in ("input", "both"), on_output=c.direction in ("output", "both"),
                         restore=c.restore, find=finder(c), max_chars=c.max_chars,
                         remote=_remote(c),
                         structured=c.type == "json_schema", schema=c.schema_))
    return out


class PolicySet:
    """Every policy, compiled; `for_call` remembers its answer per (tenant, key, model)."""

    __slots__ = ("_policies", "_memo")

    def __init__(self, config: GuardrailsConfig) -> None:
        self._policies = [(p, _compile(p)) for p in config.policies]
        self._memo: dict[tuple[str, str, str, str], CallChecks | None] = {}

    def __bool__(self) -> bool:
        return bool(self._policies)

    def for_call(self, tenant: str, key_id: str, model: str) -> CallChecks | None:
        return self._covering(tenant, key_id, model, "")

    def for_tool(self, tenant: str, key_id: str, tool: str) -> CallChecks | None:
        """An MCP tools/call's checks: policies on its tenant or key, or naming the tool (`server__*`: all of them)."""
        return self._covering(tenant, key_id, "", tool)

    def _covering(self, tenant: str, key_id: str, model: str, tool: str) -> CallChecks | None:
        memo_key = (tenant, key_id, model, tool)
        try:
            return self._memo[memo_key]
        except KeyError:
            pass
        checks: list[Check] = []
        window = 0
        server_all = tool.split("__", 1)[0] + "__*" if tool else ""
        for p, compiled in self._policies:
            a = p.applies_to
            if (tenant in a.tenants or (key_id and key_id in a.keys) or (model and model in a.models)
                    or (tool and (tool in a.tools or server_all in a.tools))):
                checks += compiled
                window = max(window, p.window_chars)
        found = None if not checks else CallChecks(
            inputs=tuple(c for c in checks if c.on_input), outputs=tuple(c for c in checks if c.on_output),
            window=window, restores=any(c.restore for c in checks),
            remote_inputs=tuple(c for c in checks if c.remote is not None and c.on_input),
            remote_outputs=tuple(c for c in checks if c.remote is not None and c.on_output))
        if len(self._memo) < 65536:  # bounded: callers name models; unknown ones are refused later anyway
            self._memo[memo_key] = found
        return found
