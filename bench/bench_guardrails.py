"""What a typical guardrail policy set costs per request and per streamed answer, against no policy.

    .venv/bin/python bench/bench_guardrails.py [--quick]

Cases, each against its baseline in the same run (medians of timed batches, us):
- a 4 KB OpenAI prompt (a few emails, a card, a phone number in it): parse + the input checks of a
  typical set (email, phone, card, IBAN, secret redact/log, a deny-list, a regex, a size limit) and the
  same-protocol body rewrite, against parse alone; and the "no policy covers this call" lookup;
- a streamed answer (a recorded OpenAI stream, ~300 chunks) decoded and encoded with the output
  window on (256 chars, email redaction, a block regex that never matches), against the same
  decode/encode without it (what a translated stream pays anyway);
- national ids (all nine formats, with their check digits) on the 4 KB prompt, against parse alone;
- the language limit (py3langid) on the 4 KB prompt and on a 200-character message, against parse
  alone: the detector's cost per call;
- a model check's verdict-cache lookup (digest of the 4 KB prompt text + a hit), against parse alone:
  what a repeated text costs instead of a call to the moderation deployment.
The last stdout line is `SUMMARY [...]`.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from adapters import openai  # noqa: E402
from adapters.registry import translate_stream  # noqa: E402
from bench.smoke import scaled  # noqa: E402
from contracts.config.guardrails import GuardrailsConfig  # noqa: E402
from guardrails import CallGuard, PolicySet, StreamGuard, rewrite_json  # noqa: E402
from guardrails.language import detect  # noqa: E402
from guardrails.moderation import VerdictCache  # noqa: E402

POLICY = GuardrailsConfig.model_validate({"policies": [{
    "name": "typical", "applies_to": {"tenants": ["t"]}, "window_chars": 256, "checks": [
        {"type": "email", "action": "redact", "restore": True, "direction": "both"},
        {"type": "phone", "action": "redact"},
        {"type": "card", "action": "redact"},
        {"type": "iban", "action": "redact"},
        {"type": "secret", "action": "block", "direction": "both"},
        {"type": "deny", "words": ["project falcon", "codename bluebird"], "action": "log"},
        {"type": "regex", "name": "ticket", "pattern": r"TICKET-\d{6}", "action": "log"},
        {"type": "size", "max_chars": 200_000},
        {"type": "regex", "name": "leak", "pattern": r"INTERNAL-ONLY-[A-Z]{4}", "direction": "output"}]}]})


def _prompt(target: int) -> bytes:
    sentence = ("Please draft a reply to the customer about their order; keep it short and polite, "
                "mention the refund timeline and the support hours. ")
    extras = ["Contact ana.lopez@example.com or +1 415 555 0100.", "Card on file 4111 1111 1111 1111.",
              "Their IBAN is DE89 3704 0044 0532 0130 00.", "Ticket TICKET-123456 mentions project falcon."]
    parts: list[str] = []
    i = 0
    while sum(len(p) for p in parts) < target - 200:
        parts.append(sentence + (extras[i % len(extras)] if i % 3 == 0 else ""))
        i += 1
    return orjson.dumps({"model": "m", "messages": [{"role": "system", "content": "You are a support agent."},
                                                    {"role": "user", "content": " ".join(parts)}]})


def _median_us(fn: Callable[[], object], batches: int, per_batch: int) -> tuple[float, float]:
    """(median, best) of the batches' per-call times: the best says what the code costs on a busy box."""
    for _ in range(per_batch):
        fn()
    samples = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(per_batch):
            fn()
        samples.append((time.perf_counter_ns() - t0) / per_batch / 1000)
    return statistics.median(samples), min(samples)


