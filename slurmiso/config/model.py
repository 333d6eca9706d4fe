"""The configuration as frozen value classes: loaded once, validated, then only read.

Everything here is plain data with small lookups; parsing and validation live in
:mod:`slurmiso.config.loader`. Durations are seconds, memory sizes MiB, percentages 0..100.
The classes are :class:`~slurmiso.values.Value`, not dataclasses: every prolog and epilog
builds all of them, and a dataclass costs about a millisecond to define.
"""

from __future__ import annotations

from enum import Enum, IntEnum
from typing import Dict, Optional, Tuple

from slurmiso.hostlist import expand_node
from slurmiso.values import Value

ISOLATIONS = ("exclusive", "mig", "mps", "timeslice")
POOL_MODES = ("exclusive", "mig-static", "mig-dynamic", "mps", "timeslice")
#: Pool modes whose GPUs several jobs share: their load can hurt inference.
#: ``nvidia-smi compute-policy --set-timeslice`` 0..3 by name (slurmiso.gpu.timeslice).
TIMESLICES = ("default", "short", "medium", "long")
SHARED_MODES = ("mps", "timeslice", "mig-static", "mig-dynamic")
#: How strong each class isolation is; a class may land only on a pool at least as strong.
ISOLATION_STRENGTH = {"timeslice": 0, "mps": 1, "mig": 2, "exclusive": 3}
#: Which class isolation a pool mode can give.
MODE_ISOLATION = {
    "exclusive": "exclusive",
    "mig-static": "mig",
    "mig-dynamic": "mig",
    "mps": "mps",
    "timeslice": "timeslice",
}
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP", "URG", "CONT")
#: The monitor's ladder on running training, soft to hard (docs/monitor.md).
LADDER_STEPS = ("hold", "throttle", "park", "suspend", "requeue")
#: The steps a config that names none gets: ``park`` needs cuda-checkpoint on the nodes, so a
#: site asks for it (docs/park.md).
DEFAULT_LADDER_STEPS = ("hold", "throttle", "suspend", "requeue")
#: What ends a restraint that reached its step's ``max_s`` without a hot cause or without a
#: live monitor (``monitor.ladder.on_bound``): give the job back as it was, or checkpoint and
#: requeue it. Both are safe for the job; neither keeps it stopped.
ON_BOUND = ("resume", "requeue")
#: Each step's default bound (``max_s``): how long a rung may stand without a hot cause, and a
#: restraint without a live monitor.
DEFAULT_MAX_S = {"hold": 3600, "throttle": 3600, "park": 1800, "suspend": 1800,
                 "requeue": 3600}
#: Signals the throttle may use: ignored by default by every process (a program that does not
#: know them is not hurt) and not meaning checkpoint, preempt or job control.
THROTTLE_SIGNALS = ("URG", "WINCH")
SEVERITIES = ("info", "warning", "error")


class Match(Value):
    """How a job is recognised: any listed QoS, partition or account, or the SPANK option."""

    qos: Tuple[str, ...] = ()
    partitions: Tuple[str, ...] = ()
    accounts: Tuple[str, ...] = ()
    spank_class: str = ""


class MpsServer(str, Enum):
    """How an MPS pool's GPUs serve their clients (docs/mps-v3.md).

    ``per-class``: a control daemon per (GPU, uid, limits), today's arrangement everywhere.
    ``shared``: one MPS v3 multi-user daemon per GPU and a namespace per job, so both classes
    are clients of one server, ordered by client priority; where the driver lacks MPS v3 the
    pool falls back to ``per-class`` and says so."""

    PER_CLASS = "per-class"
    SHARED = "shared"


class MpsPriority(IntEnum):
    """MPS client priority as NVIDIA numbers it: 0 normal, 1 below normal."""

    NORMAL = 0
    BELOW_NORMAL = 1

    @property
    def word(self) -> str:
        return self.name.lower().replace("_", "-")


