"""The console's pure parts, fed plain data: escaping, CSRF tokens, the Keys form, spend budgets,
audit searches, the config diff, histogram quantiles and the frontier plot."""

from __future__ import annotations

import re

from budgets.report import SpendRow
from console import audit_page, config_page, csrf, keys_page, limits_page, models_page, spend_page
from console.html import Safe, esc, page, table, tag

MARKUP = '<script>alert("x")</script>'


def test_every_value_is_escaped_and_safe_markup_is_not_escaped_twice() -> None:
    html = table(["name"], [[MARKUP], [tag("b", MARKUP)]])
    assert "<script>" not in html and html.count("&lt;script&gt;") == 2 and "<b>&lt;script" in html
    assert esc(esc("<")) == "&lt;" and isinstance(esc(1), Safe)
    doc = page(MARKUP, "keys", Safe(""), token='"><x')
    assert "<title>&lt;script&gt;" in doc and 'value="&quot;&gt;&lt;x"' in doc
    assert "http" not in doc.replace('rel="stylesheet"', "")  # every asset is the gateway's own path


def test_csrf_tokens_are_bound_to_their_session_and_fresh() -> None:
    token = csrf.mint("secret-a", 1000.0)
    assert csrf.check("secret-a", token, 1001.0) is None
    assert "not issued" in (csrf.check("secret-b", token, 1001.0) or "")
    issued, nonce, mac = token.split(".")
    assert "not issued" in (csrf.check("secret-a", f"{issued}.{nonce}x.{mac}", 1001.0) or "")
    assert "not issued" in (csrf.check("secret-a", f"{int(issued) + 5000}.{nonce}.{mac}", 6001.0) or "")
    assert "expired" in (csrf.check("secret-a", token, 1000.0 + csrf.MAX_AGE_S + 1) or "")
    assert "malformed" in (csrf.check("secret-a", "nope", 1000.0) or "")
    assert csrf.mint("secret-a", 1000.0) != token and len(csrf.nonce_of(token)) == 64


def test_the_create_form_becomes_the_admin_apis_body() -> None:
    body = keys_page.create_body({"tenant": "demo", "name": " ci ", "models": "demo-gpt, demo-mini,",
                                  "budget_usd": "5", "budget_period": "week", "expires": "", "rpm": "60", "tpm": "x"})
    assert body == {"tenant": "demo", "name": "ci", "models": ["demo-gpt", "demo-mini"], "budget_usd": 5.0,
                    "budget_period": "week", "rpm": 60, "tpm": "x"}  # "x": the spec's own message names it
    assert "budget_period" not in keys_page.create_body({"tenant": "demo", "budget_period": "day"})


def test_the_keys_page_shows_a_secret_only_when_handed_one() -> None:
    view = {"id": "key_0123456789abcdef", "tenant": "demo", "name": MARKUP, "status": "active", "models": None,
            "budget_usd": 5.0, "budget_period": "month", "hash_prefix": "abc", "expires_at": None}
    n = iter(range(100))
    listed = keys_page.render([view], tenants=["demo"], models=["demo-gpt"], mint=lambda: f"t{next(n)}")
    assert "new-secret" not in listed and "<script>" not in listed and "$5.0 / month" in listed
    assert len(set(re.findall(r'name="csrf" value="([^"]+)"', listed))) == 4  # one token per form
    shown = keys_page.render([view], tenants=["demo"], models=[], mint=lambda: "t",
                             shown={"id": view["id"], "key": "my-secret"})
    assert shown.count("my-secret") == 1


def test_budget_use_against_caps() -> None:
    keys = [{"id": "key_a", "status": "active", "budget_usd": 10.0, "budget_period": "day"},
            {"id": "key_b", "status": "revoked", "budget_usd": 1.0, "budget_period": "day"},
            {"id": "key_c", "status": "active", "budget_usd": None}]
    uses = spend_page.budget_uses(keys, {"demo": (100.0, "month")},
                                  {("key", "key_a", "day"): 12.5, ("tenant", "demo", "month"): 25.0},
                                  {"day": "D", "month": "M"})
    assert [(u.scope, u.share, u.resets) for u in uses] == [("key key_a", 1.25, "D"), ("tenant demo", 0.25, "M")]
    rows = [SpendRow("key_a", None, None, 3, 30, 0.5, saved_usd=0.1)]
    html = spend_page.render(rows, by="key", since="24h", budgets=uses)
    assert "125%" in html and 'class="bad"' in html and "saved $0.100000" in html and "<svg" in html


