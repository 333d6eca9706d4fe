"""Where contention is when an inference job breaches: a written rule over GPU and host figures.

    >>> d = diagnose(inputs)                                     # doctest: +SKIP
    >>> d.cause, d.text                                          # doctest: +SKIP
    (<Cause.HOST_CPU_PRESSURE: 'host-cpu-pressure'>,
     'host CPU pressure: job 123 (train, alice) uses 15.2 of 16 cores')

The rules are one table (:data:`RULES`), checked in order; the first that holds is the
cause, later ones that also hold are listed in ``also``. Unknown figures never read as calm:
when no rule holds and a figure some rule needed was unknown, the cause is UNKNOWN, not
NONE_FOUND. Pure: no reads, no clock; the agent gathers :class:`DiagnosisInputs`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, List, Mapping, Optional, Tuple

from slurmiso.errors import ConfigError
from slurmiso.host.cgroup_figures import PressureFigures
from slurmiso.host.kernel_text import Psi


class Cause(enum.Enum):
    """Where the diagnosis places an inference job's contention."""

    GPU_MEMORY_FULL = "gpu-memory-full"
    SM_SATURATED_BY_NEIGHBOUR = "sm-saturated-by-neighbour"
    HOST_CPU_PRESSURE = "host-cpu-pressure"
    HOST_MEMORY_PRESSURE = "host-memory-pressure"
    HOST_IO_PRESSURE = "host-io-pressure"
    NETWORK = "network"
    NONE_FOUND = "none-found"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Thresholds:
    """When each rule holds. PSI figures are % of wall time stalled over the last 10 s.

    Defaults: CPU PSI some >= 20 % (a fifth of the time some task waits for a CPU), memory
    PSI some >= 10 %, IO PSI full >= 10 % (every task waiting on IO), GPU memory >= 95 %,
    SM activity >= 90 % with one co-located job owning at least half of it, NIC >= 90 %.
    """

    cpu_psi_some_avg10: float = 20.0
    memory_psi_some_avg10: float = 10.0
    io_psi_full_avg10: float = 10.0
    gpu_memory_fraction: float = 0.95
    sm_active_fraction: float = 0.90
    neighbour_sm_share: float = 0.5
    nic_busy_fraction: float = 0.90

    def __post_init__(self) -> None:
        bad = [f"{name}: {value} (allowed 0 < x <= 100)" for name, value in (
            ("cpu_psi_some_avg10", self.cpu_psi_some_avg10),
            ("memory_psi_some_avg10", self.memory_psi_some_avg10),
            ("io_psi_full_avg10", self.io_psi_full_avg10)) if not 0 < value <= 100]
        bad += [f"{name}: {value} (allowed 0 < x <= 1)" for name, value in (
            ("gpu_memory_fraction", self.gpu_memory_fraction),
            ("sm_active_fraction", self.sm_active_fraction),
            ("neighbour_sm_share", self.neighbour_sm_share),
            ("nic_busy_fraction", self.nic_busy_fraction)) if not 0 < value <= 1]
        if bad:
            raise ConfigError("host diagnosis thresholds out of range", problems=bad)


@dataclass(frozen=True)
class GpuState:
    """One of the inference job's GPUs (or MIG instances): fractions 0..1, None unknown."""

    gpu: str
    memory_used_fraction: Optional[float]
    sm_active_fraction: Optional[float]


@dataclass(frozen=True)
class Neighbour:
    """Another job on the node, with its rates; ``sm_by_gpu`` is its share of each GPU."""

    job_id: str
    class_name: str
    user: str
    gpus: Tuple[str, ...] = ()
    cpu_cores: Optional[float] = None
    io_bytes_per_s: Optional[float] = None
    memory_bytes: Optional[int] = None
    sm_by_gpu: Mapping[str, float] = field(default_factory=dict)
    gpu_memory_by_gpu: Mapping[str, int] = field(default_factory=dict)

    def label(self) -> str:
        """``job 123 (train, alice)``; the parts not known (the monitor has no user) left out."""
        known = ", ".join(p for p in (self.class_name, self.user) if p)
        return f"job {self.job_id}" + (f" ({known})" if known else "")


@dataclass(frozen=True)
class NicLoad:
    """One interface's traffic and link speed in bytes/s (full duplex: busier side counts)."""

    name: str
    rx_bytes_per_s: Optional[float]
    tx_bytes_per_s: Optional[float]
    link_bytes_per_s: Optional[float]


@dataclass(frozen=True)
class DiagnosisInputs:
    """The breaching inference job's GPUs and pressure, the node's, and its neighbours."""

    job_id: str
    gpus: Tuple[GpuState, ...]
    job_pressure: PressureFigures
    node_pressure: PressureFigures
    neighbours: Tuple[Neighbour, ...]
    nics: Tuple[NicLoad, ...] = ()
    node_cpus: Optional[int] = None