class MpsShare(Value):
    thread_percentage: int = 100
    memory_limit_mb: int = 0  # 0 = no pinned-memory limit
    #: The limit as a share of the GPU's memory (``memory_limit: 45%``), so one class fits
    #: pools of different GPU models; 0: none (or ``memory_limit_mb`` gives it in MiB).
    memory_limit_pct: int = 0
    #: The class's client priority on a shared server (None: below normal for preemptible
    #: classes, normal otherwise; see :meth:`priority_for`).
    priority: Optional[MpsPriority] = None

    def priority_for(self, preemptible: bool) -> MpsPriority:
        if self.priority is not None:
            return self.priority
        return MpsPriority.BELOW_NORMAL if preemptible else MpsPriority.NORMAL

    def limit_mb(self, gpu_total_mb: Optional[int]) -> int:
        """The pinned-memory limit in MiB on a GPU of ``gpu_total_mb`` (0: none; a share of
        a GPU whose memory is unknown is 0 too, and said so by whoever asks)."""
        if self.memory_limit_mb or not self.memory_limit_pct:
            return self.memory_limit_mb
        return int(gpu_total_mb or 0) * self.memory_limit_pct // 100


class Checkpoint(Value):
    signal: str = "USR2"
    grace_s: int = 120
    max_requeues: int = 20
    warn_before_limit_s: int = 300  # --signal lead time before the time limit


class QosSpec(Value):
    """What ``qos apply`` makes of a class in ``sacctmgr``."""

    name: str
    priority: int = 0
    preempt: Tuple[str, ...] = ()
    max_wall_s: Optional[int] = None
    max_gpus_per_job: Optional[int] = None
    accounts: Tuple[str, ...] = ()


class HostQuota(Value, eq=True):
    """A training class's share of its node's host, written into each of its jobs' cgroups
    by the node agent (issue 36's "quotas": docs/host-contention.md). The v2 weight scale
    (1..100 here: a quota only lowers the default 100); ``memory_high_pct``: ``memory.high``
    as a share of the ``memory.max`` Slurm set for the job (cgroup v2 only). None: untouched."""

    cpu_weight: Optional[int] = None
    io_weight: Optional[int] = None
    memory_high_pct: Optional[int] = None

    def any(self) -> bool:
        return any(v is not None for v in (self.cpu_weight, self.io_weight,
                                           self.memory_high_pct))


class GpuMemoryShare(Value, eq=True):
    """A class's memory on each of its jobs' whole GPUs, held per job by the driver's memory
    partitioning (driver r615+, cgroup v2; docs/mps-v3.md): ``hard`` fails an allocation
    above it, ``soft`` is what the job is guaranteed. Each in MiB or as a share of the GPU's
    memory (``_pct``); 0: none."""

    hard_mb: int = 0
    hard_pct: int = 0
    soft_mb: int = 0
    soft_pct: int = 0

    def any(self) -> bool:
        return any((self.hard_mb, self.hard_pct, self.soft_mb, self.soft_pct))

    def limits_mb(self, gpu_total_mb: int) -> Tuple[int, int]:
        """(soft, hard) in MiB on a GPU of ``gpu_total_mb``; 0 where none is set."""
        def resolve(mb: int, pct: int) -> int:
            return mb or gpu_total_mb * pct // 100

        return resolve(self.soft_mb, self.soft_pct), resolve(self.hard_mb, self.hard_pct)


class JobClass(Value):
    name: str
    description: str
    match: Match
    isolation: str
    #: MIG profile per GPU model ("*" = any model).
    mig_profiles: Tuple[Tuple[str, str], ...]
    mps: MpsShare
    memory_headroom_pct: int
    preemptible: bool
    checkpoint: Optional[Checkpoint]
    qos: QosSpec
    host: HostQuota = HostQuota()
    gpu_memory: GpuMemoryShare = GpuMemoryShare()

    def mig_profile_for(self, model: str) -> str:
        """The MIG profile this class gets on a GPU of ``model`` ("" if none is declared)."""
        table = dict(self.mig_profiles)
        return table.get(model) or table.get("*", "")


