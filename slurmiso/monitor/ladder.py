"""The ladder on running training (pure): where an inference job breaches its SLO, the
training jobs sharing its GPU are slowed, then stopped, only as far as the breach needs.

Per GPU that an inference job of an SLO class shares with training, one step at a time:

1. ``hold``: no new training on the node (admission excludes it, naming the job and signal);
2. ``throttle``: the training jobs there are asked to slow down (a signal the wrapper owns);
3. ``suspend`` (MPS and time-slice pools only: on MIG a suspended job keeps its instance):
   ``scontrol suspend``;
4. ``requeue``: ``scontrol requeue`` (the wrapper checkpoints on the SIGTERM); the job starts
   again elsewhere, since hold keeps it off this node.

A step is taken once the breach (per-job P99 latency or error rate above the SLO) has lasted
that step's ``after_s`` at the step below; the ladder steps back, in reverse, after
``release_after_s`` below the SLO by the hysteresis margin. Between the two it holds
position; so it does on unknown or stale signals: no step and no release. Two shortcuts,
both on facts rather than on hope: once every inference job behind a rung has left the GPU
(Slurm no longer shows it running there: ``GONE``, not unknown), the rung is released within
the cycle; and a calm dwell steps back past rungs that restrain nobody there any more (the
requeued job is gone: one dwell, not one per rung). A calm dwell goes on across a gap in
what the monitor saw (it was down, or the signals were unknown) only where the agents'
latency windows prove the gap calm. Escalations are
budgeted per hour, in all and per job on either side (the training job acted on, the
inference job whose breach asks for it), lowest Slurm priority first; releases never are.
Inference jobs are never acted on, and a job's signals reach only the training jobs on its
own GPUs (:mod:`slurmiso.monitor.attribution`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Set, Tuple

from slurmiso.config.model import LADDER_STEPS, SHARED_MODES
from slurmiso.exposition.histogram import quantile
from slurmiso.exposition.job_series import JobSignals, unknown_fields
from slurmiso.host.diagnosis import Diagnosis
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.attribution import Attribution, gpu_key
from slurmiso.monitor.bound import annotate, end_unhot
from slurmiso.monitor.contention import diagnose_breach, elsewhere, record
from slurmiso.monitor.ladder_state import Restraint, Rung
from slurmiso.monitor.policy import (
    SUSPEND_MODES,
    Memory,
    Policy,
    SloLimit,
    StepPolicy,
)
from slurmiso.monitor.slo_share import Verdict, judge
from slurmiso.monitor.snapshot import JobInfo, NodeInfo, ParkSeen, Snapshot

HOT, CALM, BETWEEN, UNKNOWN = "hot", "calm", "between", "unknown"
#: A GPU whose rung has no cause left: every inference job behind it has ended or left the
#: node as Slurm shows it (never said of a job that is merely silent: that is UNKNOWN).
GONE = "gone"
_RANK = {HOT: 0, UNKNOWN: 1, BETWEEN: 2, CALM: 3, GONE: 4}
_THROTTLE = LADDER_STEPS.index("throttle")


@dataclass(frozen=True)
class Breach:
    """The verdict on one inference job (or a GPU: its worst job's): HOT, CALM, BETWEEN or
    UNKNOWN, which signal, its figure and limit, and a reason naming the job."""

    kind: str
    job: str = ""
    signal: str = ""
    figure: Optional[float] = None
    limit: Optional[float] = None
    why: str = ""
    job_class: str = ""
    #: CALM only: since when the agents' series prove the calm (the oldest sample window
    #: behind the figures); None where nothing older than now is proven.
    calm_from: Optional[float] = None
    #: HOT only, where the node's agent exports host figures: where the contention is
    #: (issue 36). With the host rung configured, a host cause moves that rung and keeps
    #: a GPU's rung at throttle when the heaviest suspect is elsewhere.
    diagnosis: Optional[Diagnosis] = field(default=None, compare=False)

    @property
    def ratio(self) -> float:
        return (self.figure or 0.0) / self.limit if self.limit else 0.0


def limits(slo: SloLimit) -> List[Tuple[str, float]]:
    """The per-job limits of a class: (JobSignals field, limit)."""
    return [(n, float(v)) for n, v in (("p99_ms", slo.p99_latency_ms),
                                       ("error_rate", slo.max_error_rate))
            if v is not None]


def _text(signal: str, value: float, limit: float) -> str:
    if signal == "error_rate":
        return f"error rate {value:.1%} (SLO {limit:.1%})"
    return f"P99 {value:.0f} ms (SLO {limit:g} ms)"


#: What :func:`_judge` names instead of a figure: the signals are too old, or idle.
_STALE, _IDLE = "(age)", "(idle)"
#: A verdict on one limit: (kind, the figure's name, its value, its limit, words).
_Verdict = Tuple[str, str, Optional[float], Optional[float], str]
_SHARE_KIND = {Verdict.HOT: HOT, Verdict.BETWEEN: BETWEEN, Verdict.CALM: CALM,
               Verdict.UNKNOWN: UNKNOWN}
_LATENCY_WORDS = {"e2e": "latency", "ttft": "time to first token",
                  "itl": "inter-token latency"}


def _latency(sig: JobSignals, slo: SloLimit, limit: float, margin: float,
             told: FrozenSet[str]) -> _Verdict:
    """The latency limit as users state it: at most 1 % of requests slower than ``limit`` ms
    of the SLO's signal, judged on the window's buckets, per model, the worst deciding
    (:mod:`slurmiso.monitor.slo_share`). A summary-only server (no buckets) is judged on its
    own P99 (end to end only)."""
    words = _LATENCY_WORDS.get(slo.signal, slo.signal)
    hists = sig.window(slo.signal)
    if hists:
        worst_v: Optional[_Verdict] = None
        for model, hist in sorted(hists.items()):
            j = judge(hist, limit / 1000.0, 0.01, 1.0 - margin)
            kind = _SHARE_KIND[j.verdict]
            p99 = quantile(0.99, hist) if j.verdict != Verdict.UNKNOWN else None
            shown = f"{words}{f' of model {model}' if model else ''}: {j.why}" + (
                f", P99 about {p99 * 1000:.0f} ms" if p99 is not None else "")
            v = (kind, "p99_ms", None if p99 is None else p99 * 1000.0, limit, shown)
            if worst_v is None or _RANK[kind] < _RANK[worst_v[0]]:
                worst_v = v
        assert worst_v is not None
        return worst_v
    if slo.signal != "e2e" or sig.p99_ms is None or "p99_ms" in told:
        return UNKNOWN, "p99_ms", None, limit, f"its {words} is unknown"
    value = float(sig.p99_ms)
    kind = HOT if value > limit else CALM if value <= limit * margin else BETWEEN
    return kind, "p99_ms", value, limit, _text("p99_ms", value, limit)


def _judge(sig: JobSignals, slo: SloLimit, policy: Policy) -> _Verdict:
    """The one judgement of a job's signals against its class's per-job SLO: (HOT, CALM,
    BETWEEN or UNKNOWN; the figure nearest its limit, or the unknown one; its value; its
    limit; words). Cheap enough for every job every cycle; :func:`job_verdict` words it."""
    age = sig.latency_age_s
    if age is None or age > policy.max_data_age_s:
        return UNKNOWN, _STALE, None, None, ""
    if sig.requests is not None and sig.requests <= 0:
        return CALM, _IDLE, None, None, ""
    told = unknown_fields(sig.unknown)
    margin = 1.0 - policy.ladder.hysteresis_pct / 100.0
    verdicts: List[_Verdict] = []
    if slo.p99_latency_ms is not None:
        verdicts.append(_latency(sig, slo, float(slo.p99_latency_ms), margin, told))
    if slo.max_error_rate is not None:
        limit = float(slo.max_error_rate)
        value = sig.error_rate
        if value is None or "error_rate" in told:
            verdicts.append((UNKNOWN, "error_rate", None, limit, "its error rate is unknown"))
        else:
            kind = HOT if value > limit else CALM if value <= limit * margin else BETWEEN
            verdicts.append((kind, "error_rate", value, limit, _text("error_rate", value, limit)))
    if not verdicts:
        return CALM, "", None, None, ""
    return min(verdicts, key=lambda v: (_RANK[v[0]], -((v[2] or 0.0) / v[3] if v[3] else 0.0)))


def job_verdict(jid: str, sig: Optional[JobSignals], slo: SloLimit,
                policy: Policy) -> Breach:
    """One inference job against its class's per-job SLO. A figure that is missing, named
    unknown by the agent, older than ``max_data_age_s``, or whose buckets cannot tell is
    unknown (never calm, never hot); a job that served no request at all in the window is
    calm (no one is waiting on it)."""
    if sig is None:
        return Breach(UNKNOWN, jid, why=f"no signals from inference job {jid}")
    kind, name, value, limit, words = _judge(sig, slo, policy)
    if name == _STALE:
        age = sig.latency_age_s
        return Breach(UNKNOWN, jid, why=(
            f"inference job {jid}'s signals are "
            f"{'of unknown age' if age is None else f'{age:.0f}s old'} "
            f"(limit {policy.max_data_age_s:g}s)"))
    if name == _IDLE:
        return Breach(CALM, jid, why=f"inference job {jid} served no requests")
    if kind == UNKNOWN:
        return Breach(UNKNOWN, jid, name, None, limit, f"inference job {jid}: {words}",
                      slo.class_name)
    if limit is None:
        return Breach(kind, jid, why=f"inference job {jid} has no per-job limit")
    return Breach(kind, jid, name, value, limit, words, slo.class_name)


def worst(verdicts: List[Breach]) -> Breach:
    """A GPU's verdict from its inference jobs': the hottest breach, else unknown, else
    between, else calm."""
    return min(verdicts, key=lambda b: (_RANK[b.kind], -b.ratio))


def node_steps(policy: Policy, node: Optional[NodeInfo]) -> Tuple[StepPolicy, ...]:
    """The steps that apply on ``node``: park and suspend only where GPUs are shared by SMs
    (on MIG the training job's memory and SMs are its own instance's)."""
    mode = node.mode if node is not None else ""
    return tuple(st for st in policy.ladder.steps
                 if st.name not in ("park", "suspend") or mode in SUSPEND_MODES)


def _index(steps: Tuple[StepPolicy, ...], name: str) -> int:
    """Position of ``name`` among ``steps``; a step no longer configured counts as the
    nearest configured one below it (-1: none)."""
    if not name:
        return -1
    rank = LADDER_STEPS.index(name)
    return sum(1 for st in steps if LADDER_STEPS.index(st.name) <= rank) - 1


def ladder(snap: Snapshot, policy: Policy, mem: Memory,
           who: Attribution) -> Tuple[List[Action], Dict[str, str]]:
    """This cycle's ladder actions, and the nodes where it holds new training (node -> why
    a user can read)."""
    now = snap.ts
    memory_last_ts = mem.last_ts  # the cycle before this one (decide sets it after)
    nodes = {n.name: n for n in snap.nodes}
    slos = {s.class_name: s for s in policy.slo if limits(s)}
    exempt = {j for j in mem.ladder_exempt if j in who.live}
    if not policy.ladder.steps and mem.ladder:
        mem.ladder = {}  # the ladder is off: every restraint is released below
    infer_jobs = _inference_on_gpus(snap, policy, mem, who, slos)
    verdicts = {key: (_gpu_verdict(key, snap, policy, mem, who, slos, infer_jobs, nodes),
                      key.rpartition("/")[0], int(key.rpartition("/")[2]))
                for key in set(infer_jobs) | set(mem.ladder)}
    # -- a rung whose cause has not been hot for its step's max_s ends (issue 33) ---------
    bounded = end_unhot(mem, verdicts, policy, now, who.live)
    victims = _victims(mem, who, verdicts, exempt)
    # -- move each rung one step at most --------------------------------------------------
    for key in sorted(verdicts):
        v, at, gpu = verdicts[key]
        # a host cause placed off this GPU: the host rung acts, this rung stops at throttle
        host = elsewhere(v.diagnosis, gpu) if policy.ladder.host.levels else ""
        _move(mem, key, v, node_steps(policy, nodes.get(at)), now, victims.get(key, []),
              at, gpu, (memory_last_ts, policy.max_data_age_s), host)
    # -- what each training job should be, and the actions that get it there ------------
    actions = bounded + _restrain(snap, policy, mem, who, verdicts, victims, exempt)
    annotate(actions, mem, policy)
    mem.ladder_exempt = sorted(exempt)
    _prune_events(mem, now)
    return actions, _held_nodes(policy, mem)


def _inference_on_gpus(snap: Snapshot, policy: Policy, mem: Memory, who: Attribution,
                       slos: Dict[str, SloLimit]) -> Dict[str, List[str]]:
    """The GPUs to look at (where a rung stands, or an SLO inference job breaches now) and
    every SLO inference job on each: the worst decides."""
    infer_jobs: Dict[str, List[str]] = {}
    if policy.ladder.steps:
        look = {k.rsplit("/", 1)[0] for k in mem.ladder}
        for jid, sig in snap.job_signals.items():
            info = who.live.get(jid)
            if info is not None and info.job_class in slos and \
                    _judge(sig, slos[info.job_class], policy)[0] == HOT:
                look.update(info.nodes)
        for jid, info in who.live.items():
            if info.job_class in slos and not look.isdisjoint(info.nodes):
                for on, gpu in who.gpus_of.get(jid, ()):
                    if on in look:
                        infer_jobs.setdefault(gpu_key(on, gpu), []).append(jid)
    for key, rung in mem.ladder.items():
        if rung.cause and key not in infer_jobs:
            live = who.live.get(rung.cause)
            if live is not None and key.rsplit("/", 1)[0] in live.nodes:
                infer_jobs[key] = [rung.cause]  # sticky: its node's labels may be missing
    return infer_jobs


def _gpu_verdict(key: str, snap: Snapshot, policy: Policy, mem: Memory, who: Attribution,
                 slos: Dict[str, SloLimit], infer_jobs: Dict[str, List[str]],
                 nodes: Dict[str, NodeInfo]) -> Breach:
    """One GPU's verdict: its inference jobs' worst, unless its node is gone, no longer
    shared, or silent, or its rung's cause has gone."""
    node_name, _, index = key.rpartition("/")
    node = nodes.get(node_name)
    fresh = node is not None and node.telemetry_age_s is not None and \
        node.telemetry_age_s <= policy.max_data_age_s
    gone = None if key in infer_jobs or key not in mem.ladder else \
        cause_gone(mem.ladder[key], node_name, snap, who, slos, fresh)
    if node is None or node.mode not in SHARED_MODES:
        return Breach(CALM, why=f"{node_name} is no longer a shared pool's node")
    if gone is not None:
        return gone
    if not fresh:
        return Breach(UNKNOWN, why=f"no fresh telemetry from {node_name}")
    if key not in infer_jobs:
        return Breach(CALM, why=f"no inference job left on {node_name} GPU {index}")
    v = worst([job_verdict(j, snap.job_signals.get(j), slos[who.live[j].job_class], policy)
               for j in infer_jobs[key]])
    if v.kind == CALM:
        v = dataclasses.replace(v, calm_from=calm_proven_from(
            [snap.job_signals.get(j) for j in infer_jobs[key]], snap.ts,
            policy.signal_window_s))
    elif v.kind == HOT and v.job and snap.host_nodes:
        v = dataclasses.replace(v, diagnosis=diagnose_breach(snap, who, node_name, v.job))
    return v


