"""The console's only assets, served by the gateway itself at `/console/static/` (no CDN, nothing
fetched at run time); the Content-Security-Policy lets the pages load nothing else."""

from __future__ import annotations

CSS = """
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --accent: #2457c5; --bad: #b42318; --ok: #067647; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); background: #f6f7f9; }
nav { display: flex; gap: 16px; align-items: center; padding: 10px 20px; background: #fff; border-bottom: 1px solid var(--line); }
nav a { color: var(--muted); text-decoration: none; padding: 4px 2px; }
nav a.active { color: var(--accent); border-bottom: 2px solid var(--accent); }
nav form { margin-left: auto; }
main { padding: 16px 24px; max-width: 1200px; }
h1 { font-size: 20px; margin: 4px 0 16px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
table { border-collapse: collapse; background: #fff; width: 100%; margin: 8px 0 16px; }
th, td { border: 1px solid var(--line); padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #eef1f6; font-weight: 600; }
form { display: flex; flex-wrap: wrap; gap: 8px 12px; align-items: flex-end; margin: 8px 0; }
form.inline { display: inline-flex; margin: 0; }
label { display: flex; flex-direction: column; font-size: 12px; color: var(--muted); }
input, select, textarea { font: inherit; padding: 4px 6px; border: 1px solid var(--line); border-radius: 4px; background: #fff; }
textarea { font-family: ui-monospace, monospace; font-size: 12px; width: 100%; min-width: 720px; }
button { font: inherit; padding: 5px 12px; border: 1px solid var(--accent); background: var(--accent); color: #fff; border-radius: 4px; cursor: pointer; }
button.secondary { background: #fff; color: var(--accent); }
.notice { padding: 8px 12px; border-radius: 4px; background: #ecfdf3; border: 1px solid #abefc6; }
.notice.bad { background: #fef3f2; border-color: #fecdca; color: var(--bad); }
.secret { font-family: ui-monospace, monospace; font-size: 15px; padding: 8px; background: #fffaeb; border: 1px solid #fedf89; }
.empty { color: var(--muted); }
.bad { color: var(--bad); } .ok { color: var(--ok); }
pre { background: #fff; border: 1px solid var(--line); padding: 8px; overflow: auto; font-size: 12px; }
pre .add { color: var(--ok); } pre .del { color: var(--bad); }
svg.chart { background: #fff; border: 1px solid var(--line); font-size: 11px; }
svg.chart rect { fill: var(--accent); } svg.chart text { fill: var(--fg); }
svg.chart polyline { fill: none; stroke: var(--accent); stroke-width: 2; }
svg.chart line { stroke: var(--muted); } svg.chart circle { fill: var(--bad); }
.login { max-width: 420px; margin: 80px auto; background: #fff; padding: 24px; border: 1px solid var(--line); border-radius: 6px; }
.login form { flex-direction: column; align-items: stretch; }
"""

JS = """
// Confirm destructive actions; copy a shown-once secret. No other script runs on these pages.
document.addEventListener('submit', function (e) {
  var msg = e.target.getAttribute('data-confirm');
  if (msg && !window.confirm(msg)) { e.preventDefault(); }
});
document.addEventListener('click', function (e) {
  var id = e.target.getAttribute && e.target.getAttribute('data-copy');
  if (id && navigator.clipboard) { navigator.clipboard.writeText(document.getElementById(id).textContent); }
});
"""

FILES: dict[str, tuple[str, bytes]] = {
    "console.css": ("text/css; charset=utf-8", CSS.encode()),
    "console.js": ("text/javascript; charset=utf-8", JS.encode()),
}

# Only what the gateway serves itself; no inline script, no framing, forms post back here only.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
