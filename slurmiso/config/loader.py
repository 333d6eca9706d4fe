"""Strict loading of ``slurmiso.yaml`` into :class:`~slurmiso.config.model.Config`.

Every problem is collected (not just the first) and reported as one :class:`ConfigError` whose
lines read ``FILE: key.path: what is wrong (allowed: ...)`` — the admin fixes them all in one
pass. Unknown keys are errors, because a typo that is silently ignored is a policy that is
silently not applied.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, TypeVar

from slurmiso.config.model import (
    DEFAULT_LADDER_STEPS,
    ISOLATIONS,
    LADDER_STEPS,
    LATENCY_SIGNALS,
    ON_BOUND,
    POOL_MODES,
    SEVERITIES,
    SIGNALS,
    THROTTLE_SIGNALS,
    TIMESLICES,
    AuditSettings,
    Checkpoint,
    Config,
    GpuMemoryShare,
    GpuSettings,
    HostLimit,
    HostLimitLevel,
    HostQuota,
    JobClass,
    Ladder,
    LadderStep,
    Limits,
    Match,
    MigGroup,
    MigLayout,
    MonitorSettings,
    MpsPriority,
    MpsServer,
    MpsShare,
    Paths,
    Pool,
    QosSpec,
    Relayout,
    ServerProfile,
    SignalSettings,
    Slo,
    Stagger,
    TelemetrySettings,
    Thresholds,
)
from slurmiso.errors import ConfigError
from slurmiso.gpu import BACKEND_KINDS

DEFAULT_PATH = "/etc/slurmiso/slurmiso.yaml"
T = TypeVar("T")
MISSING = object()


def config_path(explicit: Optional[str] = None) -> str:
    """The config file to use: explicit, else ``$SLURMISO_CONFIG``, else the default."""
    return explicit or os.environ.get("SLURMISO_CONFIG") or DEFAULT_PATH


class _Problems:
    """Collects problems as ``key.path: message`` lines."""

    def __init__(self) -> None:
        self.errors: List[str] = []
        self.warnings: List[str] = []

    def add(self, path: str, msg: str) -> None:
        self.errors.append(f"{path}: {msg}" if path else msg)

    def warn(self, path: str, msg: str) -> None:
        self.warnings.append(f"{path}: {msg}" if path else msg)


class Section:
    """A mapping being read: typed getters that record problems and track unknown keys."""

    def __init__(self, data: Any, path: str, problems: _Problems) -> None:
        self.path = path
        self.p = problems
        if data is None:
            data = {}
        if not isinstance(data, dict):
            problems.add(path, f"expected a mapping, got {_show(data)}")
            data = {}
        self.data: Dict[str, Any] = data
        self.seen: Set[str] = set()

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name

    def raw(self, name: str, default: Any = MISSING) -> Any:
        self.seen.add(name)
        if name not in self.data:
            if default is MISSING:
                self.p.add(self.key(name), "required key is missing")
                return None
            return default
        return self.data[name]

    def text(self, name: str, default: Any = MISSING, allowed: Sequence[str] = ()) -> str:
        v = self.raw(name, default)
        if v is None:
            return "" if default is MISSING else default
        if not isinstance(v, str):
            self.p.add(self.key(name), f"expected a string, got {_show(v)}")
            return "" if default is MISSING or default is None else default
        if allowed and v not in allowed:
            self.p.add(self.key(name), f"{v!r} is not allowed (allowed: {', '.join(allowed)})")
        return v

    def flag(self, name: str, default: bool) -> bool:
        v = self.raw(name, default)
        if not isinstance(v, bool):
            self.p.add(self.key(name), f"expected true or false, got {_show(v)}")
            return default
        return v

    def integer(self, name: str, default: Any, lo: int, hi: int) -> Any:
        v = self.raw(name, default)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            self.p.add(self.key(name), f"expected a whole number {lo}..{hi}, got {_show(v)}")
            return default
        if not lo <= v <= hi:
            self.p.add(self.key(name), f"{v} is out of range (allowed: {lo}..{hi})")
        return v

    def converted(self, name: str, default: Any, conv: Callable[[str], T], what: str) -> Any:
        v = self.raw(name, default)
        if v is None or v is default:
            return v
        try:
            return conv(str(v))
        except ValueError as exc:
            self.p.add(self.key(name), f"{_show(v)} is not a valid {what} ({exc})")
            return default

    def strlist(self, name: str) -> Tuple[str, ...]:
        v = self.raw(name, [])
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            self.p.add(self.key(name), f"expected a list of names, got {_show(v)}")
            return ()
        return tuple(v)

    def section(self, name: str) -> Section:
        return Section(self.raw(name, {}), self.key(name), self.p)

    def seq(self, name: str) -> List[Any]:
        v = self.raw(name, [])
        if not isinstance(v, list):
            self.p.add(self.key(name), f"expected a list, got {_show(v)}")
            return []
        return v

    def done(self) -> None:
        for k in self.data:
            if k not in self.seen:
                allowed = ", ".join(sorted(self.seen))
                self.p.add(self.key(str(k)), f"unknown key (allowed here: {allowed})")


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _duration(text: str) -> int:
    from slurmiso.units import parse_duration

    return int(parse_duration(text))


def _limit_text(share: MpsShare, limit_mb: int) -> str:
    return (f"{share.memory_limit_pct}% ({limit_mb} MiB)" if share.memory_limit_pct
            else f"{limit_mb} MiB")


def _share_pct(s: Section, name: str, raw: str) -> int:
    """``45%``: a whole percentage of the GPU's memory, 1 to 100."""
    text = raw.strip()[:-1].strip()
    if not text.isdigit() or not 1 <= int(text) <= 100:
        s.p.add(s.key(name), f"{raw!r} is not a share of the GPU's memory (a whole "
                "percentage from 1% to 100%, e.g. 45%)")
        return 0
    return int(text)


def _read_mps_server(s: Section) -> MpsServer:
    arrangements = {m.value: m for m in MpsServer}
    text = s.text("mps_server", MpsServer.PER_CLASS.value, allowed=tuple(arrangements))
    return arrangements.get(text, MpsServer.PER_CLASS)


def _read_priority(s: Section) -> Optional[MpsPriority]:
    """``mps.priority``: normal or below-normal (None: from the class, see MpsShare)."""
    words = {p.word: p for p in MpsPriority}
    text = s.text("priority", "", allowed=tuple(words) if "priority" in s.data else ())
    return words.get(text)