def _victims(mem: Memory, who: Attribution, verdicts: Dict[str, Tuple[Breach, str, int]],
             exempt: Set[str]) -> Dict[str, List[JobInfo]]:
    """The training on each GPU, and the jobs restrained there while they live on its
    node (sticky)."""
    victims: Dict[str, List[JobInfo]] = {}
    for key, (_, at, gpu) in verdicts.items():
        victims[key] = [j for j in who.jobs_on(at, gpu)
                        if j.job_class in who.train and j.id not in exempt]
    for jid, rec in mem.restrained.items():
        held = who.live.get(jid)
        key = gpu_key(rec.node, rec.gpu)
        if held is not None and rec.node in held.nodes and key in victims and \
                all(j.id != jid for j in victims[key]):
            victims[key].append(held)
    return victims


def _held_nodes(policy: Policy, mem: Memory) -> Dict[str, str]:
    """The nodes where the ladder holds new training (its ``hold`` step), with why."""
    blocked: Dict[str, str] = {}
    if "hold" in policy.ladder.names():
        for key, rung in sorted(mem.ladder.items()):
            node_name = key.rsplit("/", 1)[0]
            if rung.step and node_name not in blocked:
                blocked[node_name] = rung.why
    return blocked


def _applied(rec: Optional[Restraint], step: str) -> bool:
    """Whether ``step`` holds for the job: a park the node refused is held by the suspend
    standing in for it, and a parked job needs no suspend (its GPU work is stopped)."""
    if rec is None:
        return step == "hold"
    if step == "throttle":
        return rec.throttled_since is not None
    if step == "park":
        return rec.parked_since is not None or (
            bool(rec.park_refused) and rec.suspended_since is not None)
    if step == "suspend":
        return rec.suspended_since is not None or rec.parked_since is not None
    return step == "hold"


