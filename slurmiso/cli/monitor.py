"""``slurmiso monitor``: keep inference within its SLO while training uses what is left.

Each cycle: snapshot (telemetry + Slurm) -> decide -> apply through Slurm (holds, partition
membership, drain/MIG layout/resume, reconcile), every action journaled with its reason.
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, List, Tuple

log = logging.getLogger(__name__)

_EPILOG = """\
examples:
  slurmiso monitor --once --dry-run                 # what would it do now?
  slurmiso monitor snapshot -o now.json             # record what it sees
  slurmiso monitor status                           # holds, gates, limits in force
  slurmiso monitor --once --dry-run --snapshot now.json --json
  slurmiso monitor --dry-run --snapshot day.jsonl --set min_dwell_s=120   # what-if replay
  slurmiso monitor --lend infer:train --metrics-port 9811   # the daemon (systemd unit)
  slurmiso monitor --telemetry agents --agent-url n5=http://127.0.0.1:9815/metrics

--dry-run prints exactly the decisions a real run applies, and changes nothing (its memory
is not saved either, but it remembers what a real run would). A replay (--snapshot a folder
or a JSON-lines file) runs each snapshot at its own time and ends with totals: jobs held,
time held, gate flips. A second monitor on the same lock file stays idle until the first dies.

exit status of --once: 0 done; 1 an action failed; 5 Slurm did not answer; 8 a telemetry
source failed (its signals are unknown); 9 another monitor leads (this one did nothing).
"""

EXIT_ACTION, EXIT_SLURM, EXIT_TELEMETRY, EXIT_NOT_LEADER = 1, 5, 8, 9


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "monitor", help="hold/release training, lend nodes, re-lay MIG from live telemetry",
        description=__doc__.split("\n\n", 1)[1].strip(), epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("what", nargs="?", choices=["snapshot", "status"],
                   help="'snapshot': record the live snapshot (with -o) instead of deciding; "
                   "'status': what the running monitor holds and which limits are in force")
    p.add_argument("-o", "--output", default="-", help="snapshot file (default stdout)")
    p.add_argument("--once", action="store_true", help="one cycle, then exit")
    p.add_argument("--dry-run", action="store_true", help="decide and print, change nothing")
    p.add_argument("--apply", action="store_true",
                   help="apply even when the config says monitor.dry_run: true")
    p.add_argument("--snapshot", metavar="PATH",
                   help="decide on recorded snapshots: a file, a folder of *.json, or a "
                   "JSON-lines file (replayed in order, each at its own time)")
    p.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE",
                   help="override a policy knob for this run (e.g. min_dwell_s=120, "
                   "admission=hold, ladder.throttle.after_s=30, ladder.steps=hold,throttle); "
                   "repeatable")
    p.add_argument("--state", metavar="FILE", default="",
                   help="memory file (default: <state_dir>/monitor/state.json)")
    p.add_argument("--lock", metavar="FILE", default="",
                   help="leader lock (default: <state_dir>/monitor/leader.lock)")
    p.add_argument("--interval", type=float, default=0, help="seconds between cycles")
    p.add_argument("--telemetry", default="",
                   choices=["", "agents", "prometheus", "local", "files", "none"],
                   help="telemetry source (default: monitor.telemetry.source); 'local' reads "
                   "the GPU backends in-process (one host), 'files' DIR/<node>.prom")
    p.add_argument("--agent-url", action="append", default=[], metavar="NODE=URL",
                   help="agent URL of a node (then only the listed nodes are scraped)")
    p.add_argument("--telemetry-dir", default="", help="folder for --telemetry files")
    p.add_argument("--lend", action="append", default=[], metavar="FROM:TO",
                   help="lend idle nodes of partition FROM to partition TO (repeatable)")
    p.add_argument("--lend-reserve", type=int, default=0,
                   help="idle nodes each FROM partition keeps (default 0)")
    p.add_argument("--reconcile", default="", metavar="NODES",
                   help="hostlist of nodes whose state this host can reconcile")
    p.add_argument("--reconcile-every", default="10m", help="how often (default 10m)")
    p.add_argument("--drain-timeout", default="1h",
                   help="give up a MIG re-layout whose node does not empty (default 1h)")
    p.add_argument("--node-exec", default="",
                   help="prefix running slurmiso on a node, e.g. 'ssh {node}' (default: here, "
                   "with SLURMD_NODENAME={node})")
    p.add_argument("--gres-out", default="",
                   help="after a re-layout write the node's gres.conf here ({node} allowed)")
    p.add_argument("--after-relayout", default="",
                   help="command after a re-layout that makes Slurm schedule the new GRES: "
                   "update the node's Gres= in slurm.conf and restart slurmctld and the node's "
                   "slurmd (22.05 keeps GRES counts across 'scontrol reconfigure'); the "
                   "sandbox's is 'slurmiso sandbox sync-gres' ({node} allowed)")
    p.add_argument("--metrics-port", type=int, default=0, help="serve monitor metrics here")
    p.add_argument("--metrics-addr", default="127.0.0.1",
                   help="address for --metrics-port (default loopback)")
    p.add_argument("--json", action="store_true", help="machine-readable output (--once)")
    p.set_defaults(func=run)


def _pairs(items: List[str], what: str, sep: str) -> List[Tuple[str, str]]:
    from slurmiso.errors import UsageError

    out = []
    for item in items:
        a, s, b = item.partition(sep)
        if not (s and a and b):
            raise UsageError(f"{what} {item!r}: expected A{sep}B")
        out.append((a, b))
    return out


def _source(args: argparse.Namespace, cfg: Any) -> Any:
    from slurmiso.errors import UsageError
    from slurmiso.monitor import telemetry as t

    kind = args.telemetry or cfg.monitor.telemetry.source
    interval = args.interval or cfg.monitor.interval_s
    deadline = float(cfg.monitor.telemetry.deadline_s or max(1.0, interval / 3.0))
    if kind == "agents":
        urls = dict(_pairs(args.agent_url, "--agent-url", "="))
        return t.AgentSource(cfg.monitor.telemetry.agent_port, urls,
                             timeout=min(3.0, deadline), deadline_s=deadline)
    if kind == "prometheus":
        if not cfg.monitor.telemetry.prometheus_url:
            raise UsageError("telemetry source prometheus needs monitor.telemetry.prometheus_url")
        queries = {s.class_name: s.latency_query for s in cfg.monitor.slo if s.latency_query}
        return t.PrometheusSource(cfg.monitor.telemetry.prometheus_url, queries,
                                  timeout=min(5.0, deadline), deadline_s=deadline)
    if kind == "local":
        from slurmiso.agent.gpus import gather_node

        return t.BackendSource(cfg, gather_node)
    if kind == "files":
        if not args.telemetry_dir:
            raise UsageError("--telemetry files needs --telemetry-dir DIR")
        return t.FileSource(args.telemetry_dir)
    return None


def run(args: argparse.Namespace) -> int:
    import os
    import signal
    import time

    from slurmiso.cli.output import print_json
    from slurmiso.config import load_config
    from slurmiso.hostlist import expand, node_name
    from slurmiso.monitor import snapshot as snapmod
    from slurmiso.monitor.apply import Applier
    from slurmiso.monitor.gather import live_snapshot
    from slurmiso.monitor.loop import Monitor, file_snapshots
    from slurmiso.monitor.policy import override, policy_from_config
    from slurmiso.slurm.client import SlurmCli
    from slurmiso.state import Journal
    from slurmiso.units import parse_duration

    cfg = load_config(args.config)
    slurm = SlurmCli()
    if args.what == "snapshot":
        snap = live_snapshot(cfg, slurm, _source(args, cfg))
        if args.output == "-":
            print(snapmod.dumps(snap))
        else:
            snapmod.save(snap, args.output)
            print(f"snapshot of {len(snap.nodes)} node(s), {len(snap.jobs)} job(s) -> "
                  f"{args.output}")
        return 0 if snap.slurm_ok else EXIT_SLURM
    policy = policy_from_config(
        cfg, _pairs(args.lend, "--lend", ":"), args.lend_reserve,
        expand(args.reconcile) if args.reconcile else (),
        parse_duration(args.reconcile_every) if args.reconcile else 0,
        parse_duration(args.drain_timeout))
    policy = override(policy, args.set, cfg)
    host = node_name()
    base = os.path.join(cfg.paths.state_dir_for(host), "monitor")
    state_path = args.state or os.path.join(base, "state.json")
    if args.what == "status":
        return _status(policy, state_path, args.json, print_json)
    dry_run = args.dry_run or (cfg.monitor.dry_run and not args.apply)
    replay = False
    if args.snapshot:
        snapshot_fn, replay = file_snapshots(args.snapshot)
    else:
        source = _source(args, cfg)

        def snapshot_fn() -> snapmod.Snapshot:
            return live_snapshot(cfg, slurm, source)

    applier = Applier(cfg, slurm, Journal(cfg.paths.journal_for(host)), args.node_exec,
                      args.gres_out, args.after_relayout)
    mon = Monitor(policy, snapshot_fn, applier, state_path,
                  args.lock or os.path.join(base, "leader.lock"),
                  args.interval or cfg.monitor.interval_s, dry_run,
                  sleep=(lambda s: None) if replay else time.sleep,
                  nudge=None if args.snapshot else getattr(source, "nudge", None))
    signal.signal(signal.SIGTERM, lambda *_: mon.request_stop())
    if args.metrics_port:
        _serve_metrics(mon, args.metrics_port, args.metrics_addr)
    from slurmiso.monitor.report import Timeline

    timeline = Timeline()
    failures = 0
    led = False
    try:
        for outcomes in mon.run(once=args.once):
            led = True
            failures += sum(1 for o in outcomes if not o.ok)
            timeline.add(mon, outcomes)
            if args.once:
                _report(mon, outcomes, dry_run, args.json, print_json, _exit(mon, failures))
            elif replay and not args.json and mon.last_snapshot is not None:
                for line in timeline.cycle_lines(outcomes, mon.last_snapshot.ts, dry_run):
                    print(line)
    finally:
        mon.close()
    if args.once and not led:
        reason = f"another monitor leads ({mon.lock.lock_file}): this one did nothing"
        if args.json:
            print_json({"exit": {"code": EXIT_NOT_LEADER, "reasons": [reason]}})
        else:
            print(f"idle: {reason}")
        return EXIT_NOT_LEADER
    if replay and not args.once:
        timeline.finish(mon)
        if args.json:
            print_json(timeline.to_dict())
        else:
            print("\n".join(timeline.total_lines()))
    code, _ = _exit(mon, failures)
    return code


def _status(policy: Any, state_path: str, as_json: bool, print_json: Any) -> int:
    import time

    from slurmiso.monitor.loop import Monitor
    from slurmiso.monitor.report import status, status_lines

    class _NoApply:
        def apply(self, *a: Any, **k: Any) -> List[Any]:
            return []

    memory = Monitor(policy, lambda: None, _NoApply(),  # type: ignore[arg-type,return-value]
                     state_path, state_path + ".lock", 30).memory
    st = status(policy, memory, time.time())
    if as_json:
        print_json(st)
    else:
        print("\n".join(status_lines(st)))
    return 0


def _exit(mon: Any, failures: int) -> Tuple[int, List[str]]:
    """The exit status of a cycle and the reasons for it (most serious first)."""
    snap = mon.last_snapshot
    reasons = []
    code = 0
    if snap is not None and not snap.slurm_ok:
        code = EXIT_SLURM
        reasons.append("Slurm did not answer: " + "; ".join(snap.errors[:1]))
    elif snap is not None and snap.errors:
        code = EXIT_TELEMETRY
        counts = ", ".join(f"{k} x{n}" for k, n in sorted(snap.unknown.items())
                           if not k.startswith("slurm/"))  # rows rejected: not telemetry
        reasons.append(f"telemetry failed ({counts or len(snap.errors)}): {snap.errors[0]}")
    if failures:
        code = code or EXIT_ACTION
        reasons.append(f"{failures} action(s) failed")
    return code, reasons


def _report(mon: Any, outcomes: List[Any], dry_run: bool, as_json: bool, print_json: Any,
            exit_info: Tuple[int, List[str]]) -> None:
    gates = {k: g.to_dict() for k, g in mon.memory.gates.items()}
    code, reasons = exit_info
    if as_json:
        print_json({"dry_run": dry_run,
                    "actions": [dict(o.action.to_dict(), ok=o.ok, error=o.error)
                                for o in outcomes],
                    "gates": gates, "stale": mon.memory.stale,
                    "holds": sorted(mon.memory.holds),
                    "lent": {k: r.to_dict() for k, r in mon.memory.lent.items()},
                    "excluded": sorted(mon.memory.excluded),
                    "relayout": mon.memory.relayout,
                    "ladder": {k: r.to_dict() for k, r in sorted(mon.memory.ladder.items())},
                    "restrained": {k: r.to_dict()
                                   for k, r in sorted(mon.memory.restrained.items())},
                    "unknown": mon.stats.unknown,
                    "exit": {"code": code, "reasons": reasons}})
        return
    verb = "would" if dry_run else "did"
    for o in outcomes:
        status = "" if o.ok else f"  -- FAILED: {o.error}"
        print(f"{verb} {o.action.describe()}{status}")
    if not outcomes:
        closed = [s for s, g in gates.items() if g.get("closed")]
        print("no action" + (f"; training kept off {', '.join(closed[:10])}" if closed else "")
              + (f"; unknown data for {', '.join(mon.memory.stale[:10])}"
                 if mon.memory.stale else ""))
    for reason in reasons:
        print(f"exit {code}: {reason}")


def _serve_metrics(mon: Any, port: int, addr: str = "127.0.0.1") -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from slurmiso.errors import UsageError
    from slurmiso.monitor.loop import MonitorCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MonitorCollector(mon.stats))
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise UsageError(f"cannot serve metrics on {addr}:{port}: {exc.strerror}") from None
