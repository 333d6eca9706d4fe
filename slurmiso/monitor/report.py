"""What a replay or a running monitor tells its operator: the action timeline with totals
(jobs held, time held, gate flips), and the state and limits in force (``monitor status``).

Plain data in, lines or dicts out: the CLI prints them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set

from slurmiso.monitor.action import ActionKind
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.unknown import view as unknown_view


@dataclass
class Timeline:
    """Every cycle's actions, and the totals a what-if is judged by."""

    cycles: int = 0
    first_ts: Optional[float] = None
    last_ts: Optional[float] = None
    events: List[Dict[str, Any]] = field(default_factory=list)
    counts: Dict[str, int] = field(default_factory=dict)
    held: Set[str] = field(default_factory=set)
    held_s: float = 0.0
    flips: int = 0
    decide_ms: List[float] = field(default_factory=list)
    _closed: Dict[str, bool] = field(default_factory=dict)

    def add(self, mon: Any, outcomes: List[Any]) -> None:
        snap = mon.last_snapshot
        ts = snap.ts if snap is not None else 0.0
        self.cycles += 1
        self.decide_ms.append(round(1000.0 * mon.stats.last_decide_s, 2))
        self.first_ts = ts if self.first_ts is None else self.first_ts
        self.last_ts = ts
        for out in outcomes:
            a = out.action
            self.counts[a.name] = self.counts.get(a.name, 0) + 1
            if a.kind == ActionKind.HOLD and out.ok:
                self.held.add(a.target)
            if a.kind == ActionKind.RELEASE and out.ok:
                self.held_s += float(a.details.get("held_s") or 0.0)
            self.events.append({"ts": ts, "kind": a.name, "target": a.target,
                                "reason": a.reason, "ok": out.ok})
        closed = {s: g.closed for s, g in mon.memory.gates.items()}
        for scope in set(closed) | set(self._closed):
            if closed.get(scope, False) != self._closed.get(scope, False):
                self.flips += 1
        self._closed = closed

    def finish(self, mon: Any) -> None:
        """Holds still in place at the end count with their time so far."""
        if self.last_ts is None:
            return
        for hold in mon.memory.holds.values():
            self.held_s += max(0.0, self.last_ts - hold.ts)

    def cycle_lines(self, outcomes: List[Any], ts: float, dry_run: bool) -> List[str]:
        verb = "would" if dry_run else "did"
        lines = []
        by_kind: Dict[str, List[Any]] = {}
        for o in outcomes:
            by_kind.setdefault(o.action.name, []).append(o)
        for kind, outs in by_kind.items():
            if len(outs) > 5:  # 20,000 holds are one line, with the first reason
                lines.append(f"t={ts:.0f} {verb} {kind} {len(outs)} job(s): "
                             f"{outs[0].action.reason}")
            else:
                lines += [f"t={ts:.0f} {verb} {o.action.describe()}"
                          + ("" if o.ok else f" -- FAILED: {o.error}") for o in outs]
        return lines

    def to_dict(self) -> Dict[str, Any]:
        return {"cycles": self.cycles, "from_ts": self.first_ts, "to_ts": self.last_ts,
                "totals": {"jobs_held": len(self.held), "time_held_s": round(self.held_s, 1),
                           "gate_flips": self.flips, "actions": dict(sorted(
                               self.counts.items()))},
                "decide_ms": self.decide_ms, "timeline": self.events}

    def total_lines(self) -> List[str]:
        span = (self.last_ts or 0.0) - (self.first_ts or 0.0)
        acts = ", ".join(f"{k} {n}" for k, n in sorted(self.counts.items())) or "none"
        return [f"{self.cycles} cycle(s) over {span:.0f}s",
                f"jobs held: {len(self.held)}; time held: {self.held_s:.0f} job-seconds; "
                f"gate flips: {self.flips}",
                f"actions: {acts}"]