def _move(mem: Memory, key: str, v: Breach, steps: Tuple[StepPolicy, ...], now: float,
          victims: List[JobInfo], node: str, index: int,
          seen: Tuple[Optional[float], float] = (None, 0.0), host: str = "") -> None:
    """One GPU's rung after this verdict (see the module doc). ``seen``: when the cycle
    before this one ran, and how old data may be (what makes two cycles consecutive);
    ``host``: why the rung may not climb past throttle (the contention is on the host)."""
    rung = mem.ladder.get(key)
    if rung is None and v.kind != HOT:
        return
    if v.kind == GONE:  # nothing left to protect: every step goes now
        mem.ladder.pop(key, None)
        return
    if v.kind in (UNKNOWN, BETWEEN):  # hold position: neither dwell goes on
        # unknown keeps when calm began (a later calm figure may prove the gap calm);
        # a figure between the SLO and calm ends it
        calm = (rung.calm_since, rung.calm_seen) if rung is not None and v.kind == UNKNOWN \
            else (None, None)
        if rung is not None and (rung.breach_since, rung.calm_since, rung.calm_seen) != \
                (None,) + calm:
            mem.ladder[key] = dataclasses.replace(rung, breach_since=None, calm_since=calm[0],
                                                  calm_seen=calm[1])
        return
    old = rung or Rung()
    idx = _index(steps, old.step)
    if v.kind == CALM:
        calm_since = calm_start(old, v, now, *seen)
        cur = steps[idx].release_after_s if idx >= 0 else 0.0
        if now - max(calm_since, old.since) < cur:
            new = dataclasses.replace(old, breach_since=None, calm_since=calm_since,
                                      calm_seen=now)
        else:
            back = step_back(steps, idx, victims, mem)
            if back < 0:
                mem.ladder.pop(key, None)
                return
            new = dataclasses.replace(old, step=steps[back].name, since=now,
                                      breach_since=None, calm_since=now, calm_seen=now,
                                      capped="")
        mem.ladder[key] = new
        return
    breach_since = old.breach_since if old.breach_since is not None else now
    causes = old.causes or ((old.cause,) if old.cause else ())
    if v.job and v.job not in causes:
        causes = (causes + (v.job,))[-20:]
    new = dataclasses.replace(old, breach_since=breach_since, calm_since=None, calm_seen=None,
                              cause=v.job, causes=causes, signal=v.signal,
                              why=_where(v, node, index))
    if v.diagnosis is not None:  # the latest diagnosis; one without host figures keeps it
        new = dataclasses.replace(new, diagnosis=v.diagnosis.text,
                                  diagnosis_cause=v.diagnosis.cause.value)
    if idx + 1 < len(steps):
        nxt = steps[idx + 1]
        start = breach_since if rung is None else max(breach_since, old.since)
        lagging = [j.id for j in victims if not _applied(mem.restrained.get(j.id), old.step)]
        if now - start >= nxt.after_s and (nxt.name == "hold" or victims):
            if lagging and idx >= 0:
                new = dataclasses.replace(new, capped=(
                    f"{nxt.name} waits: {old.step} not yet applied to {','.join(lagging)}"
                    f"{' (' + old.capped + ')' if old.capped else ''}")[:200])
            elif host and LADDER_STEPS.index(nxt.name) > _THROTTLE:
                new = dataclasses.replace(new, capped=f"{nxt.name} waits: {host}"[:200])
            else:
                new = dataclasses.replace(new, step=nxt.name, since=now, capped="",
                                          figure=old.figure if rung else v.figure,
                                          limit=old.limit if rung else v.limit)
    if new != rung:
        mem.ladder[key] = new