def _size(text: str) -> int:
    from slurmiso.units import parse_size

    return int(parse_size(text))


# ---------------------------------------------------------------------------------------------
# sections


def _read_class(s: Section) -> JobClass:
    name = s.text("name")
    m = s.section("match")
    match = Match(
        qos=m.strlist("qos"),
        partitions=m.strlist("partitions"),
        accounts=m.strlist("accounts"),
        spank_class=m.text("spank_class", ""),
    )
    m.done()
    isolation = s.text("isolation", "exclusive", ISOLATIONS)
    prof_raw = s.raw("mig_profile", "")
    profiles: Tuple[Tuple[str, str], ...] = ()
    if isinstance(prof_raw, str):
        profiles = (("*", prof_raw),) if prof_raw else ()
    elif isinstance(prof_raw, dict) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in prof_raw.items()
    ):
        profiles = tuple(prof_raw.items())
    else:
        s.p.add(s.key("mig_profile"), "expected a profile name or a mapping GPU model -> profile")
    mps_s = s.section("mps")
    raw_limit = mps_s.raw("memory_limit", 0)
    share = isinstance(raw_limit, str) and raw_limit.strip().endswith("%")
    mps = MpsShare(
        thread_percentage=mps_s.integer("thread_percentage", 100, 1, 100),
        memory_limit_mb=0 if share else mps_s.converted(
            "memory_limit", 0, _size, "memory size (e.g. 20G, or a share of the GPU: 45%)"),
        memory_limit_pct=_share_pct(mps_s, "memory_limit", raw_limit) if share else 0,
        priority=_read_priority(mps_s),
    )
    mps_s.done()
    preemptible = s.flag("preemptible", False)
    ckpt: Optional[Checkpoint] = None
    if "checkpoint" in s.data or preemptible:
        c = s.section("checkpoint")
        ckpt = Checkpoint(
            signal=c.text("signal", "USR2", SIGNALS).upper(),
            grace_s=c.converted("grace", 120, _duration, "duration (e.g. 120s)"),
            max_requeues=c.integer("max_requeues", 20, 0, 10_000),
            warn_before_limit_s=c.converted("warn_before_limit", 300, _duration, "duration"),
        )
        c.done()
        if ckpt.signal == "USR1":
            s.p.warn(c.key("signal"), "USR1 is used by NCCL; USR2 is safer for training jobs")
    q = s.section("qos")
    qos = QosSpec(
        name=q.text("name", name),
        priority=q.integer("priority", 0, 0, 2**31 - 1),
        preempt=q.strlist("preempt"),
        max_wall_s=q.converted("max_wall", None, _duration, "duration (e.g. 1d, 2-00:00:00)"),
        max_gpus_per_job=q.integer("max_gpus_per_job", None, 1, 100_000),
        accounts=q.strlist("accounts"),
    )
    q.done()
    cls = JobClass(
        name=name,
        description=s.text("description", ""),
        match=match,
        isolation=isolation,
        mig_profiles=profiles,
        mps=mps,
        memory_headroom_pct=s.integer("memory_headroom", 0, 0, 90),
        preemptible=preemptible,
        checkpoint=ckpt,
        qos=qos,
        host=_read_host_quota(s.section("host"), name, preemptible),
        gpu_memory=_read_gpu_memory(s.section("gpu_memory"), name),
    )
    if cls.gpu_memory.any() and isolation == "mig":
        s.p.add(s.key("gpu_memory"), f"class {name} runs on MIG instances, and the driver's "
                "memory partitions take whole GPUs only (MIG handles are refused): a MIG "
                "instance's memory is its own already; drop gpu_memory")
    s.done()
    return cls


def _gpu_size(s: Section, name: str) -> Tuple[int, int]:
    """(MiB, percent) of ``classes[].gpu_memory.<name>``: ``40G`` or ``45%``."""
    raw = s.raw(name, 0)
    if isinstance(raw, str) and raw.strip().endswith("%"):
        return 0, _share_pct(s, name, raw)
    mb = s.converted(name, 0, _size, "memory size (e.g. 40G, or a share of the GPU: 45%)")
    return int(mb), 0


def _read_gpu_memory(s: Section, name: str) -> GpuMemoryShare:
    """``classes[].gpu_memory``: the class's hard limit and guarantee on each whole GPU."""
    hard_mb, hard_pct = _gpu_size(s, "hard")
    soft_mb, soft_pct = _gpu_size(s, "soft")
    s.done()
    share = GpuMemoryShare(hard_mb=hard_mb, hard_pct=hard_pct, soft_mb=soft_mb,
                           soft_pct=soft_pct)
    both_pct, both_mb = hard_pct and soft_pct, hard_mb and soft_mb
    if (both_pct and soft_pct > hard_pct) or (both_mb and soft_mb > hard_mb):
        s.p.add(s.path, f"class {name}: the soft limit (what the job is guaranteed) is above "
                "the hard limit (what it may never pass): the driver refuses that; lower "
                "soft or raise hard")
    return share


def _quota_weight(s: Section, name: str) -> Optional[int]:
    """1..100 on the cgroup v2 scale: a quota only lowers the default weight (100)."""
    v = s.raw(name, None)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 100:
        s.p.add(s.key(name), f"expected a weight 1..100 (the cgroup v2 scale, where every job "
                f"has 100: a quota only lowers it), got {_show(v)}")
        return None
    return v


def _job_memory_pct(s: Section, name: str) -> Optional[int]:
    """``90%``: a share of the memory Slurm gave the job (its ``memory.max``)."""
    v = s.raw(name, None)
    if v is None:
        return None
    text = v.strip()[:-1].strip() if isinstance(v, str) and v.strip().endswith("%") else ""
    if not text.isdigit() or not 1 <= int(text) <= 100:
        s.p.add(s.key(name), f"expected a share of the job's memory (--mem), a whole "
                f"percentage 1% to 100% (e.g. 90%), got {_show(v)}")
        return None
    return int(text)


