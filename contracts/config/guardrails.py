"""`guardrails:`: policies of checks on what goes into a model and what comes out of it
(docs/guardrails.md). The config model only; the checks are `guardrails/`, the step is the chat flow's."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

CheckType = Literal["email", "phone", "card", "iban", "secret", "regex", "deny", "size", "webhook", "json_schema",
                    "national_id", "language", "moderation", "classify"]
# national_id formats (guardrails/national_ids.py); the check's default is all of them.
NationalIdFormat = Literal["us_ssn", "uk_nino", "de_steuer", "fr_nir", "es_dni", "it_cf", "nl_bsn", "in_aadhaar",
                           "br_cpf"]
# The checks that ask another service (a webhook, a moderation or classification model): the flow awaits them.
REMOTE_TYPES = ("webhook", "moderation", "classify")
Action = Literal["block", "redact", "log"]
Direction = Literal["input", "output", "both"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class GuardCheck(_Model):
    """One check: what it looks for, on which side of the call, and what a match does."""

    type: CheckType
    name: str = ""  # the check's name in verdicts, audit rows and metrics; default: its type
    direction: Direction = "input"  # `on` would be YAML 1.1's boolean true
    action: Action = "block"
    # redact on input: put the originals back into the answer this caller gets (whole and streamed).
    restore: bool = False
    pattern: str | None = None  # type regex: a Python regex
    words: list[str] = Field(default_factory=list)  # type deny: words or phrases, matched on word boundaries
    case_sensitive: bool = False  # regex and deny
    max_chars: int | None = Field(None, ge=1)  # type size: the prompt's text past this is refused
    # type webhook: the prompt (after this call's redactions) POSTed as JSON, signed like the task
    # webhooks (`x-modelyard-signature: sha256=<hmac>` with the secret in `secret_env`); the answer
    # `{"verdict": "block" | "allow"}`. No answer within timeout_ms: `fail: closed` blocks, `open` lets it go.
    url: str | None = Field(None, pattern=r"^https?://")
    timeout_ms: int = Field(500, ge=1, le=30_000)
    fail: Literal["open", "closed"] = "closed"
    secret_env: str | None = None
    # type json_schema (output): the answer must be JSON valid against this schema; absent: against the
    # schema the request asked for (response_format json_schema), and a request without one is not checked.
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    # type national_id: the formats looked for (empty: all), each with its check digits.
    formats: list[NationalIdFormat] = Field(default_factory=list)
    # type language: the languages a text may be in (ISO 639-1, `en`), told by py3langid (offline);
    # texts shorter than `min_chars` are too short to tell and pass.
    languages: list[str] = Field(default_factory=list)
    min_chars: int = Field(40, ge=1)
    # type moderation: a model of this gateway whose deployment speaks OpenAI's /v1/moderations; a
    # category scoring at or above its threshold is a match (no thresholds: the answer's `flagged`).
    # type classify: a chat model asked with `prompt` (`{text}` stands for what is checked), its
    # answer read Llama Guard's way: `safe`, or `unsafe` and the categories on the next line.
    model: str | None = None
    thresholds: dict[str, float] = Field(default_factory=dict)
    prompt: str | None = None
    # moderation and classify: one verdict per distinct text, remembered this long (0: not at all).
    cache_ttl_s: float = Field(300.0, ge=0, le=86_400)

    @field_validator("schema_")
    @classmethod
    def _schema(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is not None:
            import jsonschema  # only where a config names a schema

            try:
                jsonschema.validators.validator_for(v).check_schema(v)
            except jsonschema.SchemaError as e:
                raise ValueError(f"not a valid JSON Schema: {e.message}") from None
        return v

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"not a valid regex: {e}") from None
            if re.compile(v).match(""):
                raise ValueError("the regex matches the empty string (it would match everywhere)")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> GuardCheck:
        if self.type == "regex" and not self.pattern:
            raise ValueError("a regex check needs `pattern`")
        if self.type == "deny" and not [w for w in self.words if w.strip()]:
            raise ValueError("a deny check needs `words` (non-empty)")
        if self.type == "size":
            if self.max_chars is None:
                raise ValueError("a size check needs `max_chars`")
            if self.action == "redact":
                raise ValueError("a size check cannot redact (block or log)")
            if self.direction != "input":
                raise ValueError("a size check applies to the prompt (direction: input)")
        if self.type == "webhook":
            if not self.url:
                raise ValueError("a webhook check needs `url`")
            if self.action == "redact":
                raise ValueError("a webhook check blocks or logs")
        elif self.url is not None:
            raise ValueError(f"`url` is for webhook checks, not {self.type}")
        if self.type == "json_schema":
            if self.action == "redact" or self.direction != "output":
                raise ValueError("a json_schema check blocks or logs, on output")
        elif self.schema_ is not None:
            raise ValueError(f"`schema` is for json_schema checks, not {self.type}")
        if self.type in ("moderation", "classify"):
            if not self.model:
                raise ValueError(f"a {self.type} check needs `model` (a model of this gateway)")
            if self.action == "redact":
                raise ValueError(f"a {self.type} check blocks or logs")
            if self.type == "classify" and (not self.prompt or "{text}" not in self.prompt):
                raise ValueError("a classify check needs `prompt` with `{text}` where the checked text goes")
            if any(not 0 <= t <= 1 for t in self.thresholds.values()):
                raise ValueError("thresholds are scores from 0 to 1")
        elif self.model is not None or self.thresholds or self.prompt is not None:
            raise ValueError(f"`model`, `thresholds` and `prompt` are for moderation and classify checks, not {self.type}")
        if self.type == "language":
            if not self.languages:
                raise ValueError("a language check needs `languages` (the ones allowed, ISO 639-1)")
            if self.action == "redact":
                raise ValueError("a language check blocks or logs")
            bad = [lang for lang in self.languages if not re.fullmatch(r"[a-z]{2,3}", lang)]
            if bad:
                raise ValueError(f"languages: {bad[0]!r} is not an ISO 639 code (`en`, `de`)")
        elif self.languages:
            raise ValueError(f"`languages` is for language checks, not {self.type}")
        if self.formats and self.type != "national_id":
            raise ValueError(f"`formats` is for national_id checks, not {self.type}")
        if self.restore and (self.action != "redact" or self.direction == "output"):
            raise ValueError("restore: true needs action redact on input")
        if self.pattern is not None and self.type != "regex":
            raise ValueError(f"`pattern` is for regex checks, not {self.type}")
        return self

    @property
    def label(self) -> str:
        return self.name or self.type


class AppliesTo(_Model):
    """Whom a policy covers: a call matches when its tenant, its key or its model is listed."""

    tenants: list[str] = Field(default_factory=list)
    # Key store keys by id (`modelyard keys`); a key from the config file is covered through its tenant.
    keys: list[str] = Field(default_factory=list)
    models: list[str] = Field(default_factory=list)  # the model name the caller asked for
    # MCP tools by their gateway name (`server__tool`, or `server__*` for all of a server's): their
    # tools/call arguments and results are checked. A policy on a tenant or key covers its tool calls too.
    tools: list[str] = Field(default_factory=list)


class GuardPolicy(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.:-]+$")
    applies_to: AppliesTo
    checks: list[GuardCheck] = Field(min_length=1)
    # Streamed output: text is held back this many characters before it is checked and released,
    # so a match (or a placeholder to restore) split across chunks is still seen whole.
    window_chars: int = Field(256, ge=16, le=65536)

    @model_validator(mode="after")
    def _names(self) -> GuardPolicy:
        seen: set[str] = set()
        for i, c in enumerate(self.checks):
            if c.label in seen:
                raise ValueError(f"checks[{i}]: duplicate check name {c.label!r} (name each check of a type)")
            seen.add(c.label)
        a = self.applies_to
        if not (a.tenants or a.keys or a.models or a.tools):
            raise ValueError("applies_to names no tenant, key, model or tool: the policy would cover nothing")
        return self


class GuardrailsConfig(_Model):
    policies: list[GuardPolicy] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> GuardrailsConfig:
        seen: set[str] = set()
        for i, p in enumerate(self.policies):
            if p.name in seen:
                raise ValueError(f"policies[{i}].name: duplicate {p.name!r}")
            seen.add(p.name)
        return self
