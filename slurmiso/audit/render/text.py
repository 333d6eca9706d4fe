"""Text (for mail and terminals) and Markdown renderings of an audit report dict."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.audit.read.ladder import PARK_STEPS

CLASS_COLUMNS = ["CLASS", "JOBS", "ATTEMPTS", "REQUEUES", "PREEMPTED", "WAIT P50", "P95", "P99",
                 "GPU-H", "LOST GPU-H", "LOST (EST.)"]


def duration(seconds: Optional[float]) -> str:
    """Human duration that never rounds across a limit an admin compares it with:
    ``45s``, ``2m05s``, ``1h02m``, ``2d03h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = int(round(seconds))
    if s < 100:
        return f"{seconds:.0f}s" if seconds >= 1 or seconds == 0 else f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 48 * 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def hours(value: Optional[float]) -> str:
    if value is None:
        return "unknown"
    return f"{value:,.1f}" if value < 1000 else f"{value:,.0f}"


def count(value: Optional[int]) -> str:
    return "unknown" if value is None else str(value)


def class_rows(report: Dict[str, Any]) -> List[List[str]]:
    rows = []
    items = list(report["classes"].items()) + [("overall", report["overall"])]
    for name, c in items:
        rows.append([name, count(c["jobs"]), count(c["attempts"]), count(c["requeues"]),
                     count(c["preemptions"]), duration(c["wait_p50_s"]),
                     duration(c["wait_p95_s"]),
                     duration(c["wait_p99_s"]), hours(c["gpu_hours"]),
                     hours(c["lost_gpu_hours"]), hours(c["lost_gpu_hours_estimated"])])
    return rows


def _inputs(report: Dict[str, Any]) -> str:
    s = report["inputs"]["sacct"]
    journals = report["inputs"]["journals"]
    found = [j for j in journals if not j.get("missing")]
    text = (f"sacct: {s['source'] or '-'} ({s['format'] or '?'}"
            + (f", Slurm {s['slurm_version']}" if s.get("slurm_version") else "")
            + f"; {s['records']} records, {s['steps']} steps folded, {s['bad']} unreadable"
            + (", TRUNCATED" if s["truncated"] else "") + ")")
    text += (f"\njournals: {len(found)} read, {report['inputs']['journal_records']} records"
             + (f", {len(journals) - len(found)} missing" if len(found) < len(journals) else ""))
    return text


def _findings_lines(report: Dict[str, Any]) -> List[str]:
    lines = []
    for f in report["findings"]:
        lines.append(f"  [{f['severity']}] {f['code']}: {f['message']}")
        if f["subjects"]:
            more = f" (+{f['count'] - len(f['subjects'])} more)" if f["count"] > len(
                f["subjects"]) else ""
            lines.append("      concerns: " + ", ".join(f["subjects"]) + more)
        if f["fix"]:
            lines.append("      fix: " + f["fix"])
    return lines or ["  none"]