def _read_host_quota(s: Section, name: str, preemptible: bool) -> HostQuota:
    """``classes[].host``: the class's CPU and IO weight and memory high-water mark."""
    quota = HostQuota(cpu_weight=_quota_weight(s, "cpu_weight"),
                      io_weight=_quota_weight(s, "io_weight"),
                      memory_high_pct=_job_memory_pct(s, "memory_high"))
    s.done()
    if quota.any() and not preemptible:
        s.p.add(s.path, f"class {name} is not preemptible: host quotas hold training back "
                "so it cannot fill the host, and are never written for inference (give "
                "them to the training classes, or make this one preemptible)")
    return quota


MIG_MODES = ("mig-static", "mig-dynamic")


def _read_pool(s: Section) -> Pool:
    from slurmiso.gpu.profiles import lookup_model
    from slurmiso.hostlist import HostlistError, expand

    nodes = s.text("nodes", "")
    names: Tuple[str, ...] = ()
    try:
        names = tuple(expand(nodes)) if nodes else ()
    except HostlistError as exc:
        s.p.add(s.key("nodes"), str(exc))
    feature = s.text("feature", "")
    if not nodes and not feature:
        s.p.add(s.path, "a pool needs `nodes:` (a Slurm hostlist) or `feature:`")
    # Optional: exclusive, mps and timeslice pools work on any NVIDIA GPU, named or not (the
    # node's NVML says what it is); MIG pools need the model's profile table.
    model_raw = s.text("gpu_model", "").strip()
    model = lookup_model(model_raw) if model_raw else None
    pool = Pool(
        name=s.text("name"),
        nodes=nodes,
        node_names=names,
        feature=feature,
        partition=s.text("partition"),
        gpu_model=model.name if model else model_raw,
        gpus_per_node=s.integer("gpus_per_node", 8, 1, 64),
        mode=s.text("mode", allowed=POOL_MODES),
        mig_layout=s.text("mig_layout", ""),
        mps_shares_per_gpu=s.integer("mps_shares_per_gpu", 100, 1, 10_000),
        shards_per_gpu=s.integer("shards_per_gpu", 7, 1, 1_000),
        timeslice=s.text("timeslice", "", allowed=TIMESLICES if "timeslice" in s.data else ()),
        mps_server=_read_mps_server(s),
    )
    if pool.mps_server is MpsServer.SHARED and pool.mode != "mps":
        s.p.add(s.key("mps_server"), f"only an MPS pool has an MPS server (pool {pool.name} is "
                f"{pool.mode}): remove it, or set mode: mps")
    if pool.timeslice and pool.mode != "timeslice":
        s.p.add(s.key("timeslice"), f"only a timeslice pool's GPUs take turns by time slice "
                f"(pool {pool.name} is {pool.mode}): remove it, or set mode: timeslice")
    if pool.mode in MIG_MODES:
        _check_mig_model(s, pool, model)
    s.done()
    return pool


def _check_mig_model(s: Section, pool: Pool, model: Any) -> None:
    """A MIG pool's model must be one whose MIG table slurmiso has; say what to do if not."""
    from slurmiso.gpu.profiles import mig_models

    known = ", ".join(m.name for m in mig_models())
    if not pool.gpu_model:
        s.p.add(s.key("gpu_model"), f"required when mode is {pool.mode}: MIG profiles and "
                f"placements are per GPU model (allowed: {known})")
    elif model is None:
        s.p.add(s.key("gpu_model"), (
            f"{pool.gpu_model!r} has no MIG profile table in slurmiso (MIG models: {known}); "
            f"a {pool.mode} pool needs one: on a node of the pool, with MIG mode on, run "
            "'slurmiso mig show --profiles' (it lists the profiles and placements the driver "
            "reports, as a catalogue entry) and add that entry to slurmiso/gpu/catalogue.py; "
            "or use mode exclusive, mps or timeslice, which need no table"))
    elif not model.mig_capable:
        s.p.add(s.key("mode"), (
            f"{pool.mode} needs MIG, and {model.name} ({model.product_name}) does not support "
            f"MIG (MIG models: {known}); use mode exclusive, mps or timeslice"))


def _read_layouts(s: Section) -> Tuple[MigLayout, ...]:
    s.text("version", "v1", ("v1",))
    configs = s.section("mig-configs")
    layouts = []
    for name, groups in configs.data.items():
        configs.seen.add(name)
        path = configs.key(str(name))
        if not isinstance(groups, list) or not groups:
            configs.p.add(path, "expected a non-empty list of device groups")
            continue
        out = []
        for i, g in enumerate(groups):
            gs = Section(g, f"{path}[{i}]", s.p)
            dev = gs.raw("devices", "all")
            devices: Optional[Tuple[int, ...]] = None
            if dev != "all":
                if isinstance(dev, list) and all(isinstance(d, int) and d >= 0 for d in dev):
                    devices = tuple(dev)
                else:
                    gs.p.add(
                        gs.key("devices"),
                        f"expected `all` or a list of GPU indices, got {_show(dev)}",
                    )
            enabled = gs.flag("mig-enabled", False)
            md = gs.raw("mig-devices", {})
            counts: Tuple[Tuple[str, int], ...] = ()
            if isinstance(md, dict) and all(
                isinstance(k, str) and isinstance(v, int) and v >= 0 for k, v in md.items()
            ):
                counts = tuple((k, v) for k, v in md.items() if v)
            else:
                gs.p.add(
                    gs.key("mig-devices"), "expected a mapping profile -> count (e.g. 3g.40gb: 2)"
                )
            if counts and not enabled:
                gs.p.add(gs.key("mig-devices"), "MIG devices listed but mig-enabled is false")
            gs.done()
            out.append(MigGroup(devices, enabled, counts))
        layouts.append(MigLayout(str(name), tuple(out)))
    s.done()
    return tuple(layouts)