class Pool(Value):
    name: str
    nodes: str  # hostlist expression as written
    node_names: Tuple[str, ...]
    feature: str
    partition: str
    gpu_model: str
    gpus_per_node: int
    mode: str
    mig_layout: str = ""
    mps_shares_per_gpu: int = 100
    shards_per_gpu: int = 7
    #: The GPUs' compute time slice on a timeslice pool (TIMESLICES; "": as the driver has it).
    timeslice: str = ""
    #: An MPS pool's arrangement (:class:`MpsServer`).
    mps_server: MpsServer = MpsServer.PER_CLASS


class MigGroup(Value):
    """One entry of a mig-parted config: which devices, MIG on/off, how many of each profile."""

    devices: Optional[Tuple[int, ...]]  # None = all
    mig_enabled: bool
    mig_devices: Tuple[Tuple[str, int], ...] = ()

    def applies_to(self, index: int) -> bool:
        return self.devices is None or index in self.devices

    def counts(self) -> Dict[str, int]:
        return dict(self.mig_devices)


class MigLayout(Value):
    name: str
    groups: Tuple[MigGroup, ...]

    def for_device(self, index: int) -> Optional[MigGroup]:
        """The group that lays out GPU ``index`` (the first that names it), if any."""
        for g in self.groups:
            if g.applies_to(index):
                return g
        return None


class Paths(Value):
    state_dir: str = "/run/slurmiso"
    journal: str = "/var/log/slurmiso/%n.jsonl"  # one per node: a shared dir serves the audit
    dcgm_job_mapping_dir: str = ""
    #: Where the node's NVIDIA device files are (the sandbox's stand-ins live elsewhere);
    #: the device fence reads their numbers from here.
    dev_root: str = "/dev"
    #: Where ``slurmiso probe`` keeps its results (the audit shows the latest per pool).
    probe_dir: str = "/var/lib/slurmiso/probe"

    def state_dir_for(self, node: str = "") -> str:
        return expand_node(self.state_dir, node)

    def dev_root_for(self, node: str = "") -> str:
        return expand_node(self.dev_root, node)

    def journal_for(self, node: str = "") -> str:
        return expand_node(self.journal, node)


class GpuSettings(Value):
    backend: str = "auto"
    sim_state: str = "/var/lib/slurmiso/sim/%n.json"


class Thresholds(Value):
    memory_used_pct: int = 75
    sm_active_pct: int = 85
    hysteresis_pct: int = 10


class Stagger(Value):
    max_starts: int = 4
    interval_s: int = 60
    #: A backlog of held training jobs is released within about this long.
    backlog_drain_s: int = 3600


class Limits(Value):
    """Per-hour limits of the monitor's actions (so a bursty queue never makes it flap)."""

    partition_updates_per_hour: int = 6
    relayouts_per_hour: int = 2
    gate_opens_per_hour: int = 2


class TelemetrySettings(Value):
    """Where the monitor reads GPU telemetry (``monitor.telemetry``); the sources that read
    it are :class:`slurmiso.monitor.telemetry.TelemetrySource`."""

    source: str = "agents"
    agent_port: int = 9810
    prometheus_url: str = ""
    #: Where ``slurmiso agent`` listens (loopback unless a site opens it on purpose).
    agent_addr: str = "127.0.0.1"
    #: Label per-GPU series with the job ids holding them (cardinality: off by default).
    job_labels: bool = False
    #: The agent also writes the DCGM exporter's names (DCGM_FI_*); switch off where a real
    #: DCGM exporter runs on the node, or a Prometheus sum counts each GPU twice.
    agent_dcgm_names: bool = True
    #: One deadline for all telemetry of a cycle (0: a third of the interval).
    deadline_s: int = 0


#: The latency signals an SLO may judge (``monitor.slo[].signal``): end to end, time to first
#: token, inter-token latency.
LATENCY_SIGNALS: Tuple[str, ...] = ("e2e", "ttft", "itl")


class Slo(Value):
    """A class's SLO: ``p99_latency_ms`` of ``signal`` read as "at most 1 % of requests slower"
    (per job, from its server's histogram), ``max_error_rate``, ``max_queue_wait_s``."""

    class_name: str
    max_queue_wait_s: Optional[int] = None
    p99_latency_ms: Optional[float] = None
    latency_query: str = ""
    #: Highest share of failed requests (0..1) an inference job of the class may answer.
    max_error_rate: Optional[float] = None
    signal: str = "e2e"