def cause_gone(rung: Rung, node: str, snap: Snapshot, who: Attribution,
               slos: Dict[str, SloLimit], fresh: bool) -> Optional[Breach]:
    """A GONE verdict when every inference job behind ``rung`` has left its node as Slurm
    shows it (ended, cancelled, requeued, moved), else None. Called only where no live
    SLO job is attributed to the GPU. Where the node's telemetry is not fresh, which GPU a
    job holds is unknown, so any SLO inference job running on the node keeps the rung."""
    causes = rung.causes or ((rung.cause,) if rung.cause else ())
    if not causes:
        return None
    for jid in causes:
        live = who.live.get(jid)
        if live is not None and node in live.nodes:
            return None
    if not fresh and any(j.job_class in slos and node in j.nodes
                         for j in who.live.values() if j.job_class not in who.train):
        return None
    states = {j.id: j.state for j in snap.jobs if j.id in causes}
    words = []
    for jid in causes:
        state = states.get(jid)
        words.append(f"inference job {jid} " + (
            "has ended" if state is None else
            f"is {state.lower()}, no longer running" if state not in ("RUNNING", "SUSPENDED")
            else f"no longer runs on {node}"))
    return Breach(GONE, rung.cause or causes[-1], why="; ".join(words))


def calm_proven_from(sigs: List[Optional[JobSignals]], now: float,
                     window_s: float) -> Optional[float]:
    """Since when the calm of a GPU's inference jobs is proven by their own series: each
    calm figure covers the agent's window before its sample (``latency_age_s`` ago), so
    the GPU's calm is proven from the latest such start; None where a job's age is
    unknown."""
    window = window_s if math.isfinite(window_s) and window_s > 0 else 0.0
    start: Optional[float] = None
    for sig in sigs:
        age = sig.latency_age_s if sig is not None else None
        if age is None or not math.isfinite(age) or age < 0:
            return None
        begin = now - age - window
        start = begin if start is None else max(start, begin)
    return start


