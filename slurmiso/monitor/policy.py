"""The monitor's policy (thresholds, from the config) and its memory.

``Policy`` is read-only input to :func:`~slurmiso.monitor.decide.decide`; ``Memory`` is what
the monitor must remember between cycles (dwell timers, the holds *it* placed, nodes it lent,
a MIG re-layout in progress). Memory is JSON so a restarted monitor picks up where it was and
never releases a hold an admin or user placed. The actions it takes are
:mod:`slurmiso.monitor.actions` (``Action`` is imported from here too).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.config.model import LADDER_STEPS, Config, JobClass, Ladder
from slurmiso.monitor.admission_state import Cap, Gate, Hold, Loan
from slurmiso.monitor.ladder_state import HostLimited, HostRung, Restraint, Rung
from slurmiso.restraints import OnBound

#: How new training is kept away from hot GPUs: per node (ExcNodeList), held, or QoS-capped.
ADMISSIONS = ("nodes", "hold", "qos-limit")
#: Pool modes where suspending training frees what inference shares with it (SMs): on MIG a
#: suspended job keeps its instance, so the ladder goes from throttle to requeue there.
SUSPEND_MODES = ("mps", "timeslice")


@dataclass(frozen=True)
class SloLimit:
    """A class's SLO. ``p99_latency_ms`` and ``max_error_rate`` are checked per job on the
    agents' signals (the ladder); the P99 class-wide too, where a latency query measures
    it (``class_latency``)."""

    class_name: str
    max_queue_wait_s: Optional[float] = None
    p99_latency_ms: Optional[float] = None
    max_error_rate: Optional[float] = None
    #: A latency query measures the class-wide P99: only then is it admission's limit (one
    #: that nothing measures would be unknown forever, and so admit no training).
    class_latency: bool = True
    #: The latency signal the per-job limit judges: e2e, ttft or itl.
    signal: str = "e2e"


@dataclass(frozen=True)
class StepPolicy:
    """One ladder step: dwell before taking it and before stepping back, and its budget
    (:class:`~slurmiso.config.model.LadderStep`, in seconds as floats)."""

    name: str
    after_s: float = 0.0
    release_after_s: float = 300.0
    per_job: int = 0
    per_hour: int = 0
    #: How long the step may stand without a hot cause (or, on the node, a live monitor).
    max_s: float = 3600.0


#: The ladder's defaults: the config's (``monitor.ladder`` left out), one definition.
_LADDER = Ladder()


@dataclass(frozen=True)
class HostRungPolicy:
    """The host rung (issue 36): how many levels the nodes define
    (``monitor.ladder.host_limit.levels``; 0, the default: the rung never acts), the dwell
    before each level and before stepping back, its budgets and its bound."""

    levels: int = 0
    after_s: float = float(_LADDER.host_limit.after_s)
    release_after_s: float = float(_LADDER.host_limit.release_after_s)
    per_job: int = _LADDER.host_limit.per_job
    per_hour: int = _LADDER.host_limit.per_hour
    max_s: float = float(_LADDER.host_limit.max_s)

    @classmethod
    def of(cls, ladder: Ladder) -> HostRungPolicy:
        h = ladder.host_limit
        return cls(len(h.levels), float(h.after_s), float(h.release_after_s), h.per_job,
                   h.per_hour, float(h.max_s))


@dataclass(frozen=True)
class LadderPolicy:
    """The ladder: its steps in order (none: it never acts), hysteresis and signals."""

    steps: Tuple[StepPolicy, ...] = tuple(
        StepPolicy(st.name, float(st.after_s), float(st.release_after_s), st.per_job,
                   st.per_hour, float(st.max_s)) for st in _LADDER.steps)
    hysteresis_pct: float = float(_LADDER.hysteresis_pct)
    throttle_signal: str = _LADDER.throttle_signal
    unthrottle_signal: str = _LADDER.unthrottle_signal
    #: How a restraint past its step's ``max_s`` ends.
    on_bound: OnBound = OnBound(_LADDER.on_bound)
    #: The host rung: off (no levels) unless the nodes define what a level writes.
    host: HostRungPolicy = HostRungPolicy()

    @classmethod
    def of(cls, ladder: Ladder) -> LadderPolicy:
        """The policy a checked ``monitor.ladder`` states."""
        return cls(tuple(StepPolicy(st.name, float(st.after_s), float(st.release_after_s),
                                    st.per_job, st.per_hour, float(st.max_s))
                         for st in ladder.steps),
                   float(ladder.hysteresis_pct), ladder.throttle_signal,
                   ladder.unthrottle_signal, OnBound(ladder.on_bound),
                   HostRungPolicy.of(ladder))

    def to_config(self) -> Dict[str, Any]:
        """This ladder as ``monitor.ladder``'s YAML mapping (what ``--set ladder.*`` edits
        before the config's checker reads it back)."""
        out: Dict[str, Any] = {"steps": list(self.names()),
                               "hysteresis": _plain(self.hysteresis_pct),
                               "throttle_signal": self.throttle_signal,
                               "unthrottle_signal": self.unthrottle_signal,
                               "on_bound": self.on_bound.value}
        for st in self.steps:
            out[st.name] = {"after": _plain(st.after_s),
                            "release_after": _plain(st.release_after_s),
                            "max": _plain(st.max_s)}
            if st.name != "hold":  # hold has no budget (it gates new training only)
                out[st.name].update(per_job=st.per_job, per_hour=st.per_hour)
        return out

    def step(self, name: str) -> Optional[StepPolicy]:
        for st in self.steps:
            if st.name == name:
                return st
        return None

    def names(self) -> Tuple[str, ...]:
        return tuple(st.name for st in self.steps)