def _read_monitor(s: Section) -> MonitorSettings:
    t = s.section("thresholds")
    thresholds = Thresholds(
        memory_used_pct=t.integer("memory_used", 75, 1, 100),
        sm_active_pct=t.integer("sm_active", 85, 1, 100),
        hysteresis_pct=t.integer("hysteresis", 10, 0, 50),
    )
    t.done()
    st = s.section("stagger")
    stagger = Stagger(
        max_starts=st.integer("max_starts", 4, 1, 100_000),
        interval_s=st.converted("interval", 60, _duration, "duration"),
        backlog_drain_s=st.converted("backlog_drain", 3600, _duration, "duration"),
    )
    st.done()
    li = s.section("limits")
    limits = Limits(
        partition_updates_per_hour=li.integer("partition_updates_per_hour", 6, 0, 3600),
        relayouts_per_hour=li.integer("relayouts_per_hour", 2, 0, 3600),
        gate_opens_per_hour=li.integer("gate_opens_per_hour", 2, 1, 3600),
    )
    li.done()
    te = s.section("telemetry")
    telemetry = TelemetrySettings(
        source=te.text("source", "agents", ("agents", "prometheus")),
        agent_port=te.integer("agent_port", 9810, 1, 65535),
        prometheus_url=te.text("prometheus_url", ""),
        agent_addr=te.text("agent_addr", "127.0.0.1"),
        job_labels=te.flag("job_labels", False),
        agent_dcgm_names=te.flag("agent_dcgm_names", True),
        deadline_s=te.converted("deadline", 0, _duration, "duration"),
    )
    te.done()
    if telemetry.source == "prometheus" and not telemetry.prometheus_url:
        s.p.add(te.key("prometheus_url"), "required when source is prometheus")
    slos = []
    for i, item in enumerate(s.seq("slo")):
        ss = Section(item, f"{s.key('slo')}[{i}]", s.p)
        p99 = ss.raw("p99_latency_ms", None)
        if "p99_ms" in ss.data:  # the short name; one of the two
            if p99 is not None:
                ss.p.add(ss.key("p99_ms"), "given with p99_latency_ms: keep one of the two")
            p99 = ss.raw("p99_ms", None)
        slos.append(
            Slo(
                class_name=ss.text("class"),
                max_queue_wait_s=ss.converted("max_queue_wait", None, _duration, "duration"),
                p99_latency_ms=p99,
                latency_query=ss.text("latency_query", ""),
                max_error_rate=_fraction(ss, "max_error_rate"),
                signal=ss.text("signal", "e2e", LATENCY_SIGNALS),
            )
        )
        ss.done()
    rl = s.section("relayout")
    relayout = Relayout(
        drain=rl.text("drain", "wait", ("wait", "preempt-training")),
        preempt_after_s=rl.converted("preempt_after", 0, _duration, "duration"),
    )
    rl.done()
    mon = MonitorSettings(
        interval_s=s.converted("interval", 30, _duration, "duration"),
        dry_run=s.flag("dry_run", False),
        thresholds=thresholds,
        min_dwell_s=s.converted("min_dwell", 300, _duration, "duration"),
        stagger=stagger,
        telemetry=telemetry,
        slo=tuple(slos),
        admission=s.text("admission", "nodes", ("nodes", "hold", "qos-limit")),
        relayout=relayout,
        unknown_admits=s.flag("unknown_admits", False),
        limits=limits,
        ladder=_read_ladder(s.section("ladder")),
        signals=_read_signals(s.section("signals")),
    )
    s.done()
    return mon


def _fraction(s: Section, name: str) -> Optional[float]:
    v = s.raw(name, None)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        s.p.add(s.key(name), f"expected a fraction of requests 0 < x <= 1 (0.01 = 1 %), "
                f"got {_show(v)}")
        return None
    return float(v)


def _dwell(s: Section, name: str, default: int) -> int:
    v = s.raw(name, default)
    if isinstance(v, (int, float)) and not isinstance(v, bool) and v < 0:
        s.p.add(s.key(name), f"{v} is negative (a dwell is a duration >= 0, e.g. 90s, 5m)")
        return default
    got = s.converted(name, default, _duration, "duration")
    return default if got is None else int(got)


#: The longest bound a step may have: a week (a restraint longer than that is forgotten).
MAX_BOUND_S = 7 * 86400


def _bound(s: Section, default: int, release_after: int) -> int:
    """A step's ``max`` (or ``max_s``): how long it may stand without a hot cause or a live
    monitor. A duration > 0, at most a week, and not shorter than the step's own
    ``release_after`` (a bound below it would end a restraint before calm could)."""
    given = [k for k in ("max", "max_s") if k in s.data]
    s.seen.update(("max", "max_s"))
    if len(given) > 1:
        s.p.add(s.key("max_s"), "give max or max_s, not both (they are one setting)")
        return default
    if not given:
        return default
    name = given[0]
    v = s.data[name]
    if v is None or isinstance(v, bool) or (isinstance(v, (int, float)) and v <= 0):
        s.p.add(s.key(name), f"expected a duration > 0 (e.g. 30m, 1h), got {_show(v)}: a "
                "restraint must end some time; leave the key out for the default")
        return default
    got = s.converted(name, default, _duration, "duration")
    bound = default if got is None else int(got)
    if bound <= 0:
        s.p.add(s.key(name), f"expected a duration > 0 (e.g. 30m, 1h), got {_show(v)}")
        return default
    if bound > MAX_BOUND_S:
        s.p.add(s.key(name), f"{bound}s is out of range (allowed: 1s..{MAX_BOUND_S}s, a week)")
        return default
    if bound < release_after:
        s.p.add(s.key(name), f"{bound}s is shorter than release_after ({release_after}s): the "
                "bound would end the step before calm could release it")
    return bound


LADDER_PATH = "monitor.ladder"


def read_ladder(data: Any, path: str = LADDER_PATH) -> Ladder:
    """``monitor.ladder`` on its own, from its YAML mapping: the one checker of the ladder,
    so the monitor's ``--set ladder.*`` gets exactly the errors the file would (ConfigError,
    one ``key.path: what is wrong (allowed: ...)`` line per problem)."""
    p = _Problems()
    ladder = _read_ladder(Section(data, path, p))
    if p.errors:
        n = len(p.errors)
        raise ConfigError(f"{n} problem{'s' if n > 1 else ''} in {path}", problems=p.errors)
    return ladder


def throttle_signal_problems(classes: Sequence[JobClass],
                             ladder: Ladder) -> List[Tuple[str, str]]:
    """(key, problem) where a ladder that throttles would send a training class its own
    checkpoint signal (the cross-field rule of ``monitor.ladder``; ``--set`` asks it too)."""
    out = []
    if any(st.name == "throttle" for st in ladder.steps):
        for i, c in enumerate(classes):
            sig = c.checkpoint.signal if c.checkpoint else ""
            if c.preemptible and sig in (ladder.throttle_signal, ladder.unthrottle_signal):
                out.append((f"{LADDER_PATH}.throttle_signal",
                            f"{sig} is classes[{i}] ({c.name})'s checkpoint signal: a "
                            "throttle would ask it to checkpoint (use another of "
                            f"{', '.join(THROTTLE_SIGNALS)})"))
    return out