def calm_start(old: Rung, v: Breach, now: float, last_ts: Optional[float],
               max_age_s: float) -> float:
    """When this calm began, counting only calm that is proven: the calm seen at the cycle
    before goes on (as it always did); across a gap (the monitor was down, the signals were
    unknown) it goes on only where the agents' windows reach back to the last calm the
    monitor saw; otherwise from what the windows prove, never before that last calm."""
    seen = old.calm_seen
    if old.calm_since is None or seen is None:
        return now
    if seen == last_ts and now - seen <= max_age_s:
        return old.calm_since  # consecutive cycles, both calm
    if v.calm_from is not None and v.calm_from <= seen:
        return old.calm_since  # the gap is inside the windows behind this calm figure
    if v.calm_from is not None:
        return min(now, max(v.calm_from, seen))
    return now


def step_back(steps: Tuple[StepPolicy, ...], idx: int, victims: List[JobInfo],
              mem: Memory) -> int:
    """Where a calm dwell at ``steps[idx]`` steps back to: one step, past the steps that
    restrain nobody on this GPU any more. With no training left there (the ladder requeued
    it, or it ended) the rung goes altogether (-1): the dwell just served was measured with
    no training on the GPU, as the hold's own would be."""
    if idx <= 0 or not victims:
        return -1
    back = idx - 1
    while back > 0 and not any(_applied(mem.restrained.get(j.id), steps[back].name)
                               for j in victims):
        back -= 1
    return back


def _where(v: Breach, node: str, gpu: int) -> str:
    """The cause as a user reads it: which inference job, where, which signal."""
    return f"inference job {v.job} on {node} GPU {gpu}: {v.why}"


def _order(job: JobInfo) -> Tuple[float, float, str]:
    """Who gives way first: lowest Slurm priority, then the youngest."""
    return (job.priority, -job.submit_ts, job.id)


