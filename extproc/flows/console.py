"""The operator's console under `/console/` (docs/console.md): the thin HTTP shell. It checks the
session cookie and CSRF tokens, reads what each page shows through the parts the admin API and the
CLI use (the key store through `keys_admin.run_audited`, spend through `keys_admin.spend_rows`, the
audit log's `export`/`verify`, the control plane's apply and status), and hands plain data to the
pure pages in `console/`."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl

import aiohttp
import orjson
import yaml
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from budgets.periods import window
from budgets.report import BY, By, read_calls, spend_report
from console import audit_page, config_page, csrf, keys_page, limits_page, models_page, spend_page
from console.assets import CSP, FILES
from console.html import ROOT, Safe, notice, page, tag
from console.sessions import ConsoleSession
from contracts.config import parse_config
from contracts.errors import ConfigError, ModelyardError
from contracts.live_config import APPLIED_BY_HEADER, APPLY_PATH, STATUS_PATH, TEXT_PATH, TOKEN_ENV, config_version
from contracts.when import parse_when
from extproc import messages as msg
from extproc.context import RequestContext
from extproc.flows import keys_admin
from extproc.flows.body_answer import SelfAnswered
from extproc.gateway import Gateway
from extproc.key_admin import KeyAdmin
from extproc.replicas.explain import add_replica_picks
from extproc.routing.decision import RouteRequest
from extproc.routing.explain import explain, latency_states, queue_states
from extproc.telemetry.audit import KEY_ADMIN, AuditEvent, export, verify
from keys.db import StoreError, redacted
from keys.spec import spec_from_json
from ratelimit.status import snapshot
from ratelimit.tuning.frontier import auto_rates, sweep
from ratelimit.tuning.report import Run as TuneRun
from ratelimit.tuning.report import Span
from ratelimit.tuning.report import as_json as tune_json
from ratelimit.tuning.traces import TraceError, Unit
from ratelimit.tuning.traces import Window as TuneWindow
from ratelimit.tuning.traces import load as load_trace
from ratelimit.tuning.whatif import simulate

COOKIE = "modelyard_console"
APPLY_WAIT_S = 8.0  # under Envoy's ext_proc message timeout (10 s in the shipped environments)
_MAX_FORM = 1 << 20  # a config file pasted into the apply form fits; nothing else comes near it

Page = Callable[[Gateway, RequestContext, ConsoleSession], Awaitable[Safe]]


def matches(method: str, path: str) -> str | None:
    """"get" or "post" for a console URL (the POSTs carry a form body), else None."""
    if path != ROOT and not path.startswith(ROOT + "/"):
        return None
    return "post" if method == "POST" else "get"


# ------------------------------------------------------------------ answers

def _headers(ctx: RequestContext, content_type: str = "text/html; charset=utf-8") -> list[tuple[str, str]]:
    return [("content-type", content_type), ("cache-control", "no-store"), ("content-security-policy", CSP),
            ("x-frame-options", "DENY"), ("x-content-type-options", "nosniff"), ("referrer-policy", "no-referrer"),
            *ctx.task_headers()]


def _html(ctx: RequestContext, status: int, body: str, extra: list[tuple[str, str]] | None = None
          ) -> msg.ProcessingResponse:
    return msg.immediate(status, body.encode(), [*_headers(ctx), *(extra or [])])


def _redirect(ctx: RequestContext, to: str, extra: list[tuple[str, str]] | None = None) -> msg.ProcessingResponse:
    return msg.immediate(303, b"", [("location", to), ("cache-control", "no-store"), *ctx.task_headers(),
                                    *(extra or [])])


def _secure(ctx: RequestContext) -> bool:
    """TLS on the caller's side of Envoy: the cookie then never travels in clear."""
    return ctx.headers.get(":scheme") == "https" or ctx.headers.get("x-forwarded-proto") == "https"


def _cookie(ctx: RequestContext, value: str, max_age: int) -> tuple[str, str]:
    secure = "; Secure" if _secure(ctx) else ""
    return ("set-cookie", f"{COOKIE}={value}; Path={ROOT}; Max-Age={max_age}; HttpOnly; SameSite=Strict{secure}")