def extra_tables(report: Dict[str, Any]) -> List[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) of the smaller sections, shared by text and Markdown."""
    out: List[Tuple[str, List[str], List[List[str]]]] = []
    pools = [[n, str(p["attempts"]), hours(p["gpu_hours"]), count(p.get("capacity_gpus")),
              _share(p)] for n, p in report["pools"].items()]
    out.append(("GPU-hours by pool", ["POOL", "ATTEMPTS", "GPU-H", "GPUS", "USE"], pools))
    for key, label in (("users", "USER"), ("accounts", "ACCOUNT")):
        rows = [[r[label.lower()], str(r["jobs"]), hours(r["gpu_hours"]),
                 hours(r["idle_gpu_hours"]), hours(r["lost_gpu_hours"]), str(r["preemptions"])]
                for r in report.get("who", {}).get(key, [])]
        out.append((f"Who used what: by {label.lower()}",
                    [label, "JOBS", "GPU-H", "IDLE GPU-H", "LOST GPU-H", "PREEMPTED"], rows))
    eff = [[e["job"], e["user"], f"{e['gpu_util']:g}%", hours(e["gpu_hours"]),
            hours(e["wasted_gpu_hours"])] for e in report.get("gpu_efficiency", [])]
    out.append(("Least efficient GPU jobs (sacct gres/gpuutil)",
                ["JOB", "USER", "GPU UTIL", "GPU-H", "WASTED GPU-H"], eff))
    ck = [[c, str(v["checkpoints"]), str(v["ok"]), str(v["failed"]), duration(v["p50_s"]),
           duration(v["p95_s"]), duration(v["max_s"]), duration(v["grace_s"]),
           str(v["over_grace"]), str(v.get("periodic", 0))]
          for c, v in report["checkpoints"].items()]
    out.append(("Time to requested checkpoint vs grace (user-reported, journal)",
                ["CLASS", "REQUESTED", "OK", "FAILED", "P50", "P95", "MAX", "GRACE",
                 "OVER GRACE", "PERIODIC"], ck))
    slo = []
    for name, c in report["classes"].items():
        w = c.get("wait_slo")
        if w:
            slo.append([name, f"queue wait <= {duration(w['max_queue_wait_s'])}",
                        f"{w['attainment']:.1%}", f"{w['of']} starts (sacct)"])
    for s in report["latency_slo"]:
        att = "-" if s["attainment"] is None else f"{s['attainment']:.1%}"
        slo.append([s["class"], f"P99 latency <= {s['target_p99_ms']:g} ms", att,
                    f"{s['samples']} samples ({s['source']})"])
    out.append(("SLO attainment", ["CLASS", "OBJECTIVE", "MET", "BASIS"], slo))
    idle = report["idle"]
    out.append(("Idle allocated GPUs", ["MEASURE", "VALUE"], [
        ["GPU-hours at 0% utilisation (sacct gres/gpuutil)",
         hours(idle["measured_gpu_hours"])],
        ["GPU-hours with utilisation accounted", hours(idle["accounted_gpu_hours"])],
        ["jobs flagged idle by the monitor", str(idle["monitor_flagged_jobs"])],
    ]))
    if report.get("probe"):  # only where 'slurmiso probe' has saved results
        out.append(("Latest probe per pool (slurmiso probe), beside the window's use",
                    ["POOL", "MODE", "PROBED", "P99 MIXED", "P99 ALONE", "ERRORS",
                     "TRAIN KEEPS", "PROBE PICKS", "USE"], _probe_rows(report)))
    acts = [[a, str(n)] for a, n in report["monitor_actions"].items()]
    acts += [[f"requeue ({r}, wrapper)", str(n)] for r, n in report["requeues_by_reason"].items()]
    out.append(("Monitor actions and wrapper requeues", ["KIND", "COUNT"], acts))
    return out


LADDER_TITLE = "What the ladder cost training (monitor journal)"
_SIGNAL_TEXT = {"p99_ms": "P99", "error_rate": "errors"}


def _slo_value(signal: str, value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:.2%}" if signal == "error_rate" else f"{value:,.0f} ms"


def ladder_lines(report: Dict[str, Any]) -> List[str]:
    """What the ladder section says in words: whether it has anything to show, and what it
    left out (bad lines, restraints not released, unknown GPUs, requeues not accounted)."""
    lad = report.get("ladder")
    if not lad:
        return []
    lines = []
    if lad["status"] == "unknown":
        lines.append("unknown: no journal records, so whether the ladder acted is not known")
    elif lad["status"] == "none":
        lines.append(f"no ladder activity: no ladder step in the "
                     f"{report['inputs']['journal_records']} journal records read")
    if lad["bad_lines"]:
        lines.append(f"{lad['bad_lines']} ladder line(s) left out of every figure as bad: "
                     + "; ".join(lad["bad_samples"]))
    total = lad.get("total")
    if lad["status"] != "active" or not total:
        return lines
    open_ = lad["unreleased"]
    if open_["throttled"] or open_["suspended"] or open_.get("parked") or \
            open_.get("host_limited"):
        parked = (f", {open_['parked']} parked" if open_.get("parked") else "") + (
            f", {open_['host_limited']} host-limited" if open_.get("host_limited") else "")
        lines.append(f"not released in the window: {open_['throttled']} throttled, "
                     f"{open_['suspended']} suspended{parked} job(s); their time is not "
                     "counted")
    if total["gpus_unknown"]:
        lines.append(f"{total['gpus_unknown']} restraint(s) of jobs whose GPUs no prolog line "
                     "gave: their GPU-hours are unknown")
    if total["taken"]["requeue"] > total["requeues_in_sacct"]:
        lines.append(f"{total['taken']['requeue'] - total['requeues_in_sacct']} of the "
                     f"{total['taken']['requeue']} requeue(s) have no REQUEUED attempt in "
                     "accounting: their lost GPU-hours are unknown")
    return lines


def _known(fmt: Any, value: Optional[float]) -> str:
    return "unknown" if value is None else str(fmt(value))


def ladder_tables(report: Dict[str, Any]) -> List[Tuple[str, List[str], List[List[str]]]]:
    """(title, header, rows) of the ladder section when it has figures, else none."""
    lad = report.get("ladder")
    if not lad or lad["status"] != "active" or not lad.get("total"):
        return []
    steps = []
    for step, st in lad["steps"].items():
        if step in PARK_STEPS and not (st["taken"] or st["dry_run"] or st["failed"]):
            continue  # the park rung is optional: its rows where it acted
        at, pairs = [], []
        for signal, t in st["slo"].items():
            name = _SIGNAL_TEXT.get(signal, signal)
            if t["figures"]:
                at.append(f"{name} {_slo_value(signal, t['figure_mean'])} mean, "
                          f"{_slo_value(signal, t['figure_max'])} max ({t['figures']})")
            if t["pairs"]:
                pairs.append(f"{name} {_slo_value(signal, t['before_mean'])} -> "
                             f"{_slo_value(signal, t['after_mean'])} ({t['pairs']})")
        steps.append([step, count(st["taken"]), str(st["dry_run"]), str(st["failed"]),
                      "; ".join(at) or "-", "; ".join(pairs) or "-"])
    cost = []
    scopes = [("all", lad["total"])] + [(f"class {k}", v) for k, v in lad["by_class"].items()]
    scopes += [(f"pool {k}", v) for k, v in lad["by_pool"].items()]
    for name, t in scopes:
        taken = t["taken"]
        cost.append([name, count(taken["hold"]), count(taken["throttle"]),
                     count(taken["suspend"]), count(taken["requeue"]),
                     _known(duration, t["throttled_s"]), _known(duration, t["suspended_s"]),
                     hours(t["throttled_gpu_hours"]),
                     hours(t["suspended_gpu_hours"]), hours(t["requeue_lost_gpu_hours"]),
                     hours(t["requeue_lost_gpu_hours_estimated"])])
    return [
        ("Ladder steps and the SLO (inference figure at the step; before -> after a release)",
         ["STEP", "TAKEN", "DRY RUN", "FAILED", "SLO AT STEP", "SLO BEFORE -> AFTER"], steps),
        ("What it cost training",
         ["SCOPE", "HOLD", "THROTTLE", "SUSPEND", "REQUEUE", "THROTTLED", "SUSPENDED",
          "THROTTLED GPU-H", "SUSPENDED GPU-H", "REQUEUE LOST GPU-H", "(EST.)"], cost),
    ]


def _probe_rows(report: Dict[str, Any]) -> List[List[str]]:
    """The newest probe of each pool next to the pool's use in this report's window."""
    def ms(v: Any) -> str:
        return "-" if v is None else f"{v:g} ms"

    rows = []
    for pool, p in report["probe"].items():
        keeps = p.get("train_keeps")
        live = report["pools"].get(pool)
        rows.append([pool, str(p.get("mode")), str(p.get("generated") or "-"),
                     ms(p.get("p99_ms")), ms(p.get("solo_p99_ms")),
                     "-" if p.get("error_rate") is None else f"{p['error_rate']:.2%}",
                     "-" if keeps is None else f"{keeps:.0%}", str(p.get("recommended") or "-"),
                     _share(live) if live else "-"])
    return rows


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """Plain aligned table for mail (the audit is a library: it does not import the CLI)."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def _share(pool: Dict[str, Any]) -> str:
    share = pool.get("use_share")
    return "-" if share is None else f"{share:.1%}"