def _plain(x: float) -> Any:
    """A whole number as an int (as YAML would write it), else the float."""
    return int(x) if float(x).is_integer() else x


@dataclass(frozen=True)
class Policy:
    """Thresholds and scope of every policy (percentages 0..100, durations seconds)."""

    memory_used_pct: float = 75
    sm_active_pct: float = 85
    hysteresis_pct: float = 10
    min_dwell_s: float = 300
    stagger_max_starts: int = 4
    stagger_interval_s: float = 60
    #: Telemetry older than this is stale: no admission change rests on it.
    max_data_age_s: float = 90
    #: The agents' latency window (``monitor.signals.window_s``, default 60): a calm figure
    #: proves calm over the window before it, which lets the ladder's calm dwell go on
    #: across a gap in what the monitor saw (0: nothing proven beyond the figure's own age).
    signal_window_s: float = 60.0
    train_classes: Tuple[str, ...] = ("train",)
    slo: Tuple[SloLimit, ...] = ()
    #: (inference partition, training partition) pairs whose idle nodes may be lent.
    lend: Tuple[Tuple[str, str], ...] = ()
    #: Idle nodes each inference partition keeps for bursts (never lent).
    lend_reserve: int = 0
    #: Per mig-static pool: (layout name, ((profile, count per node), ...)) candidates.
    mig_layouts: Dict[str, Tuple[Tuple[str, Tuple[Tuple[str, int], ...]], ...]] = field(
        default_factory=dict)
    drain_timeout_s: float = 3600
    #: Nodes whose leftovers this monitor host can reconcile, and how often (0 = never).
    reconcile_nodes: Tuple[str, ...] = ()
    reconcile_every_s: float = 0
    #: "hold" pending training jobs, or "qos-limit": cap ``train_qos`` at what training uses.
    admission: str = "hold"
    #: The QoS of the training classes (capped in "qos-limit" admission).
    train_qos: Tuple[str, ...] = ("train",)
    #: GRES the cap counts (``GrpTRES=gres/gpu=N,...``): those the pools use, so every one
    #: is in AccountingStorageTRES (sacctmgr rejects a TRES it does not track).
    cap_tres: Tuple[str, ...] = ("gpu", "shard", "mps")
    #: A re-layout requeues the training jobs on its node once it has drained this long
    #: (None: it waits for every job).
    preempt_training_after_s: Optional[float] = None
    #: Unknown or stale telemetry admits no new training there (False, the default), or
    #: admits as if calm (True: an explicit choice of utilisation over safety).
    unknown_admits: bool = False
    #: A backlog of held training jobs is released within about this long (the release rate
    #: grows with the backlog and with free GPUs; never below stagger_max_starts).
    backlog_drain_s: float = 3600
    #: Per-hour limits: partition updates (lending; a reclaim is never refused), MIG
    #: re-layouts per pool, and gate openings per scope (a closing is never refused).
    partition_updates_per_hour: int = 6
    relayouts_per_hour: int = 2
    gate_opens_per_hour: int = 2
    #: Release the BeginTime of requeued training jobs once the preempting job runs. OFF by
    #: default: measured on 22.05, a requeued job started within AuthInfo cred_expire on the
    #: node it just left gets no Prolog run (slurmd still caches its credential), so it would
    #: start with no isolation record and be refused. Shorten cred_expire instead (that wait
    #: IS the BeginTime delay); turn this on only where the Prolog is known to rerun.
    release_requeue_delay: bool = False
    #: The ladder on running training where an inference job breaches its SLO.
    ladder: LadderPolicy = LadderPolicy()

    @property
    def release_memory_pct(self) -> float:
        return self.memory_used_pct - self.hysteresis_pct

    @property
    def release_sm_pct(self) -> float:
        return self.sm_active_pct - self.hysteresis_pct


