"""One self-contained HTML page: inline CSS and SVG charts, no scripts, no network assets.

Mail clients and air-gapped clusters open it as is. Charts are drawn here as SVG polylines
(GPU-hours and mean queue wait per class over time) so there is no charting dependency.
"""

from __future__ import annotations

from html import escape
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.audit.render_text import CLASS_COLUMNS, _extra_tables, class_rows, duration

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]
_W, _H, _PAD_L, _PAD_B, _PAD_T = 720, 230, 56, 36, 14

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#222;max-width:1000px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:26px 0 8px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:6px 0} td,th{padding:3px 10px;border-bottom:1px solid #eee;
text-align:right} td:first-child,th:first-child{text-align:left} th{background:#f6f6f6}
.f{margin:6px 0;padding:6px 10px;border-left:4px solid #999;background:#fafafa}
.error{border-color:#d62728}.warning{border-color:#ff9f1a}.info{border-color:#1f77b4}
.sev{font-weight:600;text-transform:uppercase;font-size:12px;margin-right:6px}
.muted{color:#666;font-size:12px} pre{background:#f6f6f6;padding:8px;white-space:pre-wrap}
.ok{color:#2ca02c;font-weight:600} .bad{color:#d62728;font-weight:600}
"""


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    mag = 10 ** len(str(int(v))) / 10
    for step in (1, 2, 2.5, 5, 10):
        if v <= step * mag:
            return step * mag
    return 10 * mag


def line_chart(title: str, times: List[str], series: Dict[str, List[Optional[float]]],
               fmt: Any = lambda v: f"{v:g}") -> str:
    """An SVG chart: one polyline per series over ``times`` (labels of the x positions)."""
    values = [v for vs in series.values() for v in vs if v is not None]
    if not times or not values:
        return f"<p class=muted>{escape(title)}: no data</p>"
    top = _nice_max(max(values))
    pw, ph = _W - _PAD_L - 10, _H - _PAD_B - _PAD_T
    step = pw / max(1, len(times) - 1)

    def xy(i: int, v: float) -> Tuple[float, float]:
        return _PAD_L + i * step, _PAD_T + ph - (v / top) * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H + 24}" '
             f'role="img" aria-label="{escape(title)}">']
    for k in range(5):  # grid and y labels
        y = _PAD_T + ph - ph * k / 4
        parts.append(f'<line x1="{_PAD_L}" y1="{y:.1f}" x2="{_W - 10}" y2="{y:.1f}" '
                     'stroke="#e5e5e5"/>')
        parts.append(f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" font-size="11" '
                     f'text-anchor="end" fill="#555">{escape(fmt(top * k / 4))}</text>')
    for i in sorted({0, len(times) - 1, *range(0, len(times), max(1, len(times) // 6))}):
        x, _ = xy(i, 0)
        parts.append(f'<text x="{x:.1f}" y="{_H - _PAD_B + 16}" font-size="11" '
                     f'text-anchor="middle" fill="#555">{escape(times[i][5:16])}</text>')
    for n, (name, vs) in enumerate(sorted(series.items())):
        color = PALETTE[n % len(PALETTE)]
        segments: List[List[str]] = [[]]
        for i, v in enumerate(vs):
            if v is None:
                segments.append([])
                continue
            x, y = xy(i, v)
            segments[-1].append(f"{x:.1f},{y:.1f}")
        for seg in segments:
            if len(seg) == 1:
                cx, cy = seg[0].split(",")
                parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{color}"/>')
            elif seg:
                parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" '
                             f'points="{" ".join(seg)}"/>')
        lx = _PAD_L + n * 120
        parts.append(f'<rect x="{lx}" y="{_H + 8}" width="12" height="12" fill="{color}"/>'
                     f'<text x="{lx + 16}" y="{_H + 18}" font-size="12">{escape(name)}</text>')
    parts.append("</svg>")
    return f"<h3>{escape(title)}</h3>" + "".join(parts)


def _series(report: Dict[str, Any], key: str) -> Tuple[List[str], Dict[str, List[Optional[float]]]]:
    points = report["series"]["points"]
    times = sorted({p["t"] for p in points})
    at = {t: i for i, t in enumerate(times)}
    out: Dict[str, List[Optional[float]]] = {}
    for p in points:
        vs = out.setdefault(p["class"], [None] * len(times))
        vs[at[p["t"]]] = p[key]
    if key == "gpu_hours":  # no start in a bucket means zero GPU-hours, not unknown
        out = {c: [v or 0.0 for v in vs] for c, vs in out.items()}
    return times, out


def render_html(report: Dict[str, Any]) -> str:
    win = report["window"]
    s = report["inputs"]["sacct"]
    bucket = duration(report["series"]["bucket_s"])
    findings = []
    for f in report["findings"]:
        subjects = ""
        if f["subjects"]:
            more = f" (+{f['count'] - len(f['subjects'])} more)" if f["count"] > len(
                f["subjects"]) else ""
            subjects = f"<div class=muted>concerns: {escape(', '.join(f['subjects']) + more)}</div>"
        fix = f"<div>fix: {escape(f['fix'])}</div>" if f["fix"] else ""
        findings.append(f'<div class="f {escape(f["severity"])}"><span class=sev>'
                        f'{escape(f["severity"])}</span><code>{escape(f["code"])}</code> '
                        f'{escape(f["message"])}{subjects}{fix}</div>')
    verdict = ('<span class=ok>clean</span>' if not report["findings"]
               else f'<span class=bad>{len(report["findings"])} finding(s)</span>')
    times, gpu = _series(report, "gpu_hours")
    _, wait = _series(report, "wait_mean_s")
    body = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<title>slurmiso audit</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>slurmiso audit: {verdict}</h1>",
        f"<div class=muted>generated {escape(str(report['generated']))}; window "
        f"{escape(str(win['since'] or 'all'))} .. {escape(str(win['until'] or 'now'))}; "
        f"sacct {escape(str(s['format']))} {s['records']} records"
        f"{', TRUNCATED' if s['truncated'] else ''}; journal records "
        f"{report['inputs']['journal_records']}</div>",
        "<h2>Findings</h2>", "".join(findings) or "<p class=ok>none</p>",
        "<h2>By class</h2>", _table(CLASS_COLUMNS, class_rows(report)),
        "<h2>Over time</h2>",
        line_chart(f"GPU-hours by class (per {bucket}, by start time)", times, gpu,
                   lambda v: f"{v:,.0f}" if v >= 10 else f"{v:.1f}"),
        line_chart(f"Mean queue wait by class (per {bucket})", times, wait,
                   lambda v: duration(v)),
    ]
    for title, header, rows in _extra_tables(report):
        body += [f"<h2>{escape(title)}</h2>", _table(header, rows)]
    body += ["<h2>Notes</h2><ul>"] + [f"<li>{escape(n)}</li>" for n in report["notes"]]
    body += ["</ul></body></html>"]
    return "\n".join(body) + "\n"