def over_threshold(report: Dict[str, Any]) -> int:
    """Findings at or above the report's severity threshold (what the exit code counts)."""
    return sum(1 for f in report["findings"] if f["severity"] in _at_or_above(report))


def span_line(report: Dict[str, Any]) -> str:
    win, span = report["window"], report.get("data_span", {})
    return (f"window: {win['since'] or 'all'} .. {win['until'] or 'now'}; data spans "
            f"{span.get('first') or '-'} .. {span.get('last') or '-'}")


def render_text(report: Dict[str, Any]) -> str:
    n_over = over_threshold(report)
    lines = [
        f"slurmiso audit, generated {report['generated']}",
        span_line(report),
        _inputs(report),
        "",
        f"FINDINGS ({len(report['findings'])}; {n_over} at or above "
        f"{report['severity_threshold']})",
        *_findings_lines(report),
        "",
        "BY CLASS",
        table(class_rows(report), CLASS_COLUMNS),
    ]
    for title, header, rows in extra_tables(report):
        lines += ["", title.upper(), table(rows, header) if rows else "  none"]
    if report.get("ladder"):
        lines += ["", LADDER_TITLE.upper(), *("  " + x for x in ladder_lines(report))]
        for title, header, rows in ladder_tables(report):
            lines += [title, table(rows, header)]
    lines += ["", "NOTES", *("  - " + n for n in report["notes"])]
    return "\n".join(lines) + "\n"


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    if not rows:
        return "_none_"
    esc = [[str(c).replace("|", "\\|") for c in r] for r in rows]
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(r) + " |" for r in esc])