def _read_ladder(s: Section) -> Ladder:
    """``monitor.ladder``: which steps, in order, and each one's dwell and budget."""
    base = {st.name: st for st in Ladder.steps + (Ladder.park,)}
    raw = s.raw("steps", list(DEFAULT_LADDER_STEPS))
    names: List[str] = []
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        s.p.add(s.key("steps"), f"expected a list of steps ({', '.join(LADDER_STEPS)}), "
                f"got {_show(raw)}")
    else:
        for x in raw:
            if x not in LADDER_STEPS:
                s.p.add(s.key("steps"), f"unknown step {x!r} (allowed: "
                        f"{', '.join(LADDER_STEPS)})")
            elif x in names:
                s.p.add(s.key("steps"), f"{x!r} is listed twice")
            else:
                names.append(x)
        order = [LADDER_STEPS.index(x) for x in names]
        if order != sorted(order):
            s.p.add(s.key("steps"), f"steps go soft to hard, in the order "
                    f"{', '.join(LADDER_STEPS)} (got {', '.join(names)})")
        if names and names[0] != "hold":
            s.p.add(s.key("steps"), "hold must be the first step: without it new training "
                    "(and the job the ladder requeued) starts again on the GPU the ladder "
                    "is protecting")
    steps = []
    for name in LADDER_STEPS:
        if name not in s.data and name not in names:
            s.seen.add(name)
            continue
        st = s.section(name)
        d = base[name]
        if name not in names and name in s.data:
            s.p.warn(st.path, f"settings for {name!r} are unused: it is not in "
                     f"{s.key('steps')}")
        after = _dwell(st, "after", d.after_s)
        release = _dwell(st, "release_after", d.release_after_s)
        bound = _bound(st, d.max_s, release)
        per_job = per_hour = 0
        if name != "hold":  # hold gates new training only: it has no budget
            per_job = st.integer("per_job", d.per_job, 0, 100_000)
            per_hour = st.integer("per_hour", d.per_hour, 0, 1_000_000)
            for key, n in (("per_job", per_job), ("per_hour", per_hour)):
                if n == 0 and name in names:
                    st.p.add(st.key(key), f"0 would never let {name!r} happen: leave it "
                             f"out of {s.key('steps')} instead")
        st.done()
        if name in names:
            steps.append(LadderStep(name, after, release, per_job, per_hour, bound))
    throttle = s.text("throttle_signal", "URG", THROTTLE_SIGNALS)
    unthrottle = s.text("unthrottle_signal", "WINCH", THROTTLE_SIGNALS)
    if throttle == unthrottle:
        s.p.add(s.key("unthrottle_signal"), f"{unthrottle!r} is also the throttle_signal: "
                "the wrapper could not tell slow down from full speed")
    ladder = Ladder(steps=tuple(steps),
                    hysteresis_pct=s.integer("hysteresis", 10, 0, 90),
                    throttle_signal=throttle, unthrottle_signal=unthrottle,
                    on_bound=s.text("on_bound", "resume", ON_BOUND),
                    host_limit=_read_host_limit(s.section("host_limit")))
    s.done()
    return ladder


#: The most host-limit levels: the note's ``lvl=`` is one digit, 1..9.
MAX_HOST_LEVELS = 9
_DEVICE = re.compile(r"[0-9]{1,10}:[0-9]{1,10}")


def _read_host_limit(s: Section) -> HostLimit:
    """``monitor.ladder.host_limit``: what each level of the host rung writes on a node."""
    levels = []
    raw = s.seq("levels")
    if len(raw) > MAX_HOST_LEVELS:
        s.p.add(s.key("levels"), f"{len(raw)} levels (allowed: at most {MAX_HOST_LEVELS}, "
                "the note's lvl=1..9)")
    for i, item in enumerate(raw[:MAX_HOST_LEVELS]):
        levels.append(_read_host_level(Section(item, f"{s.key('levels')}[{i}]", s.p)))
    d = HostLimit()
    after = _dwell(s, "after", d.after_s)
    release = _dwell(s, "release_after", d.release_after_s)
    limit = HostLimit(levels=tuple(levels), after_s=after, release_after_s=release,
                      per_job=s.integer("per_job", d.per_job, 1, 100_000),
                      per_hour=s.integer("per_hour", d.per_hour, 1, 1_000_000),
                      max_s=_bound(s, d.max_s, release))
    s.done()
    return limit


def _read_host_level(s: Section) -> HostLimitLevel:
    cores = s.raw("cpu_cores", None)
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, (int, float))
                              or not 0.01 <= cores <= 4096):
        s.p.add(s.key("cpu_cores"), f"expected a number of cores 0.01..4096, got {_show(cores)}")
        cores = None
    mbps = []
    devices = s.section("io_mbps")
    for dev in devices.data:
        devices.seen.add(dev)
        if not isinstance(dev, str) or not _DEVICE.fullmatch(dev):
            devices.p.add(devices.key(str(dev)), "expected a block device as MAJ:MIN (e.g. 8:0, "
                          "from lsblk)")
            continue
        rate = devices.converted(dev, None, _size, "size per second (e.g. 100M)")
        if isinstance(rate, int) and rate > 0:
            mbps.append((dev, rate))
        elif rate is not None:
            devices.p.add(devices.key(dev), "expected a size per second above 0")
    level = HostLimitLevel(
        cpu_cores=None if cores is None else float(cores),
        cpu_weight=s.integer("cpu_weight", None, 1, 10000),
        io_weight=s.integer("io_weight", None, 1, 10000),
        io_mbps=tuple(sorted(mbps)),
        memory_high_mb=s.converted("memory_high", None, _size, "size (e.g. 32G)"))
    if level.memory_high_mb is not None and level.memory_high_mb <= 0:
        s.p.add(s.key("memory_high"), "expected a size above 0")
    s.done()
    if not any((level.cpu_cores, level.cpu_weight, level.io_weight, level.io_mbps,
                level.memory_high_mb)):
        s.p.add(s.path, "a level that limits nothing (give cpu_cores, cpu_weight, io_weight, "
                "io_mbps or memory_high)")
    return level