class LadderStep(Value):
    """One step of the ladder: taken once a breach has lasted ``after_s`` at the step below,
    stepped back from after ``release_after_s`` of calm; at most ``per_job`` times an hour for
    any one job (the training job it acts on, the inference job whose breach asks for it)
    and ``per_hour`` times an hour in all (hold has no budget: it only gates new training)."""

    name: str
    after_s: int = 0
    release_after_s: int = 300
    per_job: int = 0
    per_hour: int = 0
    #: The longest the step may stand while its cause is not hot (unknown, between, calm),
    #: and a restraint at it while no monitor is alive: then it ends (``Ladder.on_bound``).
    max_s: int = 3600


class HostLimitLevel(Value):
    """One level of the host rung, as a node applies it to a training job's cgroup
    (``lvl=N`` in the job's restraint note is ``levels[N-1]``); None leaves a knob alone.
    The v2 scale for weights (1..10000, default 100); sizes in MiB (slurmiso.host.rate_limit)."""

    cpu_cores: Optional[float] = None
    cpu_weight: Optional[int] = None
    io_weight: Optional[int] = None
    #: (``MAJ:MIN``, MiB/s read and write) per block device; cgroup v2 only.
    io_mbps: Tuple[Tuple[str, int], ...] = ()
    #: ``memory.high`` in MiB; cgroup v2 only (Slurm's ``memory.max`` is never written).
    memory_high_mb: Optional[int] = None


class HostLimit(Value):
    """The host rung's levels on the node (``monitor.ladder.host_limit``): none by default,
    so a node refuses every host-limit note until a site declares what a level means."""

    levels: Tuple[HostLimitLevel, ...] = ()
    #: The monitor's side (issue 36): a level is taken once a host-caused breach has lasted
    #: ``after_s`` at the level below, stepped back from after ``release_after_s`` of calm, at
    #: most ``per_job`` times an hour for any one job and ``per_hour`` in all; a level stands
    #: at most ``max_s`` without a hot host cause (and on a node with no live monitor).
    after_s: int = 60
    release_after_s: int = 300
    per_job: int = 6
    per_hour: int = 60
    max_s: int = 3600


class Ladder(Value):
    """The ladder on running training where an inference job breaches its SLO."""

    steps: Tuple[LadderStep, ...] = (
        LadderStep("hold", 0, 300, max_s=DEFAULT_MAX_S["hold"]),
        LadderStep("throttle", 60, 300, 6, 120, DEFAULT_MAX_S["throttle"]),
        LadderStep("suspend", 180, 300, 3, 30, DEFAULT_MAX_S["suspend"]),
        LadderStep("requeue", 600, 300, 1, 10, DEFAULT_MAX_S["requeue"]),
    )
    #: ``park``'s settings where a config lists it without its own (it is not a default step).
    park: LadderStep = LadderStep("park", 120, 300, 3, 30, DEFAULT_MAX_S["park"])
    #: Calm = this many percent below the SLO (latency, error rate).
    hysteresis_pct: int = 10
    #: Sent to every process of the job (``SlurmCli.signal_job``): slow down / back to full speed.
    throttle_signal: str = "URG"
    unthrottle_signal: str = "WINCH"
    #: How a restraint past its bound ends: ``resume`` (resumed, back to full speed) or
    #: ``requeue`` (checkpoint and requeue).
    on_bound: str = "resume"
    #: What each host-limit level means on a node (docs/host-contention.md).
    host_limit: HostLimit = HostLimit()


class Relayout(Value):
    """How a MIG re-layout empties its node: ``wait`` for every job, or ``preempt-training``
    (requeue the training jobs on it once it has drained ``preempt_after_s``; never inference)."""

    drain: str = "wait"
    preempt_after_s: int = 0