def policy_from_config(
    cfg: Config,
    lend: Sequence[Tuple[str, str]] = (),
    lend_reserve: int = 0,
    reconcile_nodes: Sequence[str] = (),
    reconcile_every_s: float = 0,
    drain_timeout_s: float = 3600,
) -> Policy:
    """The policy a :class:`~slurmiso.config.model.Config` states, plus the deployment choices
    the config has no key for (which partitions lend to which, where reconcile runs)."""
    from slurmiso.slurm.slurmconf import gres_types

    mon = cfg.monitor
    train = [c for c in cfg.classes if c.preemptible]
    return Policy(
        memory_used_pct=mon.thresholds.memory_used_pct,
        sm_active_pct=mon.thresholds.sm_active_pct,
        hysteresis_pct=mon.thresholds.hysteresis_pct,
        min_dwell_s=mon.min_dwell_s,
        stagger_max_starts=mon.stagger.max_starts,
        stagger_interval_s=mon.stagger.interval_s,
        max_data_age_s=max(3 * mon.interval_s, 60),
        signal_window_s=float(mon.signals.window_s),
        train_classes=tuple(c.name for c in train),
        # Per job, the agents' signals measure latency and errors without any query;
        # class-wide, the P99 is measured only where a latency query says how.
        slo=tuple(SloLimit(s.class_name, s.max_queue_wait_s, s.p99_latency_ms,
                           s.max_error_rate, bool(s.latency_query), s.signal)
                    for s in mon.slo),
        lend=tuple(lend),
        lend_reserve=lend_reserve,
        mig_layouts=mig_candidates(cfg),
        drain_timeout_s=drain_timeout_s,
        reconcile_nodes=tuple(reconcile_nodes),
        reconcile_every_s=reconcile_every_s,
        admission=mon.admission,
        train_qos=tuple(dict.fromkeys(c.qos.name for c in train)),
        cap_tres=tuple(gres_types(cfg.pools)) or ("gpu",),
        preempt_training_after_s=(float(mon.relayout.preempt_after_s)
                                  if mon.relayout.drain == "preempt-training" else None),
        unknown_admits=mon.unknown_admits,
        backlog_drain_s=float(mon.stagger.backlog_drain_s),
        partition_updates_per_hour=mon.limits.partition_updates_per_hour,
        relayouts_per_hour=mon.limits.relayouts_per_hour,
        gate_opens_per_hour=mon.limits.gate_opens_per_hour,
        ladder=LadderPolicy.of(mon.ladder),
    )