def _read_signals(s: Section) -> SignalSettings:
    base = SignalSettings()

    def given(name: str, what: str, default: str) -> bool:
        """False, with the problem named, where the key is there but null: every key here
        has a default, and the way to ask for it is to leave the key out."""
        if name in s.data and s.data[name] is None:
            s.seen.add(name)
            s.p.add(s.key(name), f"expected {what}, got None (leave the key out for the "
                    f"default, {default})")
            return False
        return True

    out = SignalSettings(
        refresh_s=s.converted("refresh", base.refresh_s, _duration, "duration (e.g. 5s)")
        if given("refresh", "a duration (e.g. 5s)", f"{base.refresh_s}s") else base.refresh_s,
        window_s=s.converted("window", base.window_s, _duration, "duration (e.g. 60s)")
        if given("window", "a duration (e.g. 60s)", f"{base.window_s}s") else base.window_s,
        timeout_s=s.converted("timeout", base.timeout_s, _duration, "duration (e.g. 1s)")
        if given("timeout", "a duration (e.g. 1s)", f"{base.timeout_s}s") else base.timeout_s,
        max_body_mb=s.converted("max_body", base.max_body_mb, _size, "size (e.g. 1M)")
        if given("max_body", "a size (e.g. 1M)", f"{base.max_body_mb}M")
        else base.max_body_mb,
        baseline_steps=s.integer("baseline_steps", base.baseline_steps, 0, 256)
        if given("baseline_steps", "a whole number 0..256", str(base.baseline_steps))
        else base.baseline_steps,
        step_window_s=s.converted("step_window", base.step_window_s, _duration, "duration")
        if given("step_window", "a duration (e.g. 60s)", f"{base.step_window_s}s")
        else base.step_window_s,
        servers=_read_servers(s) if "servers" in s.data and given(
            "servers", "a list of servers", ", ".join(p.name for p in base.servers))
        else base.servers,
    )
    for key, value, lo, hi in (("refresh", out.refresh_s, 1, 3600),
                               ("window", out.window_s, 2, 86400),
                               ("timeout", out.timeout_s, 1, 30),
                               ("max_body", out.max_body_mb, 1, 64),
                               ("step_window", out.step_window_s, 1, 86400)):
        if isinstance(value, int) and not lo <= value <= hi:
            s.p.add(s.key(key), f"{value} is out of range (allowed: {lo}..{hi})")
    if out.window_s < 2 * out.refresh_s:
        s.p.add(s.key("window"), f"{out.window_s}s holds fewer than two readings "
                f"{out.refresh_s}s apart (allowed: at least 2 x refresh)")
    if out.timeout_s >= out.refresh_s and out.refresh_s > 1:
        s.p.warn(s.key("timeout"), "as long as refresh: one hanging endpoint delays every "
                 "job's next reading")
    s.done()
    return out


def _read_servers(s: Section) -> Tuple[ServerProfile, ...]:
    from slurmiso.config.selector import BadSelector, parse_selector

    out = []
    for i, item in enumerate(s.seq("servers")):
        ss = Section(item, f"{s.key('servers')}[{i}]", s.p)
        prof = ServerProfile(
            name=ss.text("name"),
            latency=ss.strlist("latency"),
            unit=ss.text("unit", "s", ("s", "ms", "us")),
            requests=ss.strlist("requests"),
            errors=ss.strlist("errors"),
            errors_missing=ss.text("errors_missing", "unknown", ("unknown", "zero")),
            ttft=ss.strlist("ttft"),
            ttft_unit=ss.text("ttft_unit", "s", ("s", "ms", "us")),
            itl=ss.strlist("itl"),
            itl_unit=ss.text("itl_unit", "s", ("s", "ms", "us")),
            model_labels=ss.strlist("model_labels") if "model_labels" in ss.data
            else ("model_name", "model"),
            errors_need=ss.text("errors_need", "any", ("any", "all")),
            match=ss.strlist("match"),
        )
        if not prof.latency and not prof.requests:
            ss.p.add(ss.path, "a server needs `latency:` (a histogram or summary) or "
                     "`requests:`")
        for key in ("latency", "requests", "errors", "ttft", "itl", "match"):
            for text in getattr(prof, key):
                try:
                    parse_selector(text)
                except BadSelector as exc:
                    ss.p.add(ss.key(key), str(exc))
        ss.done()
        out.append(prof)
    if not out and isinstance(s.data.get("servers"), list):  # not a list: already said
        s.p.add(s.key("servers"), "an empty list reads no endpoint (leave it out for the "
                "defaults: vllm, tgi, triton, generic)")
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# cross-field rules