def _cookie_value(ctx: RequestContext) -> str | None:
    for part in ctx.headers.get("cookie", "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE and value:
            return value
    return None


def _admin(gw: Gateway) -> KeyAdmin:
    assert gw.key_admin is not None  # the session refuses the console without a key store
    return gw.key_admin


async def _session(gw: Gateway, ctx: RequestContext) -> ConsoleSession | None:
    cookie = _cookie_value(ctx)
    if cookie is None:
        return None
    sess = await _admin(gw).sessions(lambda s: s.find(cookie))
    if sess is None or gw.admin_keys.check_digest(sess.admin) is None:  # an admin key removed ends its sessions
        return None
    ctx.admin = sess.admin  # audit rows name the admin key that signed in
    return sess


def _login_page(ctx: RequestContext, status: int = 200, error: str | None = None) -> msg.ProcessingResponse:
    body = tag("div", [
        tag("h1", "Modelyard console"),
        notice(error, "bad"),
        tag("form", [
            tag("label", ["admin key", Safe('<input type="password" name="key" id="f-key" autocomplete="off"'
                                            ' required autofocus>')], for_="f-key"),
            Safe('<button type="submit" id="sign-in">Sign in</button>'),
        ], method="post", action=f"{ROOT}/login"),
        tag("p", "An admin key from keys.admin_keys (the demo's is in the README).", class_="empty"),
    ], class_="login")
    doc = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Sign in · Modelyard console</title>"
           f'<link rel="stylesheet" href="{ROOT}/static/console.css"></head><body>{body}</body></html>')
    return _html(ctx, status, doc)


# ------------------------------------------------------------------ GET

async def answer(gw: Gateway, ctx: RequestContext) -> msg.ProcessingResponse:
    """Every GET: the static assets and the sign-in page without a session, the rest only with one."""
    sub = ctx.path[len(ROOT):].strip("/")
    if sub.startswith("static/"):
        found = FILES.get(sub[len("static/"):])
        if found is None:
            return _html(ctx, 404, "not found")
        return msg.immediate(200, found[1], [*_headers(ctx, found[0])[:1], ("cache-control", "max-age=300"),
                                             ("x-content-type-options", "nosniff"), *ctx.task_headers()])
    if ctx.method not in ("GET", "HEAD"):
        return _html(ctx, 405, "method not allowed", [("allow", "GET, POST")])
    sess = await _session(gw, ctx)
    if sub == "login":
        return _redirect(ctx, f"{ROOT}/keys") if sess is not None else _login_page(ctx)
    if sess is None:
        return _redirect(ctx, f"{ROOT}/login")
    if sub == "":
        return _redirect(ctx, f"{ROOT}/keys")
    view = PAGES.get(sub)
    if view is None:
        return _html(ctx, 404, page("Not found", "", tag("p", f"No console page {sub!r}."),
                                    token=csrf.mint(sess.csrf_secret, time.time())))
    return await _render(gw, ctx, sess, sub, view)


async def _render(gw: Gateway, ctx: RequestContext, sess: ConsoleSession, slug: str, view: Page,
                  status: int = 200) -> msg.ProcessingResponse:
    try:
        body = await view(gw, ctx, sess)
    except ModelyardError as e:
        body = notice(e.message, "bad")
        status = e.status
    except StoreError as e:  # the key store's reads outside the admin API's path (the Spend page's budgets)
        body = notice(f"the key store cannot be reached: {redacted(str(e))}", "bad")
        status = 503
    title = dict(_TITLES).get(slug, slug)
    return _html(ctx, status, page(title, slug, body, token=csrf.mint(sess.csrf_secret, time.time())))


def _mint(sess: ConsoleSession) -> Callable[[], str]:
    return lambda: csrf.mint(sess.csrf_secret, time.time())


# ------------------------------------------------------------------ pages

