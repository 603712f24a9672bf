"""OpenAI's `/v1/moderations` on the demo OpenAI server (`demo-moderation`), answering as OpenAI
documents it (`results[]`: `flagged`, `categories`, `category_scores`, `category_applied_input_types`)
from a small deterministic classifier: each category has a few trigger words; a text scores 0.9 in a
category for one of them (0.99 for two or more) and 0.01 otherwise. A demo, not a moderation model.
"""

from __future__ import annotations

import re
import uuid

from aiohttp import web

CATEGORIES = ("harassment", "harassment/threatening", "hate", "hate/threatening", "illicit", "illicit/violent",
              "self-harm", "self-harm/intent", "self-harm/instructions", "sexual", "sexual/minors", "violence",
              "violence/graphic")
# The words each category reacts to (whole words, any case): enough to show a block, a log and a pass.
TRIGGERS: dict[str, tuple[str, ...]] = {
    "violence": ("kill", "murder", "stab", "shoot", "bomb"),
    "violence/graphic": ("gore", "dismember"),
    "harassment": ("idiot", "moron", "loser"),
    "harassment/threatening": ("hunt you down", "i will hurt you"),
    "illicit": ("counterfeit", "launder", "lockpick"),
    "self-harm": ("hurt myself",),
}
FLAG_AT = 0.5  # OpenAI's `flagged` is its own; the demo's is any score at or above this
_PATTERNS = {cat: re.compile(r"\b(?:" + "|".join(map(re.escape, words)) + r")\b", re.IGNORECASE)
             for cat, words in TRIGGERS.items()}


def scores(text: str) -> dict[str, float]:
    out = {}
    for cat in CATEGORIES:
        pattern = _PATTERNS.get(cat)
        hits = len(pattern.findall(text)) if pattern is not None else 0
        out[cat] = 0.99 if hits > 1 else 0.9 if hits else 0.01
    return out


def result(text: str, kinds: list[str]) -> dict[str, object]:
    s = scores(text)
    cats = {c: v >= FLAG_AT for c, v in s.items()}
    return {"flagged": any(cats.values()), "categories": cats, "category_scores": s,
            "category_applied_input_types": {c: kinds for c in CATEGORIES}}


def add_moderation_routes(app: web.Application) -> None:
    async def moderations(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        value = body.get("input") if isinstance(body, dict) else None
        items = [value] if isinstance(value, str) else value if isinstance(value, list) and value else None
        if items is None:
            return web.json_response({"error": {"message": "input is required", "type": "invalid_request_error",
                                                "param": "input", "code": None}}, status=400)
        results = []
        if all(isinstance(i, str) for i in items):  # strings: one result each
            results = [result(i, ["text"]) for i in items]
        else:  # input parts: one result for them all
            text = " ".join(str(i.get("text", "")) for i in items if isinstance(i, dict) and i.get("type") == "text")
            images = any(isinstance(i, dict) and i.get("type") == "image_url" for i in items)
            results = [result(text, ["text", "image"] if images else ["text"])]
        return web.json_response({"id": f"modr-{uuid.uuid4().hex[:24]}",
                                  "model": str(body.get("model") or "omni-moderation-latest"),
                                  "results": results})

    app.router.add_post("/v1/moderations", moderations)