@dataclass(frozen=True)
class Suspect:
    """A job the cause points at, with what it contributes (None: not measured)."""

    job: Neighbour
    contribution: Optional[float]


@dataclass(frozen=True)
class Diagnosis:
    """The cause, the figures that decided it, suspects ranked first-to-act, one-line text."""

    cause: Cause
    figures: Tuple[Tuple[str, float], ...]
    suspects: Tuple[Suspect, ...]
    text: str
    also: Tuple[Cause, ...] = ()
    unknown: Tuple[str, ...] = ()


@dataclass(frozen=True)
class _Finding:
    cause: Cause
    figures: Tuple[Tuple[str, float], ...]
    suspects: Tuple[Suspect, ...]
    text: str


_Check = Callable[[DiagnosisInputs, Thresholds, List[str]], Optional[_Finding]]


def _ranked(jobs: Tuple[Neighbour, ...], measure: Callable[[Neighbour], Optional[float]],
            exclude: str) -> Tuple[Suspect, ...]:
    """Largest contribution first; unmeasured jobs last (unknown is not innocent)."""
    suspects = [Suspect(j, measure(j)) for j in jobs if j.job_id != exclude]
    suspects.sort(key=lambda s: (s.contribution is None, -(s.contribution or 0.0)))
    return tuple(suspects)


def _on_gpu(inputs: DiagnosisInputs, gpu: str) -> Tuple[Neighbour, ...]:
    return tuple(n for n in inputs.neighbours if gpu in n.gpus and n.job_id != inputs.job_id)


def _per_gpu(attr: str, gpu: str) -> Callable[[Neighbour], Optional[float]]:
    """A neighbour's figure on one GPU, from one of its per-GPU mappings (None: unmeasured)."""
    def measure(job: Neighbour) -> Optional[float]:
        value = getattr(job, attr).get(gpu)
        return None if value is None else float(value)
    return measure


def _gpu_memory(inputs: DiagnosisInputs, th: Thresholds, unknown: List[str]) -> Optional[_Finding]:
    for gpu in inputs.gpus:
        used = gpu.memory_used_fraction
        if used is None:
            unknown.append(f"GPU {gpu.gpu} memory")
        elif used >= th.gpu_memory_fraction:
            ranked = _ranked(_on_gpu(inputs, gpu.gpu), _per_gpu("gpu_memory_by_gpu", gpu.gpu),
                             inputs.job_id)
            names = ", ".join(s.job.label() for s in ranked) or "no other job"
            return _Finding(
                Cause.GPU_MEMORY_FULL,
                (("gpu memory used fraction", used), ("threshold", th.gpu_memory_fraction)),
                ranked,
                f"GPU memory full: GPU {gpu.gpu} at {used:.0%} with {names}",
            )
    return None


def _sm_neighbour(inputs: DiagnosisInputs, th: Thresholds,
                  unknown: List[str]) -> Optional[_Finding]:
    for gpu in inputs.gpus:
        active = gpu.sm_active_fraction
        if active is None:
            unknown.append(f"GPU {gpu.gpu} SM activity")
            continue
        if active < th.sm_active_fraction:
            continue
        jobs = _on_gpu(inputs, gpu.gpu)
        ranked = _ranked(jobs, _per_gpu("sm_by_gpu", gpu.gpu), inputs.job_id)
        top = ranked[0] if ranked else None
        if top is not None and top.contribution is not None \
                and top.contribution >= th.neighbour_sm_share * active:
            return _Finding(
                Cause.SM_SATURATED_BY_NEIGHBOUR,
                (("gpu sm active fraction", active), ("neighbour sm fraction", top.contribution),
                 ("threshold", th.sm_active_fraction)),
                ranked,
                f"SMs saturated by a neighbour: {top.job.label()} takes "
                f"{top.contribution:.0%} of GPU {gpu.gpu}",
            )
        if any(s.contribution is None for s in ranked):
            unknown.append(f"SM share of the jobs on GPU {gpu.gpu}")
    return None


def _pressure(inputs: DiagnosisInputs, resource: str) -> Tuple[Optional[Psi], str]:
    """The job's own PSI (does *it* stall?) where known, else the node's (cgroup v1)."""
    own: Optional[Psi] = getattr(inputs.job_pressure, resource)
    if own is not None:
        return own, "job"
    return getattr(inputs.node_pressure, resource), "node"