async def keys_view(gw: Gateway, ctx: RequestContext, sess: ConsoleSession, *, shown: dict[str, Any] | None = None,
                    message: str | None = None, error: str | None = None) -> Safe:
    async def work(admin: KeyAdmin) -> tuple[int, Any, str]:
        recs = await admin.list(None)
        return 200, [r.view() for r in recs], "-"

    _, views = await keys_admin.run_audited(gw, ctx, "list", "", work)
    return keys_page.render(views, tenants=[t.name for t in gw.config.tenants],
                            models=[m.name for m in gw.config.models], mint=_mint(sess), shown=shown,
                            message=message, error=error)


async def _keys(gw: Gateway, ctx: RequestContext, sess: ConsoleSession) -> Safe:
    return await keys_view(gw, ctx, sess)


async def _spend(gw: Gateway, ctx: RequestContext, sess: ConsoleSession) -> Safe:
    by, since = ctx.query.get("by", "key"), ctx.query.get("since", "24h")
    if by not in BY:
        by = "key"
    try:
        rows = await keys_admin.spend_rows(gw, {"by": by, "since": since})
    except ModelyardError as e:
        return spend_page.render([], by=by, since=since, budgets=[], error=e.message)
    keys = [r.view() for r in await _admin(gw).list(None)]
    caps = {t.name: (t.budget.usd, t.budget.period) for t in gw.config.tenants if t.budget is not None}
    periods = {str(k.get("budget_period") or "month") for k in keys if k.get("budget_usd") is not None} | \
        {p for _, p in caps.values()}
    db = gw.config.extproc.metering_db or ""
    spent, resets = await asyncio.to_thread(_spent_per_period, db, sorted(periods), time.time())
    return spend_page.render(rows, by=by, since=since,
                             budgets=spend_page.budget_uses(keys, caps, spent, resets))


BUDGET_SCOPES: tuple[By, ...] = ("key", "tenant")


def _spent_per_period(db: str, periods: list[str], now: float) -> tuple[dict[tuple[str, str, str], float],
                                                                       dict[str, str]]:
    """In a thread: each budget period's spend so far by key and by tenant (`modelyard spend`'s reading)."""
    spent: dict[tuple[str, str, str], float] = {}
    resets: dict[str, str] = {}
    for period in periods:
        w = window(period, now)  # type: ignore[arg-type]
        resets[period] = w.iso_end()
        if not db:
            continue
        for by in BUDGET_SCOPES:
            for row in spend_report(read_calls([db], w.start), by, w.start):
                name = row.key_id if by == "key" else row.tenant
                if name:
                    spent[(by, name, period)] = row.spend_usd
    return spent, resets


async def _audit(gw: Gateway, ctx: RequestContext, sess: ConsoleSession) -> Safe:
    q = ctx.query
    if gw.audit is None:
        return audit_page.render([], 0, q, verdict=None, error="no audit log: set extproc.audit_db")
    try:
        since = q.get("since", audit_page.DEFAULT_SINCE)
        search = audit_page.Search(
            since=parse_when(since) if since else None,
            until=parse_when(q["until"]) if q.get("until") else None,
            tenant=q.get("tenant", "").strip(), key=q.get("key", "").strip(), model=q.get("model", "").strip(),
            status=q.get("status", "").strip(), event=q.get("event", "").strip())
    except ValueError as e:
        return audit_page.render([], 0, q, verdict=None, error=f"{e}: expected 7d, 12h, 30m or an ISO date")
    path = gw.audit.path

    def read() -> tuple[list[Any], int, tuple[bool, str] | None]:
        lines = export(path, since=search.since, tenant=search.tenant or None, event=search.event or None)
        rows, matched = audit_page.newest((orjson.loads(line) for line in lines), search)
        if not q.get("verify"):
            return rows, matched, None
        report = verify(path)
        verdict = (True, f"{report.rows} rows intact (from row {report.first_id}); head {report.head[:16]}") \
            if report.intact else (False, f"BROKEN at {report.broken}")
        return rows, matched, verdict

    rows, matched, verdict = await asyncio.to_thread(read)
    return audit_page.render(rows, matched, q, verdict=verdict)


def _cp_url(gw: Gateway, path: str) -> str | None:
    cp = gw.config.controlplane
    return f"http://{cp.api_address}{path}" if cp.enabled else None