def override(policy: Policy, assignments: Sequence[str],
             cfg: Optional[Config] = None) -> Policy:
    """``--set KEY=VALUE`` on any policy knob, typed from its current value; UsageError
    naming the key and the knobs there are. With ``cfg``, a ladder override is also checked
    against its classes (a throttle signal that is a checkpoint signal)."""
    import dataclasses

    from slurmiso.errors import UsageError

    changes: Dict[str, Any] = {}
    knobs = {f.name: f for f in dataclasses.fields(policy) if f.name != "ladder"}
    ladder_items: List[Tuple[str, str, str]] = []
    for item in assignments:
        key, sep, text = item.partition("=")
        key = key.strip().replace("-", "_")
        if sep and key.startswith("ladder."):
            ladder_items.append((item, key, text.strip()))
            continue
        if not sep or key not in knobs:
            what = "expected KNOB=VALUE" if not sep else f"no policy knob {key!r}"
            raise UsageError(f"--set {item!r}: {what}",
                             hint="knobs: " + ", ".join(sorted(knobs)) + LADDER_KNOBS)
        current = getattr(policy, key)
        try:
            if isinstance(current, bool):
                if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(text)
                value: Any = text.lower() in ("true", "1", "yes")
            elif isinstance(current, int):
                value = int(text)
            elif isinstance(current, float) or (current is None and key.endswith("_s")):
                value = None if text.lower() == "none" else float(text)
            elif isinstance(current, str):
                value = text
            elif isinstance(current, tuple) and all(isinstance(x, str) for x in current):
                value = tuple(x for x in text.split(",") if x)
            else:
                raise UsageError(f"--set {key}: this knob is not settable from the command line")
        except ValueError:
            raise UsageError(f"--set {key}={text!r}: not a {type(current).__name__}") from None
        changes[key] = value
    if changes.get("admission", policy.admission) not in ADMISSIONS:
        raise UsageError(f"--set admission={changes['admission']!r}: one of "
                         + ", ".join(ADMISSIONS))
    ladder = (_override_ladder(policy.ladder, ladder_items, cfg.classes if cfg else ())
              if ladder_items else policy.ladder)
    return dataclasses.replace(policy, ladder=ladder, **changes)


LADDER_KNOBS = ("; ladder.steps=hold,throttle,... ladder.hysteresis_pct=N "
                "ladder.throttle_signal=URG ladder.unthrottle_signal=WINCH "
                "ladder.on_bound=resume|requeue "
                "ladder.<step>.after_s|release_after_s|max_s|per_job|per_hour=N")
#: ``--set ladder.<step>.KNOB`` -> the step's key under ``monitor.ladder`` (both spellings).
_STEP_KEYS = {"after_s": "after", "release_after_s": "release_after", "after": "after",
              "release_after": "release_after", "per_job": "per_job", "per_hour": "per_hour",
              "max_s": "max", "max": "max"}
_TOP_KEYS = {"hysteresis_pct": "hysteresis", "hysteresis": "hysteresis",
             "throttle_signal": "throttle_signal", "unthrottle_signal": "unthrottle_signal",
             "on_bound": "on_bound"}


def _override_ladder(ladder: LadderPolicy, items: Sequence[Tuple[str, str, str]],
                     classes: Sequence[JobClass] = ()) -> LadderPolicy:
    """``--set ladder.KNOB=V`` / ``ladder.<step>.KNOB=V`` (``items``: the argument, its key,
    its value), applied to the ladder as its ``monitor.ladder`` mapping and read back by the
    config's own checker (:func:`slurmiso.config.loader.read_ladder`): an override is
    refused exactly where the same value in the file would be, with the same words."""
    from slurmiso.config.loader import LADDER_PATH, read_ladder, throttle_signal_problems
    from slurmiso.errors import ConfigError, UsageError

    raw = ladder.to_config()
    wrote: List[Tuple[str, str]] = []  # (argument, the monitor.ladder key it set)
    per_step: List[Tuple[str, str]] = []  # (argument, step): the step must be in steps
    for item, key, text in items:
        parts = key.split(".")[1:]
        if parts == ["steps"]:
            raw["steps"] = [x.strip() for x in text.split(",") if x.strip()]
            wrote.append((item, "steps"))
        elif len(parts) == 1 and parts[0] in _TOP_KEYS:
            name = _TOP_KEYS[parts[0]]
            raw[name] = text.upper() if name.endswith("_signal") else _scalar(text)
            wrote.append((item, name))
        elif len(parts) == 2 and parts[0] in LADDER_STEPS and parts[1] in _STEP_KEYS:
            name = _STEP_KEYS[parts[1]]
            section = raw.get(parts[0])
            raw[parts[0]] = dict(section) if isinstance(section, dict) else {}
            raw[parts[0]][name] = _scalar(text)
            wrote.append((item, f"{parts[0]}.{name}"))
            per_step.append((item, parts[0]))
        else:
            raise UsageError(f"--set {item!r}: no ladder knob", hint=LADDER_KNOBS.lstrip("; "))
    try:
        checked = read_ladder(raw)
        cross = [f"{key}: {msg}" for key, msg in throttle_signal_problems(classes, checked)]
        if cross:
            raise ConfigError("the ladder's signals", problems=cross)
    except ConfigError as exc:
        first = exc.problems[0] if exc.problems else str(exc)
        more = f" (and {len(exc.problems) - 1} more)" if len(exc.problems) > 1 else ""
        key = first.split(": ", 1)[0]
        culprits = [item for item, name in wrote
                    if key == f"{LADDER_PATH}.{name}" or key.startswith(
                        f"{LADDER_PATH}.{name}.")] or [item for item, _ in wrote]
        raise UsageError(f"--set {' '.join(culprits)}: {first}{more}") from None
    names = [st.name for st in checked.steps]
    for item, step in per_step:
        if step not in names:
            raise UsageError(f"--set {item}: {step!r} is not in ladder.steps "
                             f"({','.join(names) or 'none'})")
    import dataclasses

    # the host rung is not among the knobs: the levels are the nodes' own config
    return dataclasses.replace(LadderPolicy.of(checked), host=ladder.host)