def _restrain(snap: Snapshot, policy: Policy, mem: Memory, who: Attribution,
              verdicts: Dict[str, Tuple[Breach, str, int]], victims: Dict[str, List[JobInfo]],
              exempt: Set[str]) -> List[Action]:
    """Each training job to the step its GPU's rung asks for (the highest of its GPUs'),
    lowest Slurm priority first, within the budgets; the actions that get it there."""
    now = snap.ts
    nodes = {n.name: n for n in snap.nodes}
    want: Dict[str, Tuple[int, str]] = {}  # job -> (ladder index wanted, GPU key)
    for key, jobs in victims.items():
        rung = mem.ladder.get(key)
        level = LADDER_STEPS.index(rung.step) if rung is not None and rung.step else -1
        for j in jobs:
            if level > want.get(j.id, (-1, ""))[0]:
                want[j.id] = (level, key)
    actions: List[Action] = []
    todo = sorted(set(want) | set(mem.restrained),
                  key=lambda j: _order(who.live[j]) if j in who.live else (0.0, 0.0, j))
    for jid in todo:
        rec = mem.restrained.get(jid)
        level, key = want.get(jid, (-1, gpu_key(rec.node, rec.gpu) if rec else ""))
        settled = _not_ours(jid, rec, who.live.get(jid), verdicts.get(key), mem, exempt, now)
        if settled is not None:
            actions += settled
            continue
        turn = _Turn.of(jid, rec, key, level, verdicts, nodes, policy, mem, now,
                        who.live[jid].state == "SUSPENDED", snap.parks.get(jid))
        if not turn.requeue():
            turn.park_or_unpark()
            turn.throttle_or_unthrottle(resumed_now=turn.suspend_or_resume())
            turn.keep()
        actions += turn.actions
    return actions


def _not_ours(jid: str, rec: Optional[Restraint], job: Optional[JobInfo],
              verdict: Optional[Tuple[Breach, str, int]], mem: Memory, exempt: Set[str],
              now: float) -> Optional[List[Action]]:
    """The actions for a job the ladder leaves alone this cycle (it ended or moved, someone
    else resumed or suspended it, it is exempt); None for a job it restrains or may."""
    if job is None or (rec is not None and rec.node not in job.nodes):
        if rec is None:
            return []
        del mem.restrained[jid]  # ended, cancelled, or requeued by someone else
        return [_end(jid, rec, now, "it no longer runs there", verdict)]
    if jid in exempt:
        return []
    suspended_now = job.state == "SUSPENDED"
    if rec is not None and rec.suspended_since is not None and not suspended_now:
        del mem.restrained[jid]  # someone resumed it: theirs from now on
        exempt.add(jid)
        return [_end(jid, rec, now, "someone else resumed it: the ladder leaves it alone "
                     "from now on", verdict)]
    if suspended_now and (rec is None or rec.suspended_since is None):
        return []  # suspended by someone else: never ours to resume or requeue
    return None


