"""The endpoint picker's decisions, pure: what a request asks, which endpoints it may go to, and
the answer the Endpoint Picker Protocol wants (docs/proposals/004-endpoint-picker-protocol of
kubernetes-sigs/gateway-api-inference-extension):

- the subset hint (`envoy.lb.subset_hint` / `x-gateway-destination-endpoint-subset` in the
  request's filter metadata) bounds the candidates: only those, and 503 when none is eligible;
- the pick is the replica picker's (extproc/replicas/picker.py), over the pool's fresh readings;
- no ready endpoint (none with a fresh reading): 503; every candidate saturated and the request
  sheddable (its InferenceObjective's priority below 0): 429.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from adapters import openai
from contracts.config.endpoint_picker import EndpointPickerConfig
from contracts.envoy_names import (
    DESTINATION_ENDPOINT_HEADER,
    EPP_DESTINATION_NAMESPACE,
    EPP_SUBSET_KEY,
    EPP_SUBSET_NAMESPACE,
)
from contracts.errors import ClientError, ModelyardError, Unavailable
from extproc.replicas.picker import Pick
from extproc.replicas.prefix import prompt_text
from extproc.replicas.readings import ReplicaReading

SUBSET_NAMESPACE = EPP_SUBSET_NAMESPACE
SUBSET_KEY = EPP_SUBSET_KEY
DESTINATION_NAMESPACE = EPP_DESTINATION_NAMESPACE
DESTINATION_KEY = DESTINATION_ENDPOINT_HEADER  # the header and the metadata key alike
SERVED_KEY = "x-gateway-destination-endpoint-served"
OBJECTIVE_HEADER = "x-gateway-inference-objective"


@dataclass(frozen=True, slots=True)
class InferenceAsk:
    """What the picker reads of a request: the model, and the prompt for prefix affinity."""

    model: str | None
    prompt: str | None


def read_body(body: bytes) -> InferenceAsk:
    """An OpenAI-shaped body (chat or completions). Not JSON: 400 (the reference picker's answer
    too). JSON that is no chat request still gets a pick, without prefix affinity."""
    if not body.strip():
        return InferenceAsk(None, None)
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ClientError("request body is not JSON") from None
    if not isinstance(obj, dict):
        raise ClientError("request body must be a JSON object")
    model = obj.get("model") if isinstance(obj.get("model"), str) else None
    if "messages" in obj:
        try:
            return InferenceAsk(model, prompt_text(openai.parse_request(body)))
        except ModelyardError:
            return InferenceAsk(model, None)  # the model server judges its own input
    prompt = obj.get("prompt")
    return InferenceAsk(model, prompt if isinstance(prompt, str) else None)


def subset_hint(filter_metadata: Mapping[str, Mapping[str, object]]) -> list[str] | None:
    """The endpoints the proxy allows, or None when it sets no hint. The value is a list, or one
    comma-separated string (what a header-to-metadata rule writes)."""
    ns = filter_metadata.get(SUBSET_NAMESPACE)
    if ns is None or SUBSET_KEY not in ns:
        return None
    raw = ns[SUBSET_KEY]
    items = raw if isinstance(raw, list) else [raw]
    return [ep.strip() for item in items if isinstance(item, str) for ep in item.split(",") if ep.strip()]


def candidates(pool: list[str], hint: list[str] | None) -> list[str]:
    """The pool's endpoints the hint allows; a hint entry without a port allows every port of that IP."""
    if hint is None:
        return list(pool)
    allowed = set(hint)
    return [ep for ep in pool if ep in allowed or ep.rpartition(":")[0] in allowed]


def priority(config: EndpointPickerConfig, headers: Mapping[str, str],
             objectives: Mapping[str, int] | None = None) -> int:
    """The request's InferenceObjective (named in a header) gives its priority; below 0 is sheddable.
    `objectives`: those in force (the config's, and the cluster's where the picker watches them)."""
    name = headers.get(OBJECTIVE_HEADER)
    table = config.objectives if objectives is None else objectives
    return table.get(name, config.default_priority) if name else config.default_priority


def saturated(config: EndpointPickerConfig, reading: ReplicaReading) -> bool:
    """Over the configured bound: requests waiting (the server's queue, as the reference's
    saturation detector reads it), or the KV cache."""
    if config.shed_queue is not None and reading.waiting > config.shed_queue:
        return True
    return config.shed_kv is not None and reading.kv_usage is not None and reading.kv_usage >= config.shed_kv


def decide(config: EndpointPickerConfig, pick: Pick, readings: Mapping[str, ReplicaReading], prio: int,
           pool: str) -> list[str]:
    """The endpoints to send (the pick first, then `fallbacks` more), or the refusal the protocol names."""
    if pick.endpoint is None:
        raise Unavailable(f"no ready endpoint in InferencePool {pool}", retry_after_s=1)
    if prio < 0 and all(saturated(config, readings[s.endpoint]) for s in pick.ranked):
        raise Unavailable(f"InferencePool {pool} is saturated; sheddable request dropped", status=429,
                          retry_after_s=1)
    return [s.endpoint for s in pick.ranked[:1 + config.fallbacks]]
