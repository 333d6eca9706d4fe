"""``slurmiso audit``: isolation health, preemption cost and GPU use, for people and cron."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.audit.read.sacct import LIVE_FIELDS

log = logging.getLogger(__name__)

FORMATS = ("text", "md", "html", "json", "csv")
#: How far before the window the journals are read for job classes only (prolog lines).
CLASS_LOOKBACK_S = 7 * 86400


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "audit",
        help="report on preemption cost, queue waits, GPU use and isolation health",
        description=(
            "Reads accounting (sacct, streamed; or a saved file) and slurmiso's journals, and "
            "reports per class and overall: jobs, wait P50/P95/P99, preemptions and requeues, "
            "time to checkpoint vs grace, GPU-hours lost to preemption, GPU-hours by class and "
            "pool, idle allocated GPUs, SLO attainment, monitor actions; then findings with "
            "the jobs/nodes concerned and a fix. Every figure is defined in docs/audit.md. "
            "Exit status: 0 no finding at or above audit.severity, 1 findings at or above it, "
            "2 unusable input (sacct or slurmdbd down, bad file, bad option) or a report that "
            "could not be written."
        ),
        epilog=(
            "sacct fields read (save a file for --sacct-file with exactly this):\n"
            f"  sacct -a -D -P -S 2024-05-01 --format={','.join(LIVE_FIELDS)} > jobs.txt\n"
            "  sacct -a -D -S 2024-05-01 --json > jobs.json     (any data_parser version)\n"
            "examples:\n"
            "  slurmiso audit --since 1d\n"
            "  slurmiso audit --since 7d --format html -o /var/www/html/slurmiso/audit.html\n"
            "  slurmiso audit --since 1d --also html=/var/www/html/slurmiso/audit.html   (one "
            "sacct query, two reports)\n"
            "  slurmiso audit --sacct-file jobs.txt --journal '/var/log/slurmiso/*.jsonl'\n"
            "  slurmiso audit --live --format json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--since", default="", metavar="1d|DATE",
                   help="start of the window: a duration back from now or a date "
                        "(default 1d live; everything in a --sacct-file)")
    p.add_argument("--until", default="", metavar="DATE", help="end of the window (default now)")
    p.add_argument("--format", choices=FORMATS, default="text", help="report format")
    p.add_argument("-o", "--output", metavar="FILE", help="write the report here (atomically)")
    p.add_argument("--also", action="append", default=[], metavar="FORMAT=FILE",
                   help="also write the same report in FORMAT to FILE (repeatable; one sacct "
                        "query serves every format)")
    p.add_argument("--nodes-file", metavar="FILE",
                   help="saved 'scontrol show nodes' output: pool capacity (GPUs) from it "
                        "instead of the config")
    p.add_argument("--sacct-file", metavar="FILE",
                   help="saved 'sacct -P' (with header) or 'sacct --json' output; '-' = stdin")
    p.add_argument("--sacct-json", action="store_true",
                   help="ask live sacct for --json instead of -P (slower, same report)")
    p.add_argument("--journal", nargs="+", default=[], metavar="PATH",
                   help="journal files or globs (default: paths.journal, %%n as *)")
    p.add_argument("--live", action="store_true",
                   help="also run doctor's checks now, and list what ended jobs left on this "
                   "node (MIG instances, GPU processes, job records)")
    p.add_argument("--node", default="", help="node for --live (default: this host)")
    p.set_defaults(func=run)


def _outputs(args: argparse.Namespace) -> List[Tuple[str, Optional[str]]]:
    """(format, path) of every report this run writes; the first is --format/-o."""
    from slurmiso.errors import UsageError

    out: List[Tuple[str, Optional[str]]] = [(args.format, args.output)]
    for item in args.also:
        fmt, sep, path = item.partition("=")
        if not sep or fmt not in FORMATS or not path:
            raise UsageError(f"--also {item!r}: want FORMAT=FILE with FORMAT one of "
                             f"{', '.join(FORMATS)}")
        out.append((fmt, path))
    return out


def run(args: argparse.Namespace) -> int:
    from slurmiso.audit.figures.aggregate import Aggregator
    from slurmiso.audit.figures.findings import (
        at_or_above,
        config_findings,
        input_findings,
        job_findings,
    )
    from slurmiso.audit.figures.report import build_report, capacity_from_scontrol
    from slurmiso.audit.read.collect import (
        journal_paths,
        parse_when,
        read_sacct_file,
        records_from,
        stream_sacct,
    )
    from slurmiso.audit.read.digest import EVENTS, JournalDigest
    from slurmiso.audit.read.sacct import AuditInputError, ParseStats
    from slurmiso.config import load_config
    from slurmiso.errors import SlurmError, UsageError
    from slurmiso.state.journal import read_journals

    cfg = load_config(args.config)
    outputs = _outputs(args)
    now = time.time()
    since: Optional[float] = parse_when(args.since, now) if args.since else None
    until: Optional[float] = parse_when(args.until, now) if args.until else None
    if since is not None and until is not None and since >= until:
        raise UsageError("--since must be before --until")
    capacity = None
    if args.nodes_file:
        try:
            with open(args.nodes_file, encoding="utf-8", errors="replace") as fh:
                capacity = capacity_from_scontrol(cfg, fh.read())
        except OSError as exc:
            raise AuditInputError(f"cannot read nodes file {args.nodes_file}: "
                                  f"{exc.strerror}") from None

    journals = journal_paths(cfg, args.journal)
    for j in journals:
        if j["missing"]:
            print(f"slurmiso: warning: journal {j['path']} not found; reporting without it",
                  file=sys.stderr)
    window_from = since if since is not None or args.sacct_file else now - 86400
    # a job that started before the window has its prolog line (its class) before it too
    digest = JournalDigest(since=window_from)
    class_from = None if window_from is None else window_from - CLASS_LOOKBACK_S
    from datetime import datetime, timezone

    def dt(ts: Optional[float]) -> Optional[datetime]:
        return None if ts is None else datetime.fromtimestamp(ts, timezone.utc)

    for rec in read_journals([j["path"] for j in journals if not j["missing"]],
                             since=dt(class_from), until=dt(until), events=EVENTS):
        digest.add(rec)

    stats = ParseStats()
    if args.sacct_file == "-":
        stats.source = "<stdin>"
        records: Any = records_from(sys.stdin, stats)
    elif args.sacct_file:
        records = read_sacct_file(args.sacct_file, stats)
    else:
        assert window_from is not None
        records = stream_sacct(window_from, until, stats, as_json=args.sacct_json)
    # live sacct -S/-E returns every attempt that overlaps the window: clip those too
    agg = Aggregator(cfg, digest, bucket_s=3600, since=window_from, until=until or (
        None if args.sacct_file else now))
    try:
        agg.add_all(records)
    except SlurmError as err:  # sacct or slurmdbd down: unusable input, exit 2 as documented
        raise AuditInputError(err.message, hint=err.hint) from None
    except AuditInputError as err:
        if not stats.records:
            raise
        print(f"slurmiso: warning: {err}; reporting the {stats.records} records read",
              file=sys.stderr)
    if not stats.records and (stats.bad or stats.truncated):
        print(f"slurmiso: error: {stats.source}: no usable sacct record "
              f"({'; '.join(stats.bad_samples[:3]) or 'truncated'})", file=sys.stderr)
        return 2
    for sample in stats.bad_samples[:3]:
        print(f"slurmiso: warning: left out sacct record ({sample})", file=sys.stderr)
    if stats.truncated:
        print(f"slurmiso: warning: {stats.source}: sacct output truncated; partial report",
              file=sys.stderr)

    findings = input_findings(stats, journals, agg, digest) + config_findings(cfg)
    findings += job_findings(cfg, agg, digest)
    if args.live:
        from slurmiso.audit.read.live import live_findings
        from slurmiso.slurm.client import SlurmCli

        findings += live_findings(cfg, args.node, SlurmCli())
    report = build_report(agg, digest, stats, journals, findings, since=window_from,
                          until=until, generated=now, severity=cfg.audit.severity,
                          capacity=capacity)
    probes = _latest_probes(cfg)
    if probes:
        report["probe"] = probes
    failed = 0
    for fmt, path in outputs:  # every format from the one pass; each failure is reported
        try:
            write(render(report, fmt), path)
        except UsageError as err:
            print(f"slurmiso: error: {fmt} report: {err}", file=sys.stderr)
            failed += 1
    if failed:
        return 2
    return 1 if at_or_above(findings, cfg.audit.severity) else 0


def _latest_probes(cfg: Any) -> Dict[str, Dict[str, Any]]:
    """The newest ``slurmiso probe`` figures of each pool (paths.probe_dir), for the report's
    probe table; {} when none was saved. The CLI joins them: the audit never imports probe."""
    from slurmiso.probe.store import latest_per_pool

    out = {}
    pools = {p.name for p in cfg.pools}
    for pool, m in latest_per_pool(cfg.paths.probe_dir).items():
        if pool not in pools:  # a --local probe measured a node, not a pool
            continue
        out[pool] = {"mode": m["mode"], "generated": m.get("generated"),
                     "p99_ms": m["infer"].get("p99_ms"),
                     "solo_p99_ms": (m.get("infer_solo") or {}).get("p99_ms"),
                     "error_rate": m["infer"].get("error_rate"),
                     "train_keeps": m["train"].get("throughput_vs_solo"),
                     "recommended": m.get("recommended"), "file": m.get("file")}
    return out


def render(report: Dict[str, Any], fmt: str) -> str:
    if fmt == "html":
        from slurmiso.audit.render.html import render_html

        return render_html(report)
    if fmt in ("json", "csv"):
        from slurmiso.audit.render.data import render_csv, render_json

        return render_json(report) if fmt == "json" else render_csv(report)
    from slurmiso.audit.render.text import render_markdown, render_text

    return render_markdown(report) if fmt == "md" else render_text(report)


def write(text: str, path: Optional[str]) -> None:
    """stdout, or ``path`` replaced atomically (a web server never serves half a report)."""
    if not path or path == "-":
        sys.stdout.write(text)
        return
    from slurmiso.atomic import write_atomic
    from slurmiso.errors import UsageError

    try:
        write_atomic(path, text)
    except OSError as exc:
        raise UsageError(f"cannot write report {path}: {exc.strerror}") from None