@dataclass
class _Turn:
    """One training job's turn in :func:`_restrain`: the steps wanted for it, the verdict on
    its GPU and the restraint it has; each step is taken (within its budget) or released."""

    jid: str
    rec: Restraint
    v: Breach
    key: str
    steps: Dict[str, StepPolicy]
    wanted: Set[str]
    suspended_now: bool
    now: float
    policy: Policy
    mem: Memory
    #: What the job's node says of its park (None: nothing, or its agent unread).
    seen: Optional[ParkSeen] = None
    actions: List[Action] = field(default_factory=list)

    @classmethod
    def of(cls, jid: str, rec: Optional[Restraint], key: str, level: int,
           verdicts: Dict[str, Tuple[Breach, str, int]], nodes: Dict[str, NodeInfo],
           policy: Policy, mem: Memory, now: float, suspended_now: bool,
           seen: Optional[ParkSeen] = None) -> _Turn:
        node_name, _, index = key.rpartition("/")
        steps = {st.name: st for st in node_steps(policy, nodes.get(node_name))}
        v = verdicts.get(key, (Breach(UNKNOWN), node_name, 0))[0]
        if rec is not None and rec.gone:  # the release it began goes on, unless hot again
            if v.kind == HOT:
                rec = dataclasses.replace(rec, gone="")
            else:
                v = Breach(GONE, rec.cause, why=rec.gone)
        rung = mem.ladder.get(key)
        hot = v.kind == HOT
        wanted: Set[str] = {n for n in ("throttle", "park", "suspend", "requeue")
                            if n in steps and level >= LADDER_STEPS.index(n)}
        rec = rec or Restraint(node_name, int(index), v.job or (rung.cause if rung else ""),
                               rung.why if rung else v.why, v.signal or
                               (rung.signal if rung else ""),
                               v.figure if hot else (rung.figure if rung else None))
        if "park" not in wanted and rec.park_refused and rec.parked_since is None:
            rec = dataclasses.replace(rec, park_refused="")  # stepped back: tried afresh
        if "park" in wanted and rec.park_refused and "suspend" in steps:
            wanted.add("suspend")  # the node would not park it: suspend stands in
        return cls(jid, rec, v, key, steps, wanted, suspended_now, now, policy, mem, seen)

    @property
    def hot(self) -> bool:
        return self.v.kind == HOT

    def _spend(self, step: str) -> Tuple[bool, str, List[str]]:
        """Take ``step`` from its budgets; a spent budget caps the rung (its reason)."""
        ok, note, keys = _spend(self.mem, self.steps[step], self.jid, self.v, self.now)
        if not ok:
            _cap(self.mem, self.key, note)
        return ok, note, keys

    def _take(self, kind: ActionKind, note: str, keys: List[str],
              extra: Dict[str, Any]) -> None:
        self.actions.append(_act(kind, self.jid, self.rec, self.v, self.now, note, keys, extra))

    def requeue(self) -> bool:
        """The last step, where wanted and hot: True once the job is requeued, or while its
        park is being released first (a parked program cannot write its checkpoint)."""
        if "requeue" not in self.wanted or not self.hot:
            return False
        if self.rec.parked_since is not None:
            self._unpark("released before its requeue: a parked program cannot checkpoint")
            self.keep()
            return True
        if self.seen is not None and self.seen.parked:
            _cap(self.mem, self.key, f"requeue waits: job {self.jid}'s processes are still "
                 "parked on its node")
            return True
        ok, note, keys = self._spend("requeue")
        if not ok:
            return False
        rec = self.rec
        self.mem.restrained.pop(self.jid, None)
        self._take(ActionKind.LADDER_REQUEUE, note, keys, {
            "suspended": self.suspended_now,
            "throttled_s": _since(rec.throttled_since, self.now),
            "suspended_s": _since(rec.suspended_since, self.now)})
        return True

    def park_or_unpark(self) -> None:
        """Park (a note the node turns into cuda-checkpoint) or release the park; a park the
        node refused is released and remembered, and suspend stands in for it."""
        rec = self.rec
        if rec.parked_since is not None and self.seen is not None \
                and self.seen.refuses(rec.parked_since):
            self._unpark("its node would not park it (the node's journal says why); "
                         "suspend stands in", refused=True)
            if "suspend" in self.steps:
                self.wanted.add("suspend")
        elif "park" in self.wanted and rec.parked_since is None and not rec.park_refused \
                and self.hot and not self.suspended_now:
            ok, note, keys = self._spend("park")
            if ok:
                self._take(ActionKind.PARK, note, keys, {})
                self.rec = dataclasses.replace(rec, parked_since=self.now)
        elif "park" not in self.wanted and rec.parked_since is not None:
            self._unpark("")

    def _unpark(self, why: str, refused: bool = False) -> None:
        rec = self.rec
        act = _release(ActionKind.UNPARK, self.jid, rec, self.v, self.now, "parked_s",
                       rec.parked_since or self.now)
        if why:
            act = Action(act.kind, act.target, f"training unparked: {why}"[:300],
                         dict(act.details, refused=refused) if refused else act.details)
        self.actions.append(act)
        self.rec = dataclasses.replace(rec, parked_since=None, park_refused=(
            "refused by its node" if refused else rec.park_refused))

    def suspend_or_resume(self) -> bool:
        """Suspend (throttled first, where wanted) or resume; True when resumed now (a step
        Slurm resumes still refuses signals for a moment). A parked job is not suspended:
        its GPU work is already stopped and its memory free."""
        rec, now = self.rec, self.now
        if "suspend" in self.wanted and rec.suspended_since is None and self.hot \
                and rec.parked_since is None:
            ok, note, keys = self._spend("suspend")
            if not ok:
                return False
            if "throttle" in self.wanted and rec.throttled_since is None:
                # throttled on the way, budget allowing (a spent throttle budget caps nothing)
                ok2, note2, keys2 = _spend(self.mem, self.steps["throttle"], self.jid, self.v,
                                           now)
                if ok2:
                    self._take(ActionKind.THROTTLE, note2, keys2,
                               {"sends": self.policy.ladder.throttle_signal})
                    self.rec = dataclasses.replace(self.rec, throttled_since=now)
            self._take(ActionKind.SUSPEND, note, keys,
                       {"instead_of": "park"} if rec.park_refused else {})
            self.rec = dataclasses.replace(self.rec, suspended_since=now)
            return False
        if "suspend" not in self.wanted and rec.suspended_since is not None:
            self.actions.append(_release(ActionKind.RESUME_JOB, self.jid, rec, self.v, now,
                                         "suspended_s", rec.suspended_since))
            self.rec = dataclasses.replace(rec, suspended_since=None,
                                           gone=self.v.why if self.v.kind == GONE else "")
            return True
        return False

    def throttle_or_unthrottle(self, resumed_now: bool) -> None:
        rec, now = self.rec, self.now
        if "throttle" in self.wanted and rec.throttled_since is None and self.hot \
                and not self.suspended_now:
            ok, note, keys = self._spend("throttle")
            if ok:
                self._take(ActionKind.THROTTLE, note, keys,
                           {"sends": self.policy.ladder.throttle_signal})
                self.rec = dataclasses.replace(rec, throttled_since=now)
        elif "throttle" not in self.wanted and rec.throttled_since is not None \
                and not resumed_now:
            # the cycle after a resume: slurmstepd drops a signal sent while its step is
            # still suspended (the resume reaches slurmd after scontrol returns)
            self.actions.append(_release(ActionKind.UNTHROTTLE, self.jid, rec, self.v, now,
                                         "throttled_s", rec.throttled_since,
                                         self.policy.ladder.unthrottle_signal))
            self.rec = dataclasses.replace(rec, throttled_since=None)

    def keep(self) -> None:
        """The restraint the job is left with, in memory."""
        rec = self.rec
        if not rec.held():
            self.mem.restrained.pop(self.jid, None)
        elif self.mem.restrained.get(self.jid) != rec:
            self.mem.restrained[self.jid] = rec


