"""HTML pieces, pure: every value goes through `esc` unless it is `Safe` (markup this package built),
so a key name, tenant or model with markup shows as text."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

ROOT = "/console"
PAGES = (("keys", "Keys"), ("spend", "Spend"), ("models", "Models"), ("limits", "Limits"),
         ("config", "Config"), ("audit", "Audit"))


class Safe(str):
    """Markup built here from escaped parts: not escaped again."""

    __slots__ = ()


def esc(value: object) -> Safe:
    if isinstance(value, Safe):
        return value
    return Safe(html.escape("" if value is None else str(value), quote=True))


def join(parts: Iterable[object]) -> Safe:
    return Safe("".join(esc(p) for p in parts))


def tag(name: str, content: object = "", **attrs: object) -> Safe:
    """<name attrs>content</name>; attribute names `class_`/`for_` lose the underscore, None drops one."""
    attr = "".join(f' {k.rstrip("_").replace("_", "-")}="{esc(v)}"' for k, v in attrs.items()
                   if v is not None and v is not False)
    if isinstance(content, (list, tuple)):
        content = join(content)
    return Safe(f"<{name}{attr}>{esc(content)}</{name}>")


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, id_: str | None = None,
          empty: str = "nothing yet") -> Safe:
    head = join(tag("th", h) for h in headers)
    body = [join(tag("td", c) for c in row) for row in rows]
    if not body:
        return tag("p", empty, class_="empty")
    return tag("table", [tag("thead", tag("tr", head)), tag("tbody", join(tag("tr", r) for r in body))], id=id_)


def csrf_field(token: str) -> Safe:
    return Safe(f'<input type="hidden" name="csrf" value="{esc(token)}">')


def form(action: str, fields: Iterable[object], submit: str, token: str, *, id_: str | None = None,
         method: str = "post", confirm: str | None = None) -> Safe:
    parts = [csrf_field(token) if method == "post" else "", *fields,
             Safe(f'<button type="submit">{esc(submit)}</button>')]
    return tag("form", list(parts), method=method, action=action, id=id_, data_confirm=confirm)


def field(label: str, name: str, *, value: object = "", type_: str = "text", placeholder: str = "",
          required: bool = False) -> Safe:
    inp = Safe(f'<input type="{esc(type_)}" name="{esc(name)}" id="f-{esc(name)}" value="{esc(value)}"'
               f' placeholder="{esc(placeholder)}"{" required" if required else ""}>')
    return tag("label", [label, inp], for_=f"f-{name}")


def select(label: str, name: str, options: Iterable[str | tuple[str, str]], selected: str = "") -> Safe:
    """Options as values, or (value, label) pairs."""
    pairs = [(o, o) if isinstance(o, str) else o for o in options]
    opts = join(tag("option", text, value=v, selected="selected" if v == selected else None) for v, text in pairs)
    return tag("label", [label, Safe(f'<select name="{esc(name)}" id="f-{esc(name)}">{opts}</select>')])


def textarea(label: str, name: str, value: str, rows: int = 20) -> Safe:
    return tag("label", [label, Safe(f'<textarea name="{esc(name)}" id="f-{esc(name)}" rows="{rows}"'
                                     f' spellcheck="false">{esc(value)}</textarea>')])


def notice(text: str | None, kind: str = "ok") -> Safe:
    return tag("p", text, class_=f"notice {kind}", role="status") if text else Safe("")


def bar_chart(points: Sequence[tuple[str, float]], *, unit: str = "", width: int = 560, id_: str | None = None) -> Safe:
    """Horizontal bars, one per label, inline SVG (no script, no network)."""
    if not points:
        return Safe("")
    top = max((v for _, v in points), default=0.0) or 1.0
    row_h, label_w = 22, 180
    height = row_h * len(points) + 4
    bars = []
    for i, (label, value) in enumerate(points):
        y = i * row_h + 2
        w = max(1.0, (width - label_w - 90) * (value / top))
        bars.append(Safe(
            f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{esc(label[:28])}</text>'
            f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" rx="2"></rect>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 15}">{esc(_num(value))}{esc(unit)}</text>'))
    return Safe(f'<svg class="chart" role="img" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
                f'{_id(id_)}>{join(bars)}</svg>')


def line_chart(points: Sequence[tuple[float, float]], *, x_label: str, y_label: str, width: int = 560,
               height: int = 240, marks: Sequence[tuple[float, float, str]] = (), id_: str | None = None) -> Safe:
    """A polyline over (x, y) points with labelled marks, inline SVG."""
    if not points:
        return Safe("")
    xs = [p[0] for p in points] + [m[0] for m in marks]
    ys = [p[1] for p in points] + [m[1] for m in marks]
    x0, x1, y0, y1 = min(xs), max(xs), min(0.0, min(ys)), max(ys)
    pad = 40

    def sx(x: float) -> float:
        return pad + (width - 2 * pad) * ((x - x0) / ((x1 - x0) or 1.0))

    def sy(y: float) -> float:
        return height - pad - (height - 2 * pad) * ((y - y0) / ((y1 - y0) or 1.0))

    line = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in points)
    dots = join(Safe(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4"></circle>'
                     f'<text x="{sx(x) + 6:.1f}" y="{sy(y) - 6:.1f}">{esc(label)}</text>') for x, y, label in marks)
    axes = Safe(f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}"></line>'
                f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}"></line>'
                f'<text x="{width / 2:.0f}" y="{height - 8}" text-anchor="middle">{esc(x_label)}</text>'
                f'<text x="12" y="{height / 2:.0f}" transform="rotate(-90 12 {height / 2:.0f})"'
                f' text-anchor="middle">{esc(y_label)}</text>'
                f'<text x="{pad}" y="{height - pad + 14}">{esc(_num(x0))}</text>'
                f'<text x="{width - pad}" y="{height - pad + 14}" text-anchor="end">{esc(_num(x1))}</text>'
                f'<text x="{pad - 4}" y="{pad}" text-anchor="end">{esc(_num(y1))}</text>')
    return Safe(f'<svg class="chart line" role="img" width="{width}" height="{height}"'
                f' viewBox="0 0 {width} {height}"{_id(id_)}>{axes}<polyline points="{line}"></polyline>{dots}</svg>')


def _id(id_: str | None) -> str:
    return f' id="{esc(id_)}"' if id_ else ""


def _num(v: float) -> str:
    if v == int(v) and abs(v) < 1e12:
        return f"{int(v):,}"
    return f"{v:,.4f}".rstrip("0").rstrip(".") if abs(v) < 1 else f"{v:,.2f}"


def page(title: str, active: str, body: Safe, *, signed_in: bool = True, token: str = "") -> Safe:
    """The whole document: the nav, the page's body, the console's own CSS and JS."""
    nav = Safe("")
    if signed_in:
        links = join(tag("a", label, href=f"{ROOT}/{slug}", class_="active" if slug == active else None)
                     for slug, label in PAGES)
        out = form(f"{ROOT}/logout", [], "Sign out", token, id_="logout")
        nav = tag("nav", [tag("strong", "Modelyard"), links, out])
    return Safe(
        "<!doctype html>"
        f'<html lang="en"><head><meta charset="utf-8"><title>{esc(title)} · Modelyard console</title>'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<link rel="stylesheet" href="{ROOT}/static/console.css"></head>'
        f'<body>{nav}<main><h1>{esc(title)}</h1>{body}</main>'
        f'<script src="{ROOT}/static/console.js"></script></body></html>')