async def _cp_get(gw: Gateway, path: str) -> dict[str, Any]:
    url = _cp_url(gw, path)
    assert url is not None
    async with aiohttp.ClientSession() as http, \
            http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
        if resp.status != 200:
            raise ValueError(f"{path} answered {resp.status}")
        doc = await resp.json(content_type=None)
    if not isinstance(doc, dict):
        raise ValueError(f"{path} answered {type(doc).__name__}")
    return doc


async def config_view(gw: Gateway, ctx: RequestContext, sess: ConsoleSession, *, draft: str | None = None,
                      message: str | None = None, error: str | None = None) -> Safe:
    if _cp_url(gw, "") is None:
        return config_page.render(None, None, mint=_mint(sess), unavailable=(
            "No control plane (controlplane.enabled is off): this gateway reads its config file at start and on "
            "SIGHUP; the console applies configs through a control plane only."))
    try:
        status, text = await asyncio.gather(_cp_get(gw, STATUS_PATH), _cp_get(gw, TEXT_PATH))
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
        return config_page.render(None, None, mint=_mint(sess), message=message, error=error,
                                  unavailable=f"the control plane does not answer: {e}")
    return config_page.render(status, text, mint=_mint(sess), draft=draft, message=message, error=error)


async def _config(gw: Gateway, ctx: RequestContext, sess: ConsoleSession) -> Safe:
    return await config_view(gw, ctx, sess)


def _metrics_samples() -> tuple[str, list[tuple[str, dict[str, str], float]]]:
    """In a thread: this worker's own /metrics text (what `route explain --live` reads) and its samples."""
    text = generate_latest(REGISTRY).decode("utf-8", "replace")
    return text, [(s.name, dict(s.labels), float(s.value)) for fam in text_string_to_metric_families(text)
                  for s in fam.samples]


async def _models(gw: Gateway, ctx: RequestContext, sess: ConsoleSession) -> Safe:
    cfg, q = gw.config, ctx.query
    text, samples = await asyncio.to_thread(_metrics_samples)
    queues = queue_states(cfg, text)
    durations = models_page.histograms(samples, "modelyard_request_duration_seconds")
    ttfts = models_page.histograms(samples, "modelyard_time_to_first_token_seconds")
    states = gw.dispatcher.deployment_states()
    stats = dict(gw.dispatcher.scheduler.feedback.stats)
    readings = gw.watermarks.readings if gw.watermarks is not None else {}
    replicas: dict[str, list[Mapping[str, float]]] = {}
    for cluster, _, fields, _ in (gw.replicas.states() if gw.replicas is not None else ()):
        replicas.setdefault(cluster, []).append(fields)
    rows = []
    for m in cfg.models:
        for d in m.deployments:
            c = d.cluster
            qs, st, reading = queues.get(c), stats.get(c), readings.get(c)
            rows.append(models_page.DeploymentRow(
                model=m.name, cluster=c, protocol=d.protocol, state=states.get(c, "-"),
                reading=f"watermark {reading.watermark:.2f} ({reading.source})" if reading is not None
                else models_page.replica_summary(replicas.get(c, [])),
                waiting=None if qs is None else sum(qs.waiting.values()), inflight=None if qs is None else qs.inflight,
                max_inflight=None if qs is None else qs.max_inflight, requests=0 if st is None else st.requests,
                error_rate=0.0 if st is None else st.error_rate,
                p50_ms=models_page.ms(models_page.quantile(durations.get(c, []), 0.5)),
                p99_ms=models_page.ms(models_page.quantile(durations.get(c, []), 0.99)),
                ttft_ms=models_page.ms(models_page.quantile(ttfts.get(c, []), 0.5))))
    explained, error = None, None
    if q.get("explain"):
        tenant = next((t for t in cfg.tenants if t.name == q.get("tenant")), None)
        try:
            prompt = max(0, int(q.get("prompt_tokens") or 0))
            output = int(q["output_tokens"]) if q.get("output_tokens") else None
        except ValueError:
            tenant, error = None, "token counts are whole numbers"
        if tenant is None:
            error = error or f"no tenant {q.get('tenant')!r}"
        else:
            now = time.monotonic()
            req = RouteRequest(model=q.get("model") or "auto", tenant=tenant, strategy_override=None,
                               want_fast=q.get("fast") == "yes", est_prompt_tokens=prompt, est_output_tokens=output,
                               needs_tools=q.get("tools") == "yes", needs_vision=False, stream=q.get("stream") == "yes",
                               task_type="chat", task_id="console-explain")
            explained = explain(gw.dispatcher.scheduler, req, now, readings, queues, latency_states(cfg, text))
            add_replica_picks(cfg, explained, text, now)
    return models_page.render(rows, tenants=[t.name for t in cfg.tenants], models=[m.name for m in cfg.models],
                              query=q, explained=explained, worker=f"worker pid {os.getpid()}", error=error)