def test_audit_search_keeps_what_it_names_newest_first() -> None:
    rows = [{"id": i, "time": 100.0 + i, "event": "call", "tenant": "demo" if i % 2 else "other",
             "key_id": f"k{i % 3}", "model": "demo-gpt", "status": 200 if i < 8 else 429} for i in range(10)]
    kept, n = audit_page.newest(rows, audit_page.Search(tenant="demo", status="4xx"))
    assert n == 1 and [r["id"] for r in kept] == [9]
    kept, n = audit_page.newest(rows, audit_page.Search(since=103, until=106, key="k0"), limit=5)
    assert [r["id"] for r in kept] == [6, 3]
    html = audit_page.render([{"detail": MARKUP}], 1, {"tenant": MARKUP}, verdict=(False, "BROKEN at row 3"))
    assert "<script>" not in html and "BROKEN" in html
    assert 'id="verdict-none"' in audit_page.render([], 0, {}, verdict=None)


def test_config_diff_and_sync() -> None:
    d = config_page.diff("a: 1\nb: <x>\n", "a: 2\nb: <x>\n", "old", "new")
    assert '<span class="del">-a: 1</span>' in d and '<span class="add">+a: 2</span>' in d and "&lt;x&gt;" in d
    st = {"version": "v2", "envoy": {"streams": [{"version": "v2"}]}, "workers": [{"version": "v2"}, {"version": "v1"}]}
    assert not config_page.in_sync(st)
    st["workers"][1]["version"] = "v2"
    assert config_page.in_sync(st)


def test_histogram_quantiles_as_prometheus_computes_them() -> None:
    samples = [("h_bucket", {"cluster": "a", "model": "m", "le": "0.1"}, 50.0),
               ("h_bucket", {"cluster": "a", "model": "m", "le": "1"}, 90.0),
               ("h_bucket", {"cluster": "a", "model": "m", "le": "+Inf"}, 100.0),
               ("h_count", {"cluster": "a", "model": "m"}, 100.0)]
    b = models_page.histograms(samples, "h")["a"]
    assert models_page.quantile(b, 0.5) == 0.1
    assert models_page.quantile(b, 0.7) == 0.1 + 0.9 * 0.5
    assert models_page.quantile(b, 0.99) == 1.0  # in +Inf: the highest finite bound
    assert models_page.quantile([(1.0, 0.0), (float("inf"), 0.0)], 0.5) is None


def test_limits_page_draws_the_frontier_with_its_pick() -> None:
    tuned = {"unit": "requests", "keys": [{"key": "demo", "requests": 5, "peak_1s": 2, "rate": 1.0, "burst": 2,
                                           "rejected": 0, "how": "knee"}], "notes": []}
    html = limits_page.render({"backend": "memory", "buckets": [{"key": "tenant:demo:requests", "unit": "requests",
                                                                  "rate": 1, "burst": 4, "level": 1,
                                                                  "refusals": 2, "last_refusal_s_ago": 0.5}]},
                              tuned, {"demo": [(1.0, 2.0), (2.0, 1.0)]}, {})
    assert "<polyline" in html and "pick 1/s, 2" in html and "25%" in html and "0.5 s ago" in html


def test_replica_readings_in_one_cell() -> None:
    cell = models_page.replica_summary([{"in_flight": 1, "waiting": 2, "running": 3, "kv_usage": 0.4},
                                        {"in_flight": 0, "held_seconds": 1.0}])
    assert cell == "2 replicas (1 read); waiting 2, running 3; KV 40% max; 1 held after a failure"
    assert models_page.replica_summary([]) == "-"