def render_markdown(report: Dict[str, Any]) -> str:
    out = [
        "# slurmiso audit",
        "",
        f"Generated {report['generated']}; {span_line(report)}.",
        "",
        "```",
        _inputs(report),
        "```",
        "",
        "## Findings",
        "",
    ]
    for f in report["findings"]:
        out.append(f"- **{f['severity']}** `{f['code']}`: {f['message']}")
        if f["subjects"]:
            out.append(f"  - concerns: {', '.join(f['subjects'])}"
                       + (f" (+{f['count'] - len(f['subjects'])} more)"
                          if f["count"] > len(f["subjects"]) else ""))
        if f["fix"]:
            out.append(f"  - fix: {f['fix']}")
    if not report["findings"]:
        out.append("_none_")
    out += ["", "## By class", "", _md_table(CLASS_COLUMNS, class_rows(report))]
    for title, header, rows in extra_tables(report):
        out += ["", f"## {title}", "", _md_table(header, rows)]
    if report.get("ladder"):
        out += ["", f"## {LADDER_TITLE}", ""] + [f"- {x}" for x in ladder_lines(report)]
        for title, header, rows in ladder_tables(report):
            out += ["", f"### {title}", "", _md_table(header, rows)]
    out += ["", "## Notes", ""] + [f"- {n}" for n in report["notes"]]
    return "\n".join(out) + "\n"


def _at_or_above(report: Dict[str, Any]) -> Sequence[str]:
    order = ["info", "warning", "error"]
    level = report.get("severity_threshold", "warning")
    return order[order.index(level):] if level in order else order[1:]