def _scalar(text: str) -> Any:
    """A command-line value as YAML would read it: a whole number, a number, else text."""
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def mig_candidates(
    cfg: Config,
) -> Dict[str, Tuple[Tuple[str, Tuple[Tuple[str, int], ...]], ...]]:
    """Per mig-static pool, every configured layout the pool's GPU model can hold, as
    per-node profile counts (what Slurm will see as typed ``gres/gpu``)."""
    from slurmiso.gpu.profiles import lookup_model

    out: Dict[str, Tuple[Tuple[str, Tuple[Tuple[str, int], ...]], ...]] = {}
    for pool in cfg.pools:
        if pool.mode != "mig-static":
            continue
        model = lookup_model(pool.gpu_model)
        if model is None:
            continue
        cands = []
        for layout in cfg.mig_layouts:
            counts: Dict[str, int] = {}
            fits = True
            for index in range(pool.gpus_per_node):
                group = layout.for_device(index)
                if group is None or not group.mig_enabled:
                    continue
                for profile, n in group.mig_devices:
                    if model.profile(profile) is None:
                        fits = False
                    counts[profile] = counts.get(profile, 0) + n
            if fits and counts:
                cands.append((layout.name, tuple(sorted(counts.items()))))
        out[pool.name] = tuple(cands)
    return out