def _check(cfg: Config, p: _Problems) -> None:
    from slurmiso.classname import class_name_problem
    from slurmiso.config.mps_users import FIX, mps_mixes
    from slurmiso.gpu.placement import pack
    from slurmiso.gpu.profiles import MODELS, lookup_model, mig_models
    from slurmiso.hostlist import compress

    class_names = [c.name for c in cfg.classes]
    for i, c in enumerate(cfg.classes):
        key = f"classes[{i}]"
        if class_names.count(c.name) > 1 and class_names.index(c.name) != i:
            p.add(f"{key}.name", f"duplicate class name {c.name!r} (class names must be unique)")
        if c.name and class_name_problem(c.name):
            # Users name classes in --iso-class; the SPANK plugin, job_submit.lua and the
            # prolog accept only this form, so a class outside it could never be asked for.
            p.add(f"{key}.name", f"{c.name!r} {class_name_problem(c.name)}")
        for target in c.qos.preempt:
            other = cfg.job_class(target)
            if other is None:
                p.add(
                    f"{key}.qos.preempt",
                    f"{target!r} is not a class (allowed: {', '.join(class_names)})",
                )
            elif not other.preemptible:
                p.add(
                    f"{key}.qos.preempt",
                    f"class {target!r} is not preemptible: set preemptible: true there",
                )
        if c.isolation == "mig" and not c.mig_profiles:
            p.add(f"{key}.mig_profile", "required when isolation is mig")
        for model_name, _prof in c.mig_profiles:
            if model_name != "*" and not (MODELS.get(model_name) and MODELS[model_name].profiles):
                p.add(
                    f"{key}.mig_profile",
                    f"unknown MIG GPU model {model_name!r} (allowed: "
                    f"{', '.join(m.name for m in mig_models())}, or *)",
                )
        for pool in _pools_for(cfg, c):
            model = lookup_model(pool.gpu_model) if pool.gpu_model else None
            if model is None:
                continue  # any GPU: the prolog and doctor check memory against the node's
            if pool.mode in ("mig-static", "mig-dynamic") and c.mig_profiles:
                prof = c.mig_profile_for(model.name)
                if prof and model.profile(prof) is None:
                    p.add(
                        f"{key}.mig_profile",
                        f"{prof!r} is not a MIG profile of {model.name} (pool {pool.name!r}; "
                        f"allowed: {', '.join(model.profile_names)})",
                    )
            headroom = model.memory_mb * c.memory_headroom_pct // 100
            limit = c.mps.limit_mb(model.memory_mb)
            if pool.mode == "mps" and limit > model.memory_mb:
                p.add(
                    f"{key}.mps.memory_limit",
                    f"{limit} MiB is more than a {model.name} has "
                    f"({model.memory_mb} MiB, pool {pool.name!r})",
                )
            elif pool.mode == "mps" and limit + headroom > model.memory_mb:
                p.add(
                    f"{key}.mps.memory_limit",
                    f"{_limit_text(c.mps, limit)} plus the class's {c.memory_headroom_pct}% "
                    f"headroom ({headroom} MiB) is more than a {model.name} has "
                    f"({model.memory_mb} MiB, pool {pool.name!r}): no job of it could start",
                )
    if cfg.default_class and cfg.job_class(cfg.default_class) is None:
        p.add(
            "default_class",
            f'{cfg.default_class!r} is not a class (allowed: {", ".join(class_names)}, or "")',
        )

    pool_names = [x.name for x in cfg.pools]
    seen_nodes: Dict[str, str] = {}
    for i, pool in enumerate(cfg.pools):
        key = f"pools[{i}]"
        if pool_names.count(pool.name) > 1 and pool_names.index(pool.name) != i:
            p.add(f"{key}.name", f"duplicate pool name {pool.name!r}")
        clashes: Dict[str, List[str]] = {}
        for n in pool.node_names:
            if n in seen_nodes:
                clashes.setdefault(seen_nodes[n], []).append(n)
            seen_nodes.setdefault(n, pool.name)
        for owner, nodes in clashes.items():
            p.add(
                f"{key}.nodes",
                f"{compress(nodes)} already in pool {owner!r}; a node has exactly one GPU mode",
            )
        model = lookup_model(pool.gpu_model) if pool.gpu_model else None
        if model is not None and not model.profiles:
            model = None  # _check_mig_model named it
        if pool.mode == "mig-static":
            layout = cfg.mig_layout(pool.mig_layout) if pool.mig_layout else None
            if not pool.mig_layout:
                p.add(f"{key}.mig_layout", "required when mode is mig-static")
            elif layout is None:
                names = ", ".join(x.name for x in cfg.mig_layouts) or "none defined"
                p.add(
                    f"{key}.mig_layout",
                    f"no layout {pool.mig_layout!r} under mig_layouts.mig-configs "
                    f"(defined: {names})",
                )
            elif model is not None:
                _check_layout(layout, model, pool, key, p, pack)
        elif pool.mig_layout:
            p.add(f"{key}.mig_layout", f"only used when mode is mig-static (mode is {pool.mode})")
    for key, msg in throttle_signal_problems(cfg.classes, cfg.monitor.ladder):
        p.add(key, msg)
    for i, slo in enumerate(cfg.monitor.slo):
        if cfg.job_class(slo.class_name) is None:
            p.add(
                f"monitor.slo[{i}].class",
                f"{slo.class_name!r} is not a class (allowed: {', '.join(class_names)})",
            )
        elif [s.class_name for s in cfg.monitor.slo].index(slo.class_name) != i:
            p.add(f"monitor.slo[{i}].class", f"a second SLO for {slo.class_name!r}: one per "
                  "class (its signal: e2e, ttft or itl)")
    from slurmiso.config.slo_check import slo_problems

    for key, msg in slo_problems(cfg):
        p.warn(key, msg)
    mixes = {mix.pool: mix for mix in mps_mixes(cfg)}
    for i, pool in enumerate(cfg.pools):
        if pool.name in mixes:
            p.warn(f"pools[{i}]", f"{mixes[pool.name].describe()}; {FIX}")
    _check_mps_servers(cfg, p)
    for layout in cfg.mig_layouts:
        for gi, group in enumerate(layout.groups):
            for prof, _ in group.mig_devices:
                if not any(m.profile(prof) for m in MODELS.values()):
                    p.add(
                        f"mig_layouts.mig-configs.{layout.name}[{gi}].mig-devices",
                        f"unknown MIG profile {prof!r} (no supported GPU has it)",
                    )


def _check_mps_servers(cfg: Config, p: _Problems) -> None:
    """A class's MPS priority needs a shared server to order anything; a shared server is
    NVIDIA's multi-user mode, whose fault containment spans users (docs/mps-v3.md)."""
    from slurmiso.config.mps_users import pool_classes

    for i, pool in enumerate(cfg.pools):
        if pool.mps_server is MpsServer.SHARED:
            p.warn(f"pools[{i}].mps_server", f"pool {pool.name!r} runs one MPS v3 server per "
                   "GPU for every user (NVIDIA's multi-user mode): a fatal GPU fault of one "
                   "client may end other users' clients on that GPU")
    for ci, c in enumerate(cfg.classes):
        if c.mps.priority is None:
            continue
        apart = [pool.name for pool in cfg.pools if pool.mode == "mps"
                 and pool.mps_server is MpsServer.PER_CLASS and c in pool_classes(cfg, pool)]
        if apart:
            p.add(f"classes[{ci}].mps.priority",
                  f"class {c.name!r} asks for MPS priority {c.mps.priority.word}, but pool(s) "
                  f"{', '.join(apart)} run a daemon per class, where no priority orders one "
                  "class against another: set mps_server: shared on those pools, or remove "
                  "priority")