def status(policy: Policy, memory: Memory, now: float) -> Dict[str, Any]:
    """What the monitor holds, keeps off, lends, and which limits bind right now."""
    mem = memory.copy()
    limits = {
        "partition updates": (mem.count("partition-update", now),
                              policy.partition_updates_per_hour),
    }
    for key in sorted(mem.events):
        if key.startswith("relayout:"):
            limits[f"re-layouts of {key[9:]}"] = (mem.count(key, now),
                                                  policy.relayouts_per_hour)
    opens = {k[5:]: mem.count(k, now) for k in sorted(mem.events) if k.startswith("open:")}
    window = [t for t in mem.release_times if t > now - policy.stagger_interval_s]
    stamps = [h.ts for h in mem.holds.values()]
    seen = unknown_view(mem, now)  # the exported metrics read the same view
    return {
        "admission": policy.admission,
        "unknown_admits": policy.unknown_admits,
        "holds": len(mem.holds),
        "oldest_hold_s": round(now - min(stamps), 1) if stamps else None,
        "excluded_jobs": len(mem.excluded),
        "closed": sorted(s for s, g in mem.gates.items() if g.closed),
        "unknown": list(mem.stale),
        "unknown_since": dict(mem.unknown_since),
        "unknown_telemetry": seen["nodes"],
        "unknown_signals": seen["signals"],
        "lent": sorted(mem.lent),
        "relayout": mem.relayout,
        "starts_this_interval": [len(window), policy.stagger_max_starts],
        "limits_per_hour": {k: list(v) for k, v in limits.items()},
        "gate_opens_this_hour": {k: [n, policy.gate_opens_per_hour] for k, n in opens.items()
                                 if n},
        "dwell_s": policy.min_dwell_s,
        "now": now,
        "backlog_drain_s": policy.backlog_drain_s,
        "ladder": ladder_status(policy, mem, now),
    }


def ladder_status(policy: Policy, mem: Memory, now: float) -> Dict[str, Any]:
    """The ladder's section: each GPU's rung (step, since, cause, how long its cause has not
    been hot against the step's bound) and each training job it restrains, with its age."""
    from slurmiso.monitor.bound import step_bound

    def age(ts: Optional[float]) -> Optional[float]:
        return None if ts is None else round(now - ts, 1)

    gpus = [{"gpu": key, "step": r.step, "for_s": age(r.since), "cause": r.cause,
             "why": r.why, "not_hot_s": age(r.not_hot_since),
             "bound_s": step_bound(policy, r.step), "capped": r.capped,
             **({"diagnosis": {"cause": r.diagnosis_cause, "text": r.diagnosis}}
                if r.diagnosis else {})}
            for key, r in sorted(mem.ladder.items())]
    jobs = []
    for jid, rec in sorted(mem.restrained.items()):
        step = "suspend" if rec.suspended_since is not None else (
            "park" if rec.parked_since is not None else "throttle")
        jobs.append({"job": jid, "gpu": f"{rec.node}/{rec.gpu}", "step": step,
                     "cause": rec.cause, "why": rec.why,
                     "throttled_s": age(rec.throttled_since),
                     "suspended_s": age(rec.suspended_since),
                     **({"parked_s": age(rec.parked_since)}
                        if rec.parked_since is not None else {}),
                     **({"park_refused": rec.park_refused} if rec.park_refused else {}),
                     "bound_s": step_bound(policy, step)})
    out: Dict[str, Any] = {"steps": list(policy.ladder.names()),
                           "on_bound": policy.ladder.on_bound.value,
                           "gpus": gpus, "restrained": jobs,
                           "exempt": list(mem.ladder_exempt),
                           "last_cycle_s": age(mem.last_ts) if mem.last_ts else None}
    host = policy.ladder.host
    if host.levels or mem.host_rungs or mem.host_limited:  # absent while off, as before
        out["host"] = {
            "levels": host.levels, "bound_s": host.max_s,
            "nodes": [{"node": node, "level": r.level, "for_s": age(r.since),
                       "cause": r.cause, "host_cause": r.host_cause, "why": r.why,
                       "not_hot_s": age(r.not_hot_since), "capped": r.capped}
                      for node, r in sorted(mem.host_rungs.items())],
            "limited": [{"job": jid, "node": rec.node, "level": rec.level,
                         "for_s": age(rec.since), "cause": rec.cause,
                         "host_cause": rec.host_cause}
                        for jid, rec in sorted(mem.host_limited.items())]}
    return out


def host_lines(st: Dict[str, Any]) -> List[str]:
    """The host rung per node and the jobs it limits (none while it is off)."""
    host = st.get("host")
    if not host:
        return []
    if not host["levels"]:
        head = "host rung: off (no monitor.ladder.host_limit.levels)"
    else:
        head = (f"host rung ({host['levels']} level(s)): {len(host['nodes'])} node(s) at a "
                f"level, {len(host['limited'])} training job(s) host-limited")
    lines = [head]
    for n in host["nodes"][:20]:
        cool = ("" if n["not_hot_s"] is None else
                f"; no host cause for {n['not_hot_s']:.0f}s of {host['bound_s']:.0f}s")
        lines.append(f"  {n['node']}: level {n['level'] or '(breach dwell)'} for "
                     f"{n['for_s']:.0f}s, {n['why'] or 'cause ' + (n['cause'] or '?')}{cool}"
                     + (f" ({n['capped']})" if n["capped"] else ""))
    for j in host["limited"][:50]:
        over = "  -- PAST ITS BOUND" if j["for_s"] >= host["bound_s"] else ""
        lines.append(f"  job {j['job']} host-limited (level {j['level']}) on {j['node']} for "
                     f"{j['for_s']:.0f}s (bound {host['bound_s']:.0f}s), "
                     f"{j['host_cause'] or 'host'} behind inference job {j['cause'] or '?'}"
                     f"{over}")
    return lines