@dataclass
class Memory:
    """What the monitor remembers between cycles (and restarts): all JSON-able."""

    #: job id -> the hold this monitor placed on it.
    holds: Dict[str, Hold] = field(default_factory=dict)
    #: Jobs someone else released (or re-excluded) after we acted: never touched again by
    #: us. Pruned to the jobs still pending, so it is bounded by the queue, not a count.
    overridden: List[str] = field(default_factory=list)
    #: scope (a :class:`~slurmiso.monitor.gates.Scope`'s key: partition name, "node:<name>"
    #: or "slo") -> its gate.
    gates: Dict[str, Gate] = field(default_factory=dict)
    #: Scopes whose data is stale now (no admission change while listed).
    stale: List[str] = field(default_factory=list)
    release_times: List[float] = field(default_factory=list)
    idle_since: Dict[str, float] = field(default_factory=dict)
    #: node -> its loan to a training partition.
    lent: Dict[str, Loan] = field(default_factory=dict)
    mig_mismatch_since: Dict[str, float] = field(default_factory=dict)
    mig_last: Dict[str, float] = field(default_factory=dict)
    #: {"node", "pool", "layout", "phase", "since", "reason"} while a re-layout runs.
    relayout: Optional[Dict[str, Any]] = None
    reconciled: Dict[str, float] = field(default_factory=dict)
    #: qos-limit admission: QoS -> the cap this monitor set on it.
    caps: Dict[str, Cap] = field(default_factory=dict)
    #: nodes admission: job id -> {"nodes": what we set, "user": the job's own ExcNodeList,
    #: "comment": the job's own comment}.
    excluded: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: Rate-limited events: key ("partition-update", "relayout:<pool>", "open:<scope>") ->
    #: timestamps within the last hour.
    events: Dict[str, List[float]] = field(default_factory=dict)
    #: When the last cycle ran (arrivals are jobs submitted after it); None before the first.
    last_ts: Optional[float] = None
    #: Training jobs running at the last cycle (a pending one among them was requeued).
    running_train: List[str] = field(default_factory=list)
    #: Actions being applied: written before acting, cleared after, so a restart after a
    #: crash or SIGTERM reconciles them with what Slurm shows.
    intent: List[List[str]] = field(default_factory=list)
    #: Requeued training jobs waiting out their BeginTime: job id -> when first seen.
    requeued: Dict[str, float] = field(default_factory=dict)
    #: Scope (node, partition, "slo") -> since when its data has been unknown.
    unknown_since: Dict[str, float] = field(default_factory=dict)
    #: The ladder: GPU ("node/index") -> the step in force there and its timers.
    ladder: Dict[str, Rung] = field(default_factory=dict)
    #: Training jobs the ladder throttles or suspends: job id -> since when and why.
    restrained: Dict[str, Restraint] = field(default_factory=dict)
    #: Jobs someone else resumed (or unthrottled) after the ladder acted: never touched by
    #: the ladder again (pruned to the jobs that still run).
    ladder_exempt: List[str] = field(default_factory=list)
    #: node -> {"since": when its telemetry turned unknown, "reason": "source/reason"}:
    #: every node of a pool, whatever admission makes of it (slurmiso.monitor.unknown).
    telemetry_unknown: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    #: "source/reason" -> signals unknown in the last cycle: what ``monitor status`` and
    #: the exported ``unknown_signals`` both show.
    unknown_signals: Dict[str, int] = field(default_factory=dict)
    #: The host rung (issue 36): node -> its level and timers.
    host_rungs: Dict[str, HostRung] = field(default_factory=dict)
    #: Training jobs the host rung limits: job id -> on which node, at which level, why.
    host_limited: Dict[str, HostLimited] = field(default_factory=dict)

    def to_dict(self) -> Dict[str, Any]:
        """JSON for the state file: the records as the dicts they have always been."""
        out: Dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _WRITTEN_WHEN_SET and not value:
                continue  # a state file the version before wrote saves unchanged
            if f.name in _RECORDS:
                out[f.name] = {k: r.to_dict() for k, r in value.items()}
            else:
                out[f.name] = copy.deepcopy(value)
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Memory:
        """The memory a state file holds, this version's or an earlier one's (whose
        records were plain dicts with the same keys)."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        for name, record in _RECORDS.items():
            known[name] = {str(k): record.from_dict(v)
                           for k, v in (known.get(name) or {}).items()}
        return cls(**known)

    def copy(self) -> Memory:
        """A copy whose containers are new; inner records are shared, so :func:`decide`
        replaces a record instead of changing it (cheap with 20,000 holds)."""
        return Memory(dict(self.holds), list(self.overridden), dict(self.gates),
                      list(self.stale), list(self.release_times), dict(self.idle_since),
                      dict(self.lent), dict(self.mig_mismatch_since), dict(self.mig_last),
                      dict(self.relayout) if self.relayout else None, dict(self.reconciled),
                      dict(self.caps), dict(self.excluded),
                      {k: list(v) for k, v in self.events.items()}, self.last_ts,
                      list(self.running_train), list(self.intent), dict(self.requeued),
                      dict(self.unknown_since), dict(self.ladder), dict(self.restrained),
                      list(self.ladder_exempt), dict(self.telemetry_unknown),
                      dict(self.unknown_signals), dict(self.host_rungs),
                      dict(self.host_limited))

    def count(self, key: str, now: float) -> int:
        """Events of ``key`` within the hour before ``now`` (older ones are dropped)."""
        recent = [t for t in self.events.get(key, ()) if t > now - 3600]
        if recent:
            self.events[key] = recent
        else:
            self.events.pop(key, None)
        return len(recent)

    def note(self, key: str, now: float) -> None:
        self.events[key] = self.events.get(key, []) + [now]


#: Memory's fields added after the state file's first version: written only when set.
_WRITTEN_WHEN_SET = ("telemetry_unknown", "unknown_signals", "host_rungs", "host_limited")
#: Memory's fields of records, and the record each holds (JSON through to_dict/from_dict).
_RECORDS: Dict[str, Any] = {"holds": Hold, "gates": Gate, "lent": Loan, "caps": Cap,
                            "ladder": Rung, "restrained": Restraint,
                            "host_rungs": HostRung, "host_limited": HostLimited}