def _since(ts: Optional[float], now: float) -> Optional[float]:
    return None if ts is None else round(now - ts, 1)


def _cap(mem: Memory, key: str, note: str) -> None:
    rung = mem.ladder.get(key)
    if rung is not None and rung.capped != note:
        mem.ladder[key] = dataclasses.replace(rung, capped=note)


def _spend(mem: Memory, step: StepPolicy, victim: str, v: Breach,
           now: float) -> Tuple[bool, str, List[str]]:
    """Take one ``step`` from the budgets (in all, the training job's, the inference
    job's), or say which one is spent."""
    total, mine, theirs = (f"ladder:{step.name}", f"ladder:{step.name}:{victim}",
                           f"ladder:{step.name}:{v.job}")
    if mem.count(total, now) >= step.per_hour:
        return False, f"{step.name} budget spent: {step.per_hour} an hour in all", []
    if mem.count(mine, now) >= step.per_job:
        return False, f"{step.name} budget of job {victim} spent: {step.per_job} an hour", []
    if v.job and mem.count(theirs, now) >= step.per_job:
        return False, (f"{step.name} budget of inference job {v.job} spent: "
                       f"{step.per_job} an hour"), []
    keys = [total, mine, theirs] if v.job else [total, mine]
    for k in keys:
        mem.note(k, now)
    return True, f"{step.name} {mem.count(total, now)}/{step.per_hour} this hour", keys


def _prune_events(mem: Memory, now: float) -> None:
    """Per-job budget counters of jobs long gone go (the others prune as they count)."""
    old = [k for k, ts in mem.events.items()
           if k.startswith("ladder:") and (not ts or ts[-1] <= now - 3600)]
    for k in old:
        del mem.events[k]


_VERB = {ActionKind.THROTTLE: "throttled: asked to slow down",
         ActionKind.PARK: "parked: its CUDA processes' GPU memory to host (cuda-checkpoint)",
         ActionKind.SUSPEND: "suspended",
         ActionKind.LADDER_REQUEUE: "requeued: checkpoints, then starts again off this node"}


def _facts(rec: Restraint, v: Breach) -> Dict[str, Any]:
    """What the journal line says of the cause: which inference job, which signal, its
    figure now and when the job was first restrained (the audit counts these)."""
    out: Dict[str, Any] = {
        "gpu": gpu_key(rec.node, rec.gpu), "node": rec.node, "cause": v.job or rec.cause,
        "signal": v.signal or rec.signal, "figure": v.figure, "limit": v.limit,
        "figure_before": rec.figure}
    if v.signal == "p99_ms" and v.figure is not None:  # the audit's latency samples
        out.update(p99_latency_ms=v.figure, **{"class": v.job_class})
    if v.diagnosis is not None:  # where the contention is (issue 36); absent without figures
        out["diagnosis"] = record(v.diagnosis)
    return out


def _act(kind: ActionKind, jid: str, rec: Restraint, v: Breach, now: float, budget: str,
         keys: List[str], extra: Dict[str, Any]) -> Action:
    reason = f"training {_VERB[kind]}: {_where(v, rec.node, rec.gpu)}"
    return Action(kind, jid, reason[:300], dict(_facts(rec, v), step=kind.value, budget=budget,
                                                budget_keys=keys, restraint=rec.to_dict(),
                                                ts=now, **extra))


def _release(kind: ActionKind, jid: str, rec: Restraint, v: Breach, now: float, what: str,
             since: float, sends: str = "") -> Action:
    how = {ActionKind.RESUME_JOB: "resumed", ActionKind.UNPARK: "unparked"}.get(
        kind, "back to full speed")
    figure = "" if v.figure is None else f" ({_text(v.signal, v.figure, v.limit or 0)})"
    if v.kind == GONE:  # no figure to quote: the job it would be of is gone
        reason = (f"training {how} after {now - since:.0f}s on {rec.node} GPU {rec.gpu}: "
                  f"{v.why}")[:300]
    else:
        reason = (f"training {how} after {now - since:.0f}s: inference on {rec.node} GPU "
                  f"{rec.gpu} within its SLO{figure}")
    extra: Dict[str, Any] = {what: round(now - since, 1)}
    if v.kind == GONE:
        extra["cause_gone"] = True
    if sends:
        extra["sends"] = sends
    return Action(kind, jid, reason, dict(_facts(rec, v), step=kind.value,
                                          restraint=rec.to_dict(),
                                          ts=now, figure_after=v.figure, **extra))


def _end(jid: str, rec: Restraint, now: float, why: str,
         verdict: Optional[Tuple[Breach, str, int]]) -> Action:
    """A journal line, no Slurm call: the restraint ended without the ladder (job ended,
    someone resumed it), with how long it lasted."""
    v = verdict[0] if verdict else Breach(UNKNOWN)
    return Action(ActionKind.LADDER_END, jid, f"training restraint over: {why}",
                  dict(_facts(rec, v), restraint=rec.to_dict(), ts=now,
                       figure_after=v.figure, throttled_s=_since(rec.throttled_since, now),
                       suspended_s=_since(rec.suspended_since, now),
                       **({} if rec.parked_since is None else
                          {"parked_s": _since(rec.parked_since, now)})))