def _check_layout(
    layout: MigLayout, model: Any, pool: Pool, key: str, p: _Problems, pack: Any
) -> None:
    where = f"mig_layouts.mig-configs.{layout.name}"
    for gi, group in enumerate(layout.groups):
        for d in group.devices or ():
            if d >= pool.gpus_per_node:
                p.add(
                    f"{where}[{gi}].devices",
                    f"GPU {d} does not exist in pool {pool.name!r} "
                    f"({pool.gpus_per_node} GPUs per node)",
                )
        bad = [prof for prof, _ in group.mig_devices if model.profile(prof) is None]
        if bad:
            p.add(
                f"{where}[{gi}].mig-devices",
                f"{', '.join(bad)} not a MIG profile of {model.name} (pool {pool.name!r}; "
                f"allowed: {', '.join(model.profile_names)})",
            )
        elif group.mig_devices and pack(model, group.counts()) is None:
            want = ", ".join(f"{n}x {prof}" for prof, n in group.mig_devices)
            p.add(
                f"{where}[{gi}].mig-devices",
                f"{want} does not fit on one {model.name} (placement rules)",
            )
    if not any(g.mig_enabled for g in layout.groups):
        p.add(f"{key}.mig_layout", f"layout {layout.name!r} enables MIG on no GPU")


def _pools_for(cfg: Config, c: JobClass) -> List[Pool]:
    """Pools a class's jobs can land on: those of its partitions, or all when it names none."""
    return [p for p in cfg.pools if not c.match.partitions or p.partition in c.match.partitions]


# ---------------------------------------------------------------------------------------------
# entry points


def parse_config(data: Any, source: str = "<string>") -> Config:
    """Validate already-parsed YAML ``data``; raise ConfigError listing every problem."""
    p = _Problems()
    top = Section(data, "", p)
    version = top.raw("version", None)
    if version is None:
        p.add("version", "required key is missing (write `version: 1` at the top)")
    elif version != 1:
        p.add("version", f"{_show(version)} is not supported (allowed: 1)")
    ps = top.section("paths")
    paths = Paths(
        state_dir=ps.text("state_dir", Paths.state_dir),
        journal=ps.text("journal", Paths.journal),
        dcgm_job_mapping_dir=ps.text("dcgm_job_mapping_dir", ""),
        dev_root=ps.text("dev_root", Paths.dev_root),
        probe_dir=ps.text("probe_dir", Paths.probe_dir),
    )
    ps.done()
    for k in ("state_dir", "journal", "dev_root", "probe_dir"):
        v = getattr(paths, k)
        if v and not v.startswith("/"):
            p.add(
                f"paths.{k}",
                f"{v!r} must be an absolute path (hooks run with no working directory)",
            )
    gs = top.section("gpu")
    gpu = GpuSettings(
        backend=gs.text("backend", "auto", BACKEND_KINDS),
        sim_state=gs.text("sim_state", GpuSettings.sim_state),
    )
    gs.done()
    classes = []
    for i, item in enumerate(top.seq("classes")):
        classes.append(_read_class(Section(item, f"classes[{i}]", p)))
    if not classes and "classes" in top.data:
        p.add("classes", "at least one job class is required")
    pools = [
        _read_pool(Section(item, f"pools[{i}]", p)) for i, item in enumerate(top.seq("pools"))
    ]
    layouts = _read_layouts(top.section("mig_layouts")) if "mig_layouts" in top.data else ()
    if "mig_layouts" not in top.data:
        top.seen.add("mig_layouts")
    monitor = _read_monitor(top.section("monitor"))
    a = top.section("audit")
    audit = AuditSettings(
        severity=a.text("severity", "warning", SEVERITIES),
        long_infer_job_s=a.converted("long_infer_job", 4 * 3600, _duration, "duration"),
        repeated_preemptions=a.integer("repeated_preemptions", 3, 1, 1000),
    )
    a.done()
    default_class = top.text("default_class", "")
    top.done()
    cfg = Config(
        version=1,
        source=source,
        paths=paths,
        gpu=gpu,
        classes=tuple(classes),
        default_class=default_class,
        pools=tuple(pools),
        mig_layouts=layouts,
        monitor=monitor,
        audit=audit,
    )
    _cross_checks(cfg, p)
    if p.errors:
        n = len(p.errors)
        raise ConfigError(
            f"{source}: {n} problem{'s' if n > 1 else ''} in the configuration",
            problems=[f"{source}: {e}" for e in p.errors],
        )
    if p.warnings:
        object.__setattr__(cfg, "warnings", tuple(f"{source}: {w}" for w in p.warnings))
    return cfg


def _cross_checks(cfg: Config, p: _Problems) -> None:
    """Cross-field rules, reported together with the structural problems (one pass to fix).

    With structural problems the bad values were replaced by defaults, so a cross-field
    finding about a key already reported (or inside it) is dropped as noise; a rule that
    trips over such a stand-in value is skipped, since the file is rejected anyway.
    """
    if not p.errors:
        _check(cfg, p)
        return
    cross = _Problems()
    try:
        _check(cfg, cross)
    except (TypeError, ValueError, AttributeError, KeyError, LookupError):
        return
    reported = [e.split(": ", 1)[0] for e in p.errors]
    for e in cross.errors:
        key = e.split(": ", 1)[0]
        if not any(key.startswith(r) or r.startswith(key) for r in reported):
            p.errors.append(e)
    p.warnings += cross.warnings


def load_config(path: Optional[str] = None) -> Config:
    """Read and validate the config file (see :func:`config_path` for which one).

    As root, the parsed YAML is cached as JSON (see :mod:`slurmiso.config.cache`): the hooks
    load the config on every job start and the YAML library alone costs more to import than
    the rest of a prolog. Validation still runs on every load.
    """
    from slurmiso.config import cache

    src = config_path(path)
    cached = cache.lookup(src)
    if cached is not None:
        return parse_config(cached, src)
    data = _read_yaml(src)
    config = parse_config(data, src)
    cache.store(src, data)
    return config


def _read_yaml(src: str) -> Any:
    import yaml

    try:
        with open(src, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise ConfigError(
            f"config file {src} does not exist",
            hint=f"write the annotated example there with 'slurmiso gen config -o {src}' and "
            "edit it, or set SLURMISO_CONFIG / pass --config",
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {src}: {exc.strerror}") from None
    # The C loader is ~10x faster than the pure-Python one: the hooks load this on every job.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader)  # noqa: S506 - a safe loader
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{src}: {where}not valid YAML: {problem}") from None
    return data
