"""One self-contained HTML page: inline CSS and SVG charts, no scripts, no network assets.

Mail clients and air-gapped clusters open it as is. Charts are drawn here as SVG polylines
placed by time (a gap in the data is a gap in the line), so there is no charting dependency:
GPU-hours per class, pool use as a share of capacity, and queue waits on a log scale (waits of
seconds and of hours in one chart). Class colours follow the config's class order.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from html import escape
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from slurmiso.audit.render.text import (
    CLASS_COLUMNS,
    LADDER_TITLE,
    class_rows,
    duration,
    extra_tables,
    ladder_lines,
    ladder_tables,
    over_threshold,
    span_line,
)

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf"]
_W, _H, _PAD_L, _PAD_B, _PAD_T = 720, 230, 56, 36, 14

PAGE_CSS = """
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


def html_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return "<p class=muted>none</p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    mag: float = 10 ** math.floor(math.log10(v))  # an int where v >= 1, as before
    for step in (1, 2, 2.5, 5, 10):
        if v <= step * mag:
            return step * mag
    return 10 * mag


#: Log-axis ticks at durations people read: 1 s, 10 s, 1 min, 10 min, 1 h, 10 h, 1 d, 1 w.
_LOG_TICKS = (1.0, 10.0, 60.0, 600.0, 3600.0, 36000.0, 86400.0, 604800.0)
_TICK_LABEL = dict(zip(_LOG_TICKS, ("1s", "10s", "1m", "10m", "1h", "10h", "1d", "1w")))


def class_colours(report: Dict[str, Any]) -> Dict[str, str]:
    """One colour per class, fixed by the config's class order (the same in every report);
    classes outside the config (unclassified) get grey."""
    order = report.get("class_order") or sorted(report["classes"])
    colours = {name: PALETTE[i % len(PALETTE)] for i, name in enumerate(order)}
    for name in report["classes"]:
        colours.setdefault(name, "#7f7f7f")
    return colours


def _ts(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()


def _time_ticks(t0: float, t1: float, most: int = 6) -> List[Tuple[float, str]]:
    """Ticks at a round step (hours or days) so that at most ``most`` labels fit."""
    span = max(1.0, t1 - t0)
    for step in (3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400, 7 * 86400,
                 14 * 86400, 28 * 86400):
        if span / step <= most:
            break
    fmt = "%m-%d %H:%M" if step < 86400 else "%Y-%m-%d"
    ticks: List[Tuple[float, str]] = []
    t = float(math.ceil(t0 / step) * step)
    while t <= t1:
        ticks.append((t, datetime.fromtimestamp(t, timezone.utc).strftime(fmt)))
        t += step
    return ticks


def time_chart(title: str, series: Dict[str, List[Tuple[float, Optional[float]]]],
               colours: Dict[str, str], bucket_s: float, fmt: Any = lambda v: f"{v:g}",
               log: bool = False, top: Optional[float] = None) -> str:
    """An SVG chart with x placed by time: a bucket missing between two points breaks the
    line (the gap shows). ``log`` gives a log10 y axis, for values spanning decades."""
    values = [v for pts in series.values() for _, v in pts if v is not None and (v > 0 or not log)]
    times = [t for pts in series.values() for t, _ in pts]
    if not times or not values:
        return f"<h3>{escape(title)}</h3><p class=muted>no data</p>"
    t0, t1 = min(times), max(times) + bucket_s
    pw, ph = _W - _PAD_L - 16, _H - _PAD_B - _PAD_T
    yv, grid = _y_axis(values, ph, log, top)

    def xv(t: float) -> float:
        return _PAD_L + (t - t0) / (t1 - t0) * pw

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H + 30}" '
             f'role="img" aria-label="{escape(title)}">']
    parts += _grid(grid, pw, fmt)
    for t, label in _time_ticks(t0, t1):
        x = xv(t)
        anchor = "end" if x > _PAD_L + pw - 40 else "start" if x < _PAD_L + 40 else "middle"
        parts.append(f'<line x1="{x:.1f}" y1="{_PAD_T + ph}" x2="{x:.1f}" y2="{_PAD_T + ph + 4}" '
                     'stroke="#999"/>')
        parts.append(f'<text x="{x:.1f}" y="{_H - _PAD_B + 18}" font-size="11" '
                     f'text-anchor="{anchor}" fill="#555">{escape(label)}</text>')
    lx, ly = _PAD_L, _H + 12
    for name, pts in series.items():
        colour = colours.get(name, "#7f7f7f")
        parts += _lines(pts, colour, bucket_s, log, xv, yv)
        width = 22 + 7 * len(name)
        if lx + width > _W:
            lx, ly = _PAD_L, ly + 16
        parts.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colour}"/>'
                     f'<text x="{lx + 16}" y="{ly + 10}" font-size="12">{escape(name)}</text>')
        lx += width
    parts.append("</svg>")
    return f"<h3>{escape(title)}</h3>" + "".join(parts)