@dataclass(frozen=True)
class _HostRule:
    """One PSI resource's rule: pressure over threshold names the heaviest neighbour."""

    cause: Cause
    resource: str  # the PressureFigures field: cpu, memory or io
    label: str
    line: str  # the PSI line that decides: some or full
    threshold: Callable[[Thresholds], float]
    measure: Callable[[Neighbour], Optional[float]]
    says: Callable[[Optional[float], DiagnosisInputs], str]

    def __call__(self, inputs: DiagnosisInputs, th: Thresholds,
                 unknown: List[str]) -> Optional[_Finding]:
        psi, whose = _pressure(inputs, self.resource)
        psi_line = None if psi is None else (psi.some if self.line == "some" else psi.full)
        if psi_line is None:
            unknown.append(f"{self.label} pressure ({self.line})")
            return None
        if psi_line.avg10 < self.threshold(th):
            return None
        suspects = _ranked(inputs.neighbours, self.measure, inputs.job_id)
        head = f"host {self.label} pressure"
        text = (f"{head}: {suspects[0].job.label()} {self.says(suspects[0].contribution, inputs)}"
                if suspects else f"{head}: no co-located job found")
        figures = ((f"{whose} {self.resource} PSI {self.line} avg10 %", psi_line.avg10),
                   ("threshold %", self.threshold(th)))
        return _Finding(self.cause, figures, suspects, text)


def _cores(value: Optional[float], inputs: DiagnosisInputs) -> str:
    if value is None:
        return "(CPU use not measured)"
    of = f" of {inputs.node_cpus}" if inputs.node_cpus else ""
    return f"uses {value:.1f}{of} cores"


def _gib(value: Optional[float], inputs: DiagnosisInputs) -> str:
    return "(memory not measured)" if value is None else f"holds {value / 2**30:.1f} GiB"


def _mib_s(value: Optional[float], inputs: DiagnosisInputs) -> str:
    return "(IO not measured)" if value is None else f"moves {value / 2**20:.1f} MiB/s"


def _network(inputs: DiagnosisInputs, th: Thresholds, unknown: List[str]) -> Optional[_Finding]:
    nics = [n for n in inputs.nics if n.name != "lo"]
    if not nics:
        unknown.append("NIC load")
    for nic in nics:
        if nic.rx_bytes_per_s is None or nic.tx_bytes_per_s is None or not nic.link_bytes_per_s:
            unknown.append(f"NIC {nic.name} load")
            continue
        busy = max(nic.rx_bytes_per_s, nic.tx_bytes_per_s) / nic.link_bytes_per_s
        if busy >= th.nic_busy_fraction:
            return _Finding(Cause.NETWORK, (("nic busy fraction", busy),
                                            ("threshold", th.nic_busy_fraction)), (),
                            f"network: {nic.name} at {busy:.0%} of its link "
                            "(network has no per-job counter)")
    return None


#: The rule table, in the order a cause is preferred when several hold.
RULES: Tuple[Tuple[Cause, _Check], ...] = (
    (Cause.GPU_MEMORY_FULL, _gpu_memory),
    (Cause.SM_SATURATED_BY_NEIGHBOUR, _sm_neighbour),
    (Cause.HOST_CPU_PRESSURE, _HostRule(
        Cause.HOST_CPU_PRESSURE, resource="cpu", label="CPU", line="some",
        threshold=lambda t: t.cpu_psi_some_avg10, measure=lambda n: n.cpu_cores, says=_cores)),
    (Cause.HOST_MEMORY_PRESSURE, _HostRule(
        Cause.HOST_MEMORY_PRESSURE, resource="memory", label="memory", line="some",
        threshold=lambda t: t.memory_psi_some_avg10,
        measure=lambda n: None if n.memory_bytes is None else float(n.memory_bytes), says=_gib)),
    (Cause.HOST_IO_PRESSURE, _HostRule(
        Cause.HOST_IO_PRESSURE, resource="io", label="IO", line="full",
        threshold=lambda t: t.io_psi_full_avg10, measure=lambda n: n.io_bytes_per_s,
        says=_mib_s)),
    (Cause.NETWORK, _network),
)


def diagnose(inputs: DiagnosisInputs, thresholds: Optional[Thresholds] = None) -> Diagnosis:
    """Apply :data:`RULES` in order; UNKNOWN rather than NONE_FOUND when figures were missing."""
    th = thresholds or Thresholds()
    unknown: List[str] = []
    found = [f for f in (check(inputs, th, unknown) for _, check in RULES) if f is not None]
    if found:
        first = found[0]
        return Diagnosis(first.cause, first.figures, first.suspects, first.text,
                         also=tuple(f.cause for f in found[1:]), unknown=tuple(unknown))
    if unknown:
        return Diagnosis(Cause.UNKNOWN, (), (), "cause unknown: no figure for "
                         + ", ".join(unknown), unknown=tuple(unknown))
    return Diagnosis(Cause.NONE_FOUND, (), (), "no co-located cause found")