async def _limits(gw: Gateway, ctx: RequestContext, sess: ConsoleSession) -> Safe:
    q, limiter = ctx.query, gw.dispatcher.limiter
    status = await snapshot(limiter, 60.0) if limiter is not None else None
    tuned, tune_error = None, None
    curves: dict[str, list[tuple[float, float]]] = {}
    if q.get("tune"):
        try:
            tuned, curves = await asyncio.to_thread(_tune, gw, q)
        except (ValueError, OSError, TraceError, sqlite3.Error) as e:
            tune_error = str(e)
    return limits_page.render(status, tuned, curves, q, error=None if limiter is not None else
                              "rate limiting is off in this config", tune_error=tune_error)


def _tune(gw: Gateway, q: dict[str, str]) -> tuple[dict[str, Any], dict[str, list[tuple[float, float]]]]:
    """In a thread: `modelyard ratelimit tune --metering-db` over this host's store, with the running
    config's limits as the what-if (the tuner's own functions, its defaults)."""
    db = gw.config.extproc.metering_db
    if not db:
        raise ValueError("the tuner replays extproc.metering_db: this gateway meters nothing")
    key = q.get("key", "tenant")
    unit: Unit = "tokens" if q.get("unit") == "tokens" else "requests"
    if key not in limits_page.KEYS:
        raise ValueError(f"one bucket per {key!r}: expected one of {', '.join(limits_page.KEYS)}")
    target = float(q.get("target") or 0.01)
    if not 0 <= target < 1:
        raise ValueError("target must be in [0, 1)")
    now, since_arg = time.time(), q.get("since") or "7d"
    window = TuneWindow(parse_when(since_arg, now), now)
    trace = load_trace(Path(db), "metering", key, unit, window)
    series = trace.series(key, unit) if len(trace) else {}
    frontiers = [sweep(v, series[v], auto_rates(series[v], 12), target) for v in sorted(series)]
    run = TuneRun(Path(db).name, key, unit, target, None, frontiers, series, span=Span(window, since_arg, None))
    if len(trace):
        run.current = simulate(trace, gw.config.ratelimit, key)
    curves = {f.key: [(p.rate, float(p.burst)) for p in f.points if p.burst is not None] for f in frontiers}
    return tune_json(run), curves


_TITLES = (("keys", "Keys"), ("spend", "Spend"), ("models", "Models and deployments"), ("limits", "Limits"),
           ("config", "Config"), ("audit", "Audit"))
PAGES: dict[str, Page] = {"keys": _keys, "spend": _spend, "models": _models, "limits": _limits, "config": _config,
                          "audit": _audit}


# ------------------------------------------------------------------ POST