def _y_axis(values: List[float], ph: float, log: bool, top: Optional[float]
            ) -> Tuple[Callable[[float], float], List[Tuple[float, float]]]:
    """(value -> y, the grid's (y, value) lines) of a linear or log10 axis."""
    if log:
        lo_e = math.floor(math.log10(max(min(values) / 2, 0.1)))  # never on the bottom line
        hi_e = max(lo_e + 1, math.ceil(math.log10(max(values))))

        def log_y(v: float) -> float:
            e = math.log10(max(v, 10 ** lo_e))
            return _PAD_T + ph - (e - lo_e) / (hi_e - lo_e) * ph
        return log_y, [(log_y(v), v) for v in _LOG_TICKS if 10 ** lo_e <= v <= 10 ** hi_e]
    ymax = top if top is not None else nice_max(max(values))

    def lin_y(v: float) -> float:
        return _PAD_T + ph - (v / ymax) * ph
    return lin_y, [(lin_y(ymax * k / 5), ymax * k / 5) for k in range(6)]


def _grid(grid: List[Tuple[float, float]], pw: float, fmt: Any) -> List[str]:
    parts: List[str] = []
    last_y: Optional[float] = None
    for y, tick in grid:
        if last_y is not None and abs(last_y - y) < 14:
            continue  # too close to the last label to read
        last_y = y
        parts.append(f'<line x1="{_PAD_L}" y1="{y:.1f}" x2="{_PAD_L + pw}" y2="{y:.1f}" '
                     'stroke="#e5e5e5"/>')
        parts.append(f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" font-size="11" '
                     f'text-anchor="end" fill="#555">{escape(fmt(tick))}</text>')
    return parts


def _lines(pts: List[Tuple[float, Optional[float]]], colour: str, bucket_s: float, log: bool,
           xv: Callable[[float], float], yv: Callable[[float], float]) -> List[str]:
    """One series' polylines, broken where a value or a bucket is missing (a lone point:
    a dot)."""
    segments: List[List[str]] = [[]]
    last_t: Optional[float] = None
    for t, v in sorted(pts):
        if v is None or (log and v <= 0):
            segments.append([])
            last_t = None
            continue
        if last_t is not None and t - last_t > bucket_s * 1.5:
            segments.append([])  # a gap in time: no line across it
        segments[-1].append(f"{xv(t + bucket_s / 2):.1f},{yv(v):.1f}")
        last_t = t
    parts: List[str] = []
    for seg in segments:
        if len(seg) == 1:
            cx, cy = seg[0].split(",")
            parts.append(f'<circle cx="{cx}" cy="{cy}" r="3" fill="{colour}"/>')
        elif seg:
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                         f'points="{" ".join(seg)}"/>')
    return parts


def _points(report: Dict[str, Any], key: str, group: str = "class",
            section: str = "points") -> Dict[str, List[Tuple[float, Optional[float]]]]:
    out: Dict[str, List[Tuple[float, Optional[float]]]] = {}
    for p in report["series"].get(section, []):
        out.setdefault(p[group], []).append((_ts(p["t"]), p[key]))
    return out


def render_html(report: Dict[str, Any]) -> str:
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
    n_over = over_threshold(report)
    verdict = ('<span class=ok>clean</span>' if not n_over
               else f'<span class=bad>{n_over} finding(s) at or above '
                    f'{escape(report["severity_threshold"])}</span>')
    colours = class_colours(report)
    pools = {name: PALETTE[i % len(PALETTE)] for i, name in
             enumerate(sorted({p["pool"] for p in report["series"].get("pools", [])}))}
    bucket_s = float(report["series"]["bucket_s"])
    body = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<title>slurmiso audit</title>",
        f"<style>{PAGE_CSS}</style></head><body>",
        f"<h1>slurmiso audit: {verdict}</h1>",
        f"<div class=muted>generated {escape(str(report['generated']))}; "
        f"{escape(span_line(report))}; "
        f"sacct {escape(str(s['format']))} {s['records']} records"
        f"{', TRUNCATED' if s['truncated'] else ''}; journal records "
        f"{report['inputs']['journal_records']}</div>",
        f"<h2>Findings ({len(report['findings'])} in all, {n_over} at or above "
        f"{escape(report['severity_threshold'])})</h2>",
        "".join(findings) or "<p class=ok>none</p>",
        "<h2>By class</h2>", html_table(CLASS_COLUMNS, class_rows(report)),
        "<h2>Over time</h2>",
        time_chart(f"GPU-hours by class (per {bucket}, times UTC)", _points(report, "gpu_hours"),
                   colours, bucket_s, lambda v: f"{v:,.0f}" if v >= 10 else f"{v:.1f}"),
        time_chart(f"Pool use, share of GPU capacity (per {bucket})",
                   _points(report, "use_share", "pool", "pools"), pools, bucket_s,
                   lambda v: f"{v:.0%}", top=1.0),
        time_chart(f"Mean queue wait by class, log scale (per {bucket})",
                   _points(report, "wait_mean_s"), colours, bucket_s,
                   lambda v: _TICK_LABEL.get(v) or duration(v), log=True),
    ]
    for title, header, rows in extra_tables(report):
        body += [f"<h2>{escape(title)}</h2>", html_table(header, rows)]
    if report.get("ladder"):
        body += [f"<h2>{escape(LADDER_TITLE)}</h2>"]
        body += [f"<p class=muted>{escape(x)}</p>" for x in ladder_lines(report)]
        for title, header, rows in ladder_tables(report):
            body += [f"<h3>{escape(title)}</h3>", html_table(header, rows)]
    body += ["<h2>Notes</h2><ul>"] + [f"<li>{escape(n)}</li>" for n in report["notes"]]
    body += ["</ul></body></html>"]
    return "\n".join(body) + "\n"
