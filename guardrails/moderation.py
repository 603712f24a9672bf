"""Model-based checks, pure: what a moderation or classification model is asked and how its answer
reads, and the verdicts remembered per text.

- `moderation`: a deployment speaking OpenAI's `/v1/moderations` (`{"model", "input"}` in;
  `results[0].categories` and `category_scores` out). A category scoring at or above its threshold
  matches; without thresholds, the answer's own `flagged` and its true categories decide.
- `classify`: a chat model asked with the operator's prompt, its answer read Llama Guard's way: a
  first line `safe`, or `unsafe` and the violated categories (`S1,S10`) on the next line.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

import orjson

from adapters.json_types import JSONObject

UNREADABLE = None  # an answer that says nothing either way: the check's `fail` decides


def moderation_request(model: str, text: str) -> bytes:
    return orjson.dumps({"model": model, "input": text})


def moderation_flags(answer: object, thresholds: Mapping[str, float]) -> list[str] | None:
    """The categories that match in an OpenAI moderation answer (empty: allowed); None: unreadable."""
    if not isinstance(answer, dict):
        return UNREADABLE
    results = answer.get("results")
    if not isinstance(results, list) or not results or not all(isinstance(r, dict) for r in results):
        return UNREADABLE
    out: list[str] = []
    for r in results:  # one per input; ours sends one, a batching server may split it
        if thresholds:
            scores = r.get("category_scores")
            if not isinstance(scores, dict):
                return UNREADABLE
            for cat, limit in thresholds.items():
                score = scores.get(cat)
                if isinstance(score, (int, float)) and not isinstance(score, bool) and score >= limit:
                    out.append(cat)
        else:
            flagged = r.get("flagged")
            if not isinstance(flagged, bool):
                return UNREADABLE
            if flagged:
                cats = r.get("categories")
                out += [k for k, v in cats.items() if v is True] if isinstance(cats, dict) else []
                out = out or ["flagged"]
    return sorted(set(out))


def classify_prompt(prompt: str, text: str) -> str:
    return prompt.replace("{text}", text)


def classify_flags(answer: str) -> list[str] | None:
    """Llama Guard's answer: `safe` -> [], `unsafe` + `S1,S2` -> ["S1", "S2"]; anything else: None."""
    lines = [line.strip() for line in answer.strip().splitlines() if line.strip()]
    if not lines:
        return UNREADABLE
    head = lines[0].lower().rstrip(".")
    if head == "safe":
        return []
    if head != "unsafe":
        return UNREADABLE
    cats = [c.strip() for c in lines[1].split(",") if c.strip()][:16] if len(lines) > 1 else []
    return sorted({c[:64] for c in cats}) or ["unsafe"]


class VerdictCache:
    """Verdicts by (check, text digest), each for `ttl_s`; bounded (the oldest goes first)."""

    __slots__ = ("_items", "_max", "_clock")

    def __init__(self, max_items: int = 4096, clock: Callable[[], float] = time.monotonic) -> None:
        self._items: OrderedDict[bytes, tuple[float, tuple[str, ...]]] = OrderedDict()
        self._max = max_items
        self._clock = clock

    @staticmethod
    def key(check_id: str, text: str) -> bytes:
        scope = hashlib.blake2b(check_id.encode("utf-8", "surrogatepass"), digest_size=32).digest()
        return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16, person=b"modelyard-guard",
                               key=scope).digest()

    def get(self, key: bytes) -> tuple[str, ...] | None:
        found = self._items.get(key)
        if found is None:
            return None
        if found[0] <= self._clock():
            del self._items[key]
            return None
        return found[1]

    def put(self, key: bytes, flags: list[str], ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        self._items[key] = (self._clock() + ttl_s, tuple(flags))
        self._items.move_to_end(key)
        while len(self._items) > self._max:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def as_object(body: bytes) -> JSONObject | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) else None