def main() -> None:
    quick = "--quick" in sys.argv
    scale = scaled(0.2 if quick else 1.0, 0.0)
    rows: list[dict] = []
    table: list[tuple[str, float, float, float, float]] = []
    policies = PolicySet(POLICY)
    checks = policies.for_call("t", "", "m")
    assert checks is not None

    def record(case: str, fn: Callable[[], object], base: Callable[[], object], batches: int, per: int) -> None:
        b, p = max(5, int(batches * scale)), scaled(per, max(1, per // 20))
        (us, best), (bus, bbest) = _median_us(fn, b, p), _median_us(base, b, p)
        rows.append({"bench": "guardrails", "case": case, "metric": "median_latency", "value": round(us, 3),
                     "unit": "us", "baseline": round(bus, 3), "ratio": round(us / bus, 2),
                     "best": round(best, 3), "baseline_best": round(bbest, 3)})
        table.append((case, us, bus, best, bbest))

    body = _prompt(4096)

    def parse() -> object:
        return openai.parse_request(body)

    def guarded() -> object:
        req = openai.parse_request(body)
        guard = CallGuard(checks)
        out = guard.request(req)
        return rewrite_json(body, guard.rewrites), out

    def uncovered() -> object:
        req = openai.parse_request(body)
        return policies.for_call("other", "", req.model)

    record(f"request_4KB_typical_policy ({len(body)} B)", guarded, parse, 200, 50)
    record("request_4KB_no_policy_covers_call", uncovered, parse, 200, 50)

    extra = PolicySet(GuardrailsConfig.model_validate({"policies": [
        {"name": "ids", "applies_to": {"tenants": ["ids"]}, "checks": [{"type": "national_id", "action": "redact"}]},
        {"name": "lang", "applies_to": {"tenants": ["lang"]}, "checks": [
            {"type": "language", "languages": ["en", "de", "fr"], "action": "block"}]}]}))
    ids, lang = extra.for_call("ids", "", "m"), extra.for_call("lang", "", "m")
    assert ids is not None and lang is not None

    def national_ids() -> object:
        return CallGuard(ids).request(openai.parse_request(body))

    def language() -> object:
        return CallGuard(lang).request(openai.parse_request(body))

    short = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": (
        "Please draft a short reply to the customer about the refund timeline and our support hours, "
        "keep it polite and mention that the order ships on Monday morning from the Berlin warehouse.")}]})

    def short_parse() -> object:
        return openai.parse_request(short)

    def short_language() -> object:
        req = openai.parse_request(short)
        return detect(req.messages[0].content[0].text)  # type: ignore[union-attr]

    cache = VerdictCache()
    text = "\n".join(p.text for m in openai.parse_request(body).messages for p in m.content
                     if hasattr(p, "text"))
    cache.put(VerdictCache.key("p/c/m", text), [], 300)

    def cached_verdict() -> object:
        openai.parse_request(body)
        return cache.get(VerdictCache.key("p/c/m", text))

    record("request_4KB_national_ids_all_formats", national_ids, parse, 200, 50)
    record("request_4KB_language_limit", language, parse, 100, 20)
    record(f"message_{len(short) - 60}B_language_detect", short_language, short_parse, 100, 50)
    record("request_4KB_model_check_cache_hit", cached_verdict, parse, 200, 50)

    recorded = (ROOT / "tests/adapters/conformance/data/vai-openai-text.chunks.txt").read_bytes()
    stream = b"".join(b"data: " + ln + b"\n\n" for ln in recorded.splitlines() if ln.strip()) + b"data: [DONE]\n\n"
    reads = [stream[i:i + 512] for i in range(0, len(stream), 512)]
    req = openai.parse_request(body)

    def drive(window: bool) -> None:
        stage = StreamGuard(CallGuard(checks)).feed if window else None
        t = translate_stream("openai", "openai", req, stage=stage)
        for r in reads:
            t.feed(r)
        t.finish()

    record(f"stream_window_256_typical_policy ({len(stream)} B, {len(reads)} reads)", lambda: drive(True),
           lambda: drive(False), 40, 5)

    print(f"{'case':<60} {'median us':>10} {'baseline us':>12} {'ratio':>7} {'best us':>9} {'base best':>9}")
    for case, us, bus, best, bbest in table:
        print(f"{case:<60} {us:>10.2f} {bus:>12.2f} {us / bus:>7.2f} {best:>9.2f} {bbest:>9.2f}")
    print("SUMMARY " + orjson.dumps(rows).decode())


if __name__ == "__main__":
    main()