class ConsoleFlow(SelfAnswered):
    """Every POST: a form body. Sign-in needs the admin key; every other change needs the session and
    a CSRF token minted for it and never spent before."""

    async def request_body(self, body: bytes) -> msg.ProcessingResponse:
        gw, ctx = self.gw, self.ctx
        if len(body) > _MAX_FORM:
            return _html(ctx, 413, "form too large")
        fields = dict(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
        sub = ctx.path[len(ROOT):].strip("/")
        if sub == "login":
            return await _login(gw, ctx, fields.get("key", ""))
        sess = await _session(gw, ctx)
        if sess is None:
            return _html(ctx, 401, "sign in first")
        refusal = await _spend_token(gw, sess, fields.get("csrf", ""))
        if refusal is not None:
            _admin(gw).audited(ctx, "csrf", 403, reason=refusal)
            return _html(ctx, 403, page("Refused", "", notice(refusal, "bad"), token=_mint(sess)()))
        if sub == "logout":
            cookie = _cookie_value(ctx) or ""
            await _admin(gw).sessions(lambda s: s.close(cookie))
            _admin(gw).audited(ctx, "logout", 200)
            return _redirect(ctx, f"{ROOT}/login", [_cookie(ctx, "", 0)])
        action = ACTIONS.get(_action_name(sub))
        if action is None:
            return _html(ctx, 404, page("Not found", "", tag("p", f"No console action {sub!r}."), token=_mint(sess)()))
        slug, run = action
        return await _render(gw, ctx, sess, slug, lambda g, c, s: run(g, c, s, sub, fields))


def _action_name(sub: str) -> str:
    """keys/key_0123/rotate -> keys/*/rotate: the id is the action's argument."""
    parts = sub.split("/")
    if len(parts) == 3 and parts[0] == "keys":
        return f"keys/*/{parts[2]}"
    return sub


async def _spend_token(gw: Gateway, sess: ConsoleSession, token: str) -> str | None:
    now = time.time()
    why = csrf.check(sess.csrf_secret, token, now)
    if why is not None:
        return why
    nonce = csrf.nonce_of(token)
    first = await _admin(gw).sessions(lambda s: s.spend(nonce, now + csrf.MAX_AGE_S + 60))
    return None if first else "CSRF token already used: reload the page and try again"


async def _login(gw: Gateway, ctx: RequestContext, key: str) -> msg.ProcessingResponse:
    admin = _admin(gw)
    digest = gw.admin_keys.check(key)  # every configured digest, compared in constant time
    if digest is None:
        if admin.audit is not None:  # the row the admin API writes for a refused admin key
            admin.audit.record(AuditEvent(
                event=KEY_ADMIN, time=time.time(), task_id=ctx.task_id, key_id="", client=ctx.client,
                method=ctx.method, path=ctx.path, status=401,
                detail={"op": "auth", "reason": "not an admin key" if key else "missing admin key"}))
        return _login_page(ctx, 401, "Not an admin key.")
    ttl = gw.config.console.session_ttl_s
    cookie, _ = await admin.sessions(lambda s: s.open(digest, ttl))
    ctx.admin = digest
    admin.audited(ctx, "login", 200)
    return _redirect(ctx, f"{ROOT}/keys", [_cookie(ctx, cookie, int(ttl))])


Action = Callable[[Gateway, RequestContext, ConsoleSession, str, dict[str, str]], Awaitable[Safe]]


async def _create_key(gw: Gateway, ctx: RequestContext, sess: ConsoleSession, sub: str,
                      fields: dict[str, str]) -> Safe:
    async def work(admin: KeyAdmin) -> tuple[int, Any, str]:
        spec = spec_from_json(admin.config, keys_page.create_body(fields))
        rec, secret = await admin.create(spec)
        return 201, {**rec.view(), "key": secret}, rec.tenant

    try:
        _, shown = await keys_admin.run_audited(gw, ctx, "create", "", work)
    except ModelyardError as e:
        return await keys_view(gw, ctx, sess, error=f"Not created: {e.message}")
    return await keys_view(gw, ctx, sess, shown=shown, message=f"Created {shown['id']}.")


async def _key_op(gw: Gateway, ctx: RequestContext, sess: ConsoleSession, sub: str, fields: dict[str, str]) -> Safe:
    _, key_id, op = sub.split("/")

    async def work(admin: KeyAdmin) -> tuple[int, Any, str]:
        if op == "update":
            return await keys_admin.update_key(admin, key_id, keys_page.update_body(fields))
        if op == "rotate":
            rec, secret = await admin.rotate(key_id)
            return 200, {**rec.view(), "key": secret}, rec.tenant
        rec = await admin.revoke(key_id)
        return 200, rec.view(), rec.tenant

    try:
        _, view = await keys_admin.run_audited(gw, ctx, op, key_id, work)
    except ModelyardError as e:
        return await keys_view(gw, ctx, sess, error=f"Not {op.removesuffix('e')}ed: {e.message}")
    if op == "rotate":
        return await keys_view(gw, ctx, sess, shown=view, message=f"Rotated {key_id}: the old secret stopped.")
    if op == "update":
        return await keys_view(gw, ctx, sess, message=f"Updated {key_id}: every worker has it within a refresh.")
    return await keys_view(gw, ctx, sess, message=f"Revoked {key_id}.")


async def _apply(gw: Gateway, ctx: RequestContext, sess: ConsoleSession, sub: str, fields: dict[str, str]) -> Safe:
    """`modelyard apply` from the page: validated here with the loader every command uses, then by the
    control plane, which answers once Envoy and every worker run it. Audited as a `key_admin` row."""
    admin, text = _admin(gw), fields.get("yaml", "").replace("\r\n", "\n")
    url = _cp_url(gw, APPLY_PATH)
    if url is None:
        return await config_view(gw, ctx, sess, draft=text, error="no control plane to apply through")
    try:
        parse_config(yaml.safe_load(text), "the console's config")
    except (ConfigError, yaml.YAMLError) as e:
        admin.audited(ctx, "apply", 400, reason=str(e))
        return await config_view(gw, ctx, sess, draft=text, error=f"Refused, nothing changed: {e}")
    except (AttributeError, TypeError):
        admin.audited(ctx, "apply", 400, reason="not a YAML mapping")
        return await config_view(gw, ctx, sess, draft=text, error="Refused, nothing changed: not a YAML mapping")
    who = f"console:{sess.admin[:12]}@{ctx.client or '?'}"
    job = asyncio.ensure_future(_post_apply(url, text.encode(), who))
    # An apply waits for Envoy and every worker (up to the control plane's timeout); the page waits a few
    # seconds of Envoy's message timeout, then shows the status while the apply finishes and audits itself.
    done, _ = await asyncio.wait({job}, timeout=APPLY_WAIT_S)
    if not done:
        job.add_done_callback(lambda j: _audit_apply(admin, ctx, j))
        return await config_view(gw, ctx, sess, message=f"Applying {config_version(text.encode())}: "
                                 "the status below shows who runs it yet.")
    status, body = _audit_apply(admin, ctx, job)
    if status == 200:
        return await config_view(gw, ctx, sess, message=f"Applied version {body.get('version')}: Envoy and every "
                                 "worker run it." + (" (It was already running.)" if body.get("unchanged") else ""))
    return await config_view(gw, ctx, sess, draft=text, error=f"Not applied ({status}): {body.get('error', body)}")


async def _post_apply(url: str, text: bytes, who: str) -> tuple[int, dict[str, Any]]:
    headers = {"content-type": "application/yaml", APPLIED_BY_HEADER: who}
    if token := os.environ.get(TOKEN_ENV):
        headers["authorization"] = f"Bearer {token}"
    try:
        async with aiohttp.ClientSession() as http, \
                http.post(url, data=text, headers=headers, timeout=aiohttp.ClientTimeout(total=120)) as resp:
            doc = await resp.json(content_type=None)
            return resp.status, doc if isinstance(doc, dict) else {"error": str(doc)}
    except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
        return 503, {"error": f"the control plane does not answer: {e}"}


def _audit_apply(admin: KeyAdmin, ctx: RequestContext, job: asyncio.Future[tuple[int, dict[str, Any]]]
                 ) -> tuple[int, dict[str, Any]]:
    status, body = job.result() if not job.cancelled() else (503, {"error": "cancelled"})
    admin.audited(ctx, "apply", status, key_id=str(body.get("version", "")),
                  reason="" if status == 200 else str(body.get("error", "")))
    return status, body


ACTIONS: dict[str, tuple[str, Action]] = {
    "config": ("config", _apply),
    "keys": ("keys", _create_key),
    "keys/*/rotate": ("keys", _key_op),
    "keys/*/revoke": ("keys", _key_op),
    "keys/*/update": ("keys", _key_op),
}

