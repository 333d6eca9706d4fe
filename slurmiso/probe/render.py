"""The probe's report for people: a text table, and one self-contained HTML page.

The page has the audit report's look (its CSS and palette) and, per mode, the latency CDF of
inference beside training (solid) and alone (dashed), with the SLO's P99 target drawn across:
where a mode's solid line crosses 99% left of the target, it holds. Inline SVG, no scripts, no
external resources, so it opens from a mail or an air-gapped web server as is.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.audit.render.html import PAGE_CSS, PALETTE, html_table, nice_max
from slurmiso.audit.render.text import table

_W, _H, _PAD_L, _PAD_B, _PAD_T, _PAD_R = 720, 300, 56, 40, 14, 16

HEADER = ["MODE", "POOL", "REQS", "P50 ms", "P95 ms", "P99 ms", "P99 SOLO", "ERRORS",
          "STEP s", "SOLO s", "KEEPS", "PEAK", "ROOM", "TOOK"]


def _f(value: Optional[float], fmt: str = "{:g}") -> str:
    return "-" if value is None else fmt.format(value)


def mode_rows(report: Dict[str, Any]) -> List[List[str]]:
    rows = []
    for m in report["modes"]:
        if m.get("skipped"):
            what = "not measured (interrupted)" if m.get("invalid") else "skipped"
            rows.append([m["mode"], str(m.get("pool") or "-"), f"{what}: {m['skipped']}"]
                        + [""] * (len(HEADER) - 3))
            continue
        i, t, mem = m["infer"], m["train"], m.get("memory") or {}
        keeps = t.get("throughput_vs_solo")
        rows.append([
            m["mode"] + ("" if m.get("colocated") is not False else " (apart!)"),
            str(m.get("pool") or "-"), str(i["requests"]), _f(i["p50_ms"]), _f(i["p95_ms"]),
            _f(i["p99_ms"]), _f((m.get("infer_solo") or {}).get("p99_ms")),
            _f(i["error_rate"], "{:.2%}"), _f(t["step_s"]),
            _f((m.get("train_solo") or {}).get("step_s")), _f(keeps, "{:.0%}"),
            _f(mem.get("train_peak_mb"), "{:.0f} MiB")
            + (f" ({mem['train_peak_source']})" if mem.get("train_peak_source") else ""),
            _f(mem.get("train_headroom_pct"), "{:.0f}%")
            + (" LOW" if mem.get("headroom_ok") is False else ""),
            _f(m.get("seconds"), "{:.0f}s"),
        ])
    return rows


HOST_HEADER = ["MODE", "POOL", "RUN", "SCOPE", "CPU CORES", "CPU STALL", "MEMORY STALL",
               "IO STALL"]


def _pair(solo: Optional[float], mixed: Optional[float], fmt: str) -> str:
    """``alone -> beside training``."""
    return f"{_f(solo, fmt)} -> {_f(mixed, fmt)}"


def host_rows(report: Dict[str, Any]) -> List[List[str]]:
    """Per measured mode and run (inference, training): the host figures alone -> beside
    training (hostfigs.py); a scope of ``node`` means the node's pressure, not the job's."""
    rows = []
    for m in report["modes"]:
        for role in ("infer", "train"):
            h = (m.get("host") or {}).get(role) or {}
            solo, mixed = h.get("solo") or {}, h.get("mixed") or {}
            if m.get("skipped") or not (solo or mixed):
                continue
            scopes = {str(x["scope"]) for x in (solo, mixed) if x.get("scope")}
            row = [m["mode"], str(m.get("pool") or "-"), role, "/".join(sorted(scopes)) or "-",
                   _pair(solo.get("cpu_cores"), mixed.get("cpu_cores"), "{:.2f}")]
            for res in ("cpu", "memory", "io"):
                row.append(_pair((solo.get("stall") or {}).get(res),
                                 (mixed.get("stall") or {}).get(res), "{:.1%}"))
            rows.append(row)
    return rows


def _slo_line(report: Dict[str, Any]) -> str:
    slo = report.get("slo") or {}
    if slo.get("p99_ms") is None:
        return f"SLO: class {slo.get('class', '?')} has no P99 target"
    err = (f", errors <= {slo['max_error_rate']:.2%}" if slo.get("max_error_rate") is not None
           else "")
    return f"SLO: class {slo['class']} P99 <= {slo['p99_ms']:g} ms{err} ({slo.get('source')})"


def _heading(report: Dict[str, Any]) -> List[str]:
    w = report.get("workload") or {}
    return [
        f"slurmiso probe ({report['where']}, {report.get('host', '?')}, "
        f"{report.get('generated')}): workload {w.get('kind', '?')}"
        + (f" ({w['note']})" if w.get("note") else ""),
        f"GPUs: {report.get('gpus', '?')}",
        _slo_line(report),
    ]


def render_text(report: Dict[str, Any]) -> str:
    rec = report["recommendation"]
    lines = _heading(report) + ["", table(mode_rows(report), HEADER), ""]
    hosts = host_rows(report)
    if hosts:
        lines += ["host, alone -> beside training (CPU cores used; share of the run some task "
                  "stalled, PSI; scope node: the node's, not the job's):",
                  table(hosts, HOST_HEADER), ""]
    lines.append(f"recommendation: {rec['mode']}")
    lines.append(f"  why: {rec['why']}")
    for note in report.get("notes", []):
        lines.append(f"note: {note}")
    if report.get("saved"):
        lines.append(f"results: {report['saved']}")
    if report.get("textfile"):
        lines.append(f"metrics: {report['textfile']}")
    return "\n".join(lines) + "\n"


# -- HTML ------------------------------------------------------------------------------------


def _log_ticks(lo: float, hi: float) -> List[float]:
    out = []
    e = math.floor(math.log10(lo))
    while 10 ** e <= hi * 1.0001:
        for m in (1, 2, 5):
            v = m * 10 ** e
            if lo <= v <= hi:
                out.append(v)
        e += 1
    return out


def cdf_chart(series: Sequence[Tuple[str, str, List[List[float]], bool]],
              target_ms: Optional[float]) -> str:
    """SVG latency CDFs: ``series`` of (label, colour, [[ms, share]], dashed)."""
    values = [p[0] for _, _, pts, _ in series for p in pts if p[0] > 0]
    if not values:
        return "<p class=muted>no latencies</p>"
    if target_ms:
        values.append(target_ms)
    lo, hi = min(values), max(values)
    log_x = hi / max(lo, 1e-9) > 20
    pw, ph = _W - _PAD_L - _PAD_R, _H - _PAD_B - _PAD_T
    if log_x:
        x0, x1 = math.log10(lo / 1.2), math.log10(hi * 1.2)

        def xv(v: float) -> float:
            return _PAD_L + (math.log10(max(v, lo / 1.2)) - x0) / (x1 - x0) * pw
        ticks = _log_ticks(lo / 1.2, hi * 1.2)
    else:
        top = nice_max(hi)

        def xv(v: float) -> float:
            return _PAD_L + v / top * pw
        ticks = [top * k / 5 for k in range(6)]

    def yv(share: float) -> float:
        return _PAD_T + ph - share * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H + 24}" '
             'role="img" aria-label="inference latency CDF">']
    for share, label in ((0.0, "0%"), (0.5, "50%"), (0.9, "90%"), (0.99, "P99")):
        y = yv(share)
        parts.append(f'<line x1="{_PAD_L}" y1="{y:.1f}" x2="{_PAD_L + pw}" y2="{y:.1f}" '
                     f'stroke="{"#bbb" if share == 0.99 else "#e5e5e5"}"/>')
        parts.append(f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
                     f'fill="#555">{label}</text>')
    for v in ticks:
        x = xv(v)
        parts.append(f'<line x1="{x:.1f}" y1="{_PAD_T + ph}" x2="{x:.1f}" y2="{_PAD_T + ph + 4}" '
                     'stroke="#999"/>')
        parts.append(f'<text x="{x:.1f}" y="{_PAD_T + ph + 17}" font-size="11" '
                     f'text-anchor="middle" fill="#555">{v:g}</text>')
    parts.append(f'<text x="{_PAD_L + pw / 2:.0f}" y="{_PAD_T + ph + 33}" font-size="11" '
                 f'text-anchor="middle" fill="#555">latency, ms{" (log scale)" if log_x else ""}'
                 '</text>')
    if target_ms:
        x = xv(target_ms)
        parts.append(f'<line x1="{x:.1f}" y1="{_PAD_T}" x2="{x:.1f}" y2="{_PAD_T + ph}" '
                     'stroke="#d62728" stroke-dasharray="5,4"/>')
        parts.append(f'<text x="{x - 4:.1f}" y="{_PAD_T + 12}" font-size="11" text-anchor="end" '
                     f'fill="#d62728">SLO P99 {target_ms:g} ms</text>')
    lx = _PAD_L
    for label, colour, pts, dashed in series:
        if not pts:
            continue
        coords = [f"{xv(pts[0][0]):.1f},{yv(0):.1f}"]
        prev = 0.0
        for ms, share in pts:  # a step function: the share holds until the next latency
            coords.append(f"{xv(ms):.1f},{yv(prev):.1f}")
            coords.append(f"{xv(ms):.1f},{yv(share):.1f}")
            prev = share
        dash = ' stroke-dasharray="4,3"' if dashed else ""
        width_px = 1.5 if dashed else 2
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="{width_px}"'
                     f'{dash} points="{" ".join(coords)}"/>')
        width = 26 + 7 * len(label)
        parts.append(f'<line x1="{lx}" y1="{_H + 14}" x2="{lx + 14}" y2="{_H + 14}" '
                     f'stroke="{colour}" stroke-width="2"{dash}/>'
                     f'<text x="{lx + 18}" y="{_H + 18}" font-size="12">{escape(label)}</text>')
        lx += width
    parts.append("</svg>")
    return "".join(parts)


def render_html(report: Dict[str, Any]) -> str:
    rec = report["recommendation"]
    target = (report.get("slo") or {}).get("p99_ms")
    measured = [m for m in report["modes"] if not m.get("skipped")]
    series = []
    for i, m in enumerate(measured):
        colour = PALETTE[i % len(PALETTE)]
        cdf = m.get("cdf") or {}
        series.append((f"{m['mode']} beside training", colour, cdf.get("mixed") or [], False))
        series.append((f"{m['mode']} alone", colour, cdf.get("solo") or [], True))
    verdict = (f'<span class=ok>{escape(rec["mode"])}</span>' if rec["mode"] != "none"
               else '<span class=bad>none holds the SLO</span>')
    body = [
        "<!DOCTYPE html><html lang=en><head><meta charset=utf-8>",
        "<title>slurmiso probe</title>",
        f"<style>{PAGE_CSS}</style></head><body>",
        f"<h1>slurmiso probe: {verdict}</h1>",
        "<div class=muted>" + "<br>".join(escape(x) for x in _heading(report)) + "</div>",
        "<h2>Recommendation</h2>",
        f"<div class=f><b>{escape(rec['mode'])}</b>: {escape(rec['why'])}</div>",
        "<h2>Per mode</h2>", html_table(HEADER, mode_rows(report)),
        "<h2>Host, alone &rarr; beside training</h2>",
        "<p class=muted>CPU cores the run's command used, and the share of the run some task "
        "stalled on CPU, memory and IO (pressure stall information): the job's own cgroup "
        "(scope job) or the node's (scope node, on cgroup v1 or outside a job).</p>",
        html_table(HOST_HEADER, host_rows(report)),
        "<h2>Inference latency CDF per mode</h2>",
        "<p class=muted>solid: beside training on one GPU (exclusive: on its own GPU next to "
        "training's); dashed: alone with the same share. The red line is the class's P99 "
        "target.</p>",
    ]
    for i, m in enumerate(measured):
        colour = PALETTE[i % len(PALETTE)]
        cdf = m.get("cdf") or {}
        body.append(f"<h3>{escape(m['mode'])} (pool {escape(str(m.get('pool') or '-'))})</h3>")
        body.append(cdf_chart([("beside training", colour, cdf.get("mixed") or [], False),
                               ("alone", colour, cdf.get("solo") or [], True)], target))
    if len(measured) > 1:
        body.append("<h3>All modes, beside training</h3>")
        body.append(cdf_chart([s for s in series if not s[3]], target))
    runs = [[r["run"], r["where"], str(r.get("node") or "-"), f"{r['seconds']:.1f}s",
             r["output"]] for r in report.get("runs", [])]
    body += ["<h2>Runs</h2>", html_table(["RUN", "WHERE", "NODE", "TOOK", "OUTPUT"], runs)]
    body += ["<h2>Notes</h2><ul>"] + [f"<li>{escape(n)}</li>" for n in report.get("notes", [])]
    body += ["</ul></body></html>"]
    return "\n".join(body) + "\n"