def ladder_lines(st: Dict[str, Any]) -> List[str]:
    """``monitor status``'s ladder section: always there, "nothing" when nothing stands."""
    if not st["steps"]:
        return ["ladder: off (no steps)"] + host_lines(st)
    lines = [f"ladder: {len(st['gpus'])} GPU(s) at a step, {len(st['restrained'])} training "
             f"job(s) restrained (bound ends them: {st['on_bound']})"]
    last = st.get("last_cycle_s")
    if st["restrained"] or st["gpus"]:
        lines.append("  the monitor's last cycle: " + (
            "never" if last is None else f"{last:.0f}s ago") + " (a monitor that is not "
            "running releases nothing: each node ends a restraint at its bound)")
    for g in st["gpus"][:20]:
        cool = ("" if g["not_hot_s"] is None else
                f"; cause not hot for {g['not_hot_s']:.0f}s of {g['bound_s']:.0f}s")
        lines.append(f"  {g['gpu']}: {g['step'] or '(breach dwell)'} for {g['for_s']:.0f}s, "
                     f"{g['why'] or 'cause ' + (g['cause'] or '?')}{cool}"
                     + (f" ({g['capped']})" if g["capped"] else ""))
        if g.get("diagnosis"):
            lines.append(f"    diagnosis: {g['diagnosis']['text']}")
    for j in st["restrained"][:50]:
        held = j["suspended_s"] if j["step"] == "suspend" else j["throttled_s"]
        over = "  -- PAST ITS BOUND" if held is not None and held >= j["bound_s"] else ""
        done = "suspended" if j["step"] == "suspend" else "throttled"
        lines.append(f"  job {j['job']} {done} on {j['gpu']} for {held:.0f}s (bound "
                     f"{j['bound_s']:.0f}s), cause inference job {j['cause'] or '?'}{over}")
    return lines + host_lines(st)


def status_lines(st: Dict[str, Any]) -> List[str]:
    now_s = float(st.get("now", 0.0))
    lines = [f"admission: {st['admission']}"
             f"{' (unknown data admits training)' if st['unknown_admits'] else ''}",
             f"held: {st['holds']}" + (f", oldest {st['oldest_hold_s']:.0f}s"
                                       if st["oldest_hold_s"] is not None else ""),
             f"kept off hot nodes: {st['excluded_jobs']} job(s)",
             f"closed to training: {', '.join(st['closed'][:20]) or 'nothing'}",
             *_unknown_lines(st, now_s),
             f"lent: {', '.join(st['lent'][:20]) or 'none'}",
             f"starts this interval: {st['starts_this_interval'][0]} "
             f"(at least {st['starts_this_interval'][1]} allowed; a backlog drains in "
             f"{st['backlog_drain_s']:g}s)"]
    for name, (n, limit) in st["limits_per_hour"].items():
        lines.append(f"{name}: {n} in the last hour (limit {limit})"
                     + ("  -- LIMIT REACHED" if n >= limit else ""))
    for scope, (n, limit) in st["gate_opens_this_hour"].items():
        lines.append(f"gate {scope} opened {n} time(s) this hour (limit {limit})"
                     + ("  -- LIMIT REACHED" if n >= limit else ""))
    lines.append(f"minimum dwell: {st['dwell_s']:g}s")
    if "ladder" in st:
        lines += ladder_lines(st["ladder"])
    return lines


def _unknown_lines(st: Dict[str, Any], now_s: float) -> List[str]:
    """Unknown data, said once: "none" only when no scope, no node's telemetry and no
    signal of the last cycle is unknown (the exported ``unknown_signals`` counts the same)."""
    scopes = ", ".join(f"{k} (for {now_s - v:.0f}s)"
                       for k, v in sorted(st["unknown_since"].items())[:20])
    nodes = st.get("unknown_telemetry") or {}
    signals = st.get("unknown_signals") or {}
    if not (scopes or nodes or signals):
        return ["unknown data: none"]
    lines = [f"unknown data: {scopes or 'no admission scope'}"]
    if nodes:
        lines.append(f"unknown telemetry: {len(nodes)} node(s): " + ", ".join(
            f"{n} ({v['reason'] or '?'}"
            + (f", for {v['for_s']:.0f}s)" if v.get("for_s") is not None else ")")
            for n, v in sorted(nodes.items())[:20]))
    if signals:
        lines.append(f"unknown signals last cycle: {sum(signals.values())}: " + ", ".join(
            f"{k} x{n}" for k, n in sorted(signals.items())[:20]))
    return lines


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=2, sort_keys=True)