class ServerProfile(Value):
    """Which series of an inference server's ``/metrics`` are its latency, requests and
    failures (``monitor.signals.servers``; selectors as slurmiso.agent.endpoint reads
    them). ``latency``: alternatives, the first family present wins; ``requests`` and
    ``errors``: summed."""

    name: str
    latency: Tuple[str, ...]
    unit: str = "s"  # of the latency values: s, ms or us
    requests: Tuple[str, ...] = ()  # (): the latency family's own count
    #: Every failure counter the server has, summed; errors are unknown while any of these
    #: families is absent (a server that cannot report a failure kind never reads as 0).
    errors: Tuple[str, ...] = ()
    #: The errors' series absent altogether: "unknown", or "zero" where the server creates
    #: its failure counter at the first failure.
    errors_missing: str = "unknown"
    #: Time to first token and inter-token latency (LLM servers), selectable as SLO signals.
    ttft: Tuple[str, ...] = ()
    ttft_unit: str = "s"
    itl: Tuple[str, ...] = ()
    itl_unit: str = "s"
    #: Labels naming the model a series is about: each model is judged on its own.
    model_labels: Tuple[str, ...] = ("model_name", "model")
    #: Errors are known when ``any`` error family is present, or only when ``all`` are (a
    #: server whose failures are split over counters sees none of a kind it lacks).
    errors_need: str = "any"
    #: Series whose presence says the answer is this server's (default: its latency and
    #: request series); a server that also exports generic HTTP series (vLLM) names its own.
    match: Tuple[str, ...] = ()


#: Server defaults, each read from the server's own source (release and file in
#: docs/monitor.md "What each server can see"; the test fixtures that hold them are
#: generated with prometheus_client from the same definitions, tests/fixtures/servers.py).
#: vLLM V1 (vllm/v1/metrics/loggers.py; the API server's prometheus-fastapi-instrumentator,
#: statuses grouped "2xx".."5xx"): e2e, TTFT and inter-token histograms labelled model_name;
#: failures are the API server's 4xx/5xx answers (an engine "error" always becomes a 500,
#: vllm/v1/engine/__init__.py) plus engine requests finished "abort".
#: SGLang (python/sglang/srt/metrics/collector.py): sglang:* histograms, aborted requests and
#: the HTTP answers by status_code. TGI (router/src/server.rs): tgi_request_duration (s),
#: tgi_request_count at entry, tgi_request_failure{err} created at the first failure, no TTFT.
#: Triton (core src/metrics.cc): the e2e summary in us (--metrics-config
#: summary_latencies=true), the TTFT histogram in ms (histogram_latencies=true), success and
#: failure counters. Generic: Prometheus conventions, prometheus-fastapi-instrumentator and
#: OpenTelemetry's http.server.request.duration as its Prometheus exporter names it.
DEFAULT_SERVERS: Tuple[ServerProfile, ...] = (
    ServerProfile(
        "vllm", ("vllm:e2e_request_latency_seconds",), "s",
        ('http_requests_total{handler=~"/v1/.+|/generate|/invocations|/pooling|/classify|'
         '/score|/rerank",handler!="/v1/models"}',),
        ('http_requests_total{handler=~"/v1/.+|/generate|/invocations|/pooling|/classify|'
         '/score|/rerank",handler!="/v1/models",status=~"4xx|5xx|4..|5.."}',
         'vllm:request_success_total{finished_reason="abort"}'),
        ttft=("vllm:time_to_first_token_seconds",),
        itl=("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
        errors_need="all", match=("vllm:*",)),
    ServerProfile(
        "sglang", ("sglang:e2e_request_latency_seconds",), "s",
        ('sglang:http_responses_total{endpoint!="/metrics",endpoint!="/health"}',),
        ("sglang:num_aborted_requests_total",
         'sglang:http_responses_total{status_code=~"[45].."}'),
        ttft=("sglang:time_to_first_token_seconds",),
        itl=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
        errors_need="all", match=("sglang:*",)),
    ServerProfile("tgi", ("tgi_request_duration",), "s",
                  ("tgi_request_count", "tgi_request_count_total"),
                  ("tgi_request_failure", "tgi_request_failure_total"), "zero",
                  itl=("tgi_request_mean_time_per_token_duration",)),
    ServerProfile("triton", ("nv_inference_request_summary_us",), "us",
                  ("nv_inference_request_success", "nv_inference_request_failure"),
                  ("nv_inference_request_failure",),
                  ttft=("nv_inference_first_response_histogram_ms",), ttft_unit="ms"),
    ServerProfile("generic", ("*_request_duration_highr_seconds", "*_request_duration_seconds"),
                  "s", ("*_requests_total",),
                  ('*_requests_total{status=~"5..|5xx"}', '*_requests_total{code=~"5.."}',
                   '*_request_duration_seconds_count{http_response_status_code=~"5.."}')),
)


class SignalSettings(Value):
    """How ``slurmiso agent`` reads the jobs' own signals (``monitor.signals``): inference
    endpoints declared with ``--iso-metrics``, training steps from ``slurmiso.checkpoint.
    report_step``. All of it in a background reader, so a scrape never waits on a job."""

    refresh_s: int = 5
    window_s: int = 60  # latency, requests and errors: over the last window
    timeout_s: int = 1  # per endpoint
    max_body_mb: int = 1  # MiB read of an endpoint's answer
    #: Solo baseline: the median of the job's first N step times (0: no baseline).
    baseline_steps: int = 20
    step_window_s: int = 60  # the recent mean step time: steps of the last window
    servers: Tuple[ServerProfile, ...] = DEFAULT_SERVERS


class MonitorSettings(Value):
    interval_s: int = 30
    dry_run: bool = False
    thresholds: Thresholds = Thresholds()
    min_dwell_s: int = 300
    stagger: Stagger = Stagger()
    telemetry: TelemetrySettings = TelemetrySettings()
    slo: Tuple[Slo, ...] = ()
    #: ``nodes`` (default): keep pending training off the nodes where inference needs its
    #: GPUs with the job's ExcNodeList; ``hold`` pending training jobs partition-wide (as
    #: before issue 24), or ``qos-limit``: cap the training QoS's GrpTRES at what training
    #: uses now (jobs wait with reason QOSGrpGRES; none is held).
    admission: str = "nodes"
    relayout: Relayout = Relayout()
    #: Unknown or stale telemetry admits training as if calm (default: it admits none).
    unknown_admits: bool = False
    limits: Limits = Limits()
    ladder: Ladder = Ladder()
    signals: SignalSettings = SignalSettings()


class AuditSettings(Value):
    severity: str = "warning"
    long_infer_job_s: int = 4 * 3600
    repeated_preemptions: int = 3


class Config(Value):
    """A validated slurmiso configuration. ``source`` is the file it came from."""

    version: int
    source: str
    paths: Paths
    gpu: GpuSettings
    classes: Tuple[JobClass, ...]
    default_class: str
    pools: Tuple[Pool, ...]
    mig_layouts: Tuple[MigLayout, ...]
    monitor: MonitorSettings
    audit: AuditSettings
    warnings: Tuple[str, ...] = ()

    def job_class(self, name: str) -> Optional[JobClass]:
        for c in self.classes:
            if c.name == name:
                return c
        return None

    def pool(self, name: str) -> Optional[Pool]:
        for p in self.pools:
            if p.name == name:
                return p
        return None

    def pool_for_node(self, node: str, features: Tuple[str, ...] = ()) -> Optional[Pool]:
        """The pool a node belongs to: by name first, then by node feature."""
        for p in self.pools:
            if node in p.node_names:
                return p
        for p in self.pools:
            if p.feature and p.feature in features:
                return p
        return None

    def node_pool(self, node: str) -> Pool:
        """The pool of ``node``, or a UsageError saying how to fix that (for commands that
        only make sense on a pool's node)."""
        from slurmiso.errors import UsageError

        pool = self.pool_for_node(node)
        if pool is None:
            raise UsageError(f"node {node} is in no pool of {self.source}",
                             hint="pass --node NAME or add the node to a pool")
        return pool

    def mig_layout(self, name: str) -> Optional[MigLayout]:
        for layout in self.mig_layouts:
            if layout.name == name:
                return layout
        return None
