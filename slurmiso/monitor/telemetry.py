"""Where GPU load and inference latency come from: one protocol, several sources.

* :class:`AgentSource` — ``slurmiso agent`` on each node (HTTP GET of its ``/metrics``);
* :class:`PrometheusSource` — a Prometheus server holding DCGM-exporter series (or the
  agents' own), plus one PromQL expression per class for P99 latency;
* :class:`FileSource` — recorded agent output (``<node>.prom`` files), for tests and replays;
* :class:`BackendSource` — the GPU backend read in-process (one host, e.g. the sandbox).

A source never raises for missing or malformed data: what it could not get is an error line
in the :class:`Reading`, a counted reason (``unknown``) and a node without an age, which the
policy treats as unknown. An agent that says ``slurmiso_agent_up 0``, or answers without GPU
series, is unknown too, never calm. HTTP goes through :mod:`slurmiso.exposition.scrape`: one
deadline for every source of a cycle, a bounded number of connections open at once.
"""

from __future__ import annotations

import json
import logging
import os
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Set,
    Tuple,
)

from slurmiso.exposition import job_series, scrape
from slurmiso.exposition.gpu_series import (
    DCGM_FREE,
    DCGM_GR,
    DCGM_SM,
    DCGM_USED,
    DCGM_UTIL,
    M_COLLECTED,
    M_GR,
    M_MEM_TOTAL,
    M_MEM_USED,
    M_PROCS,
    M_SM,
    M_UP,
    MIB,
)
from slurmiso.exposition.job_series import JobSignals
from slurmiso.exposition.text import BadData, Sample, parse_prometheus_text
from slurmiso.monitor import host_view
from slurmiso.monitor.host_view import JobHostFigures, NodeHostFigures
from slurmiso.monitor.snapshot import GpuSample, ParkSeen
from slurmiso.restraints import HEARTBEAT_HEADER, heartbeat_credential

if TYPE_CHECKING:
    from slurmiso.config.model import Config

log = logging.getLogger(__name__)


@dataclass
class Reading:
    """GPU samples and data age per node, P99 latency per class, and what went missing."""

    gpus: Dict[str, List[GpuSample]] = field(default_factory=dict)
    ages: Dict[str, float] = field(default_factory=dict)
    latency_p99_ms: Dict[str, float] = field(default_factory=dict)
    latency_age_s: Optional[float] = None
    errors: List[str] = field(default_factory=list)
    #: "source/reason" -> how many signals came back unknown for that reason.
    unknown: Dict[str, int] = field(default_factory=dict)
    #: Per-job signals, job id -> signals (the node agents fill them).
    job_signals: Dict[str, JobSignals] = field(default_factory=dict)
    #: node -> "source/reason" of its own telemetry that came back unknown this cycle.
    node_unknown: Dict[str, str] = field(default_factory=dict)
    #: The agents' host figures (issue 36): per node, and per job (the first node's).
    host_nodes: Dict[str, NodeHostFigures] = field(default_factory=dict)
    host_jobs: Dict[str, JobHostFigures] = field(default_factory=dict)
    #: What the agents say of each job's park (issue 35): job -> ParkSeen.
    parks: Dict[str, ParkSeen] = field(default_factory=dict)

    def miss(self, source: str, reason: str, line: str, node: str = "") -> None:
        """Count an unknown signal and keep one line about it (the first 200 only); with
        ``node``, the node whose telemetry it was (the monitor tells which are unknown)."""
        key = f"{source}/{reason}"
        self.unknown[key] = self.unknown.get(key, 0) + 1
        if node:
            self.node_unknown.setdefault(node, key)
        if len(self.errors) < 200:
            self.errors.append(line)


class TelemetrySource(Protocol):
    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        """Telemetry of ``nodes`` (name -> address) as of ``now`` (Unix seconds)."""


def agent_gpus(samples: List[Sample]) -> Tuple[List[GpuSample], Optional[float]]:
    """GPUs of one node from the agent's series, and when the agent collected them."""
    gpus: Dict[int, Dict[str, Any]] = {}
    collected: Optional[float] = None
    for s in samples:
        if s.name == M_COLLECTED:
            collected = s.value
            continue
        if "gpu" not in s.labels or s.name.startswith(("DCGM_", "slurmiso_job_")):
            continue  # (the per-job series are read by exposition/job_series.py)
        try:
            index = int(s.labels["gpu"])
        except ValueError:
            raise BadData("bad-label", f"gpu label {s.labels['gpu'][:20]!r} is not an "
                          "index") from None
        g = gpus.setdefault(index, {"mig": [], "jobs": set(), "classes": set()})
        whole = not s.labels.get("gi")
        for key in ("job", "class"):
            if s.labels.get(key):
                g["jobs" if key == "job" else "classes"].update(s.labels[key].split(","))
        if not whole:
            if s.name == M_MEM_TOTAL and s.labels.get("profile"):
                g["mig"].append(s.labels["profile"])
            continue
        if s.name == M_MEM_USED:
            g["mem"] = int(s.value // MIB)
        elif s.name == M_MEM_TOTAL:
            g["total"] = int(s.value // MIB)
        elif s.name == M_SM:
            g["sm"] = 100.0 * s.value
        elif s.name == M_GR:
            g["gr"] = 100.0 * s.value
        elif s.name == M_PROCS:
            g["procs"] = int(s.value)
    return [
        GpuSample(i, g.get("mem", 0), g.get("total", 0), g.get("sm"), g.get("gr"),
                  g.get("procs", 0), tuple(sorted(g["jobs"])), tuple(sorted(g["classes"])),
                  tuple(sorted(g["mig"])))
        for i, g in sorted(gpus.items())
    ], collected


def agent_view(text: str, now: float) -> Tuple[List[GpuSample], Optional[float]]:
    """One agent's answer as (GPUs, data age); the age is None when the agent did not say
    when it read the GPUs (not measured, never "fresh"). :class:`BadData` when it cannot be
    trusted: unparsable, ``slurmiso_agent_up 0``, no GPU series, a memory total missing."""
    gpus, age, _ = agent_reading(text, now)
    return gpus, age


def agent_reading(text: str, now: float) -> Tuple[List[GpuSample], Optional[float],
                                                   List[Sample]]:
    """:func:`agent_view` plus the parsed samples, so the per-job signals in the same answer
    (:mod:`slurmiso.exposition.job_series`) are read without parsing it twice."""
    samples = parse_prometheus_text(text, strict=True)
    if any(s.name == M_UP and s.value < 1 for s in samples):
        raise BadData("agent-down", "the agent could not read its GPUs (slurmiso_agent_up 0)")
    gpus, collected = agent_gpus(samples)
    if not gpus:
        raise BadData("no-gpus", "no GPU series in the answer")
    if any(not g.memory_total_mb for g in gpus):
        raise BadData("no-memory", "a GPU without its memory total")
    return gpus, (None if collected is None else max(0.0, now - collected)), samples


def http_get(url: str, timeout: float) -> str:
    """GET ``url`` within ``timeout`` in all; raises OSError on any failure."""
    return scrape.get(url, timeout)


# ---------------------------------------------------------------------------- sources
class AgentSource:
    """Scrape ``slurmiso agent`` on every node, ``max_open`` at a time, all within
    ``deadline_s``; a hanging agent costs at most ``timeout`` of one connection slot."""

    def __init__(self, port: int, urls: Optional[Mapping[str, str]] = None,
                 timeout: float = 3.0, workers: int = 256, deadline_s: float = 10.0) -> None:
        self.port = port
        self.urls = dict(urls or {})
        self.timeout = timeout
        self.workers = workers
        self.deadline_s = deadline_s
        #: The host figures of the scrape before, for rates (CPU cores, IO and NIC bytes/s).
        self._host_before: Tuple[Dict[str, NodeHostFigures], Dict[str, JobHostFigures]] = ({}, {})

    def url_for(self, node: str, addr: str) -> str:
        return self.urls.get(node) or f"http://{addr or node}:{self.port}/metrics"

    def nudge(self, nodes: Mapping[str, str]) -> None:
        """Ask each node's agent (name -> address) to read its restraints from Slurm now: a
        scrape carrying the monitor's credential and :data:`~slurmiso.restraints.WAKE_HEADER`
        (the agent wakes its restraint watch only for a credential munged vouches for)."""
        from slurmiso.restraints import WAKE_HEADER, WAKE_RESTRAINTS

        wanted = [n for n in nodes if n in self.urls] if self.urls else list(nodes)
        heads = {n: {HEARTBEAT_HEADER: c, WAKE_HEADER: WAKE_RESTRAINTS} for n in wanted
                 if (c := heartbeat_credential(n)) is not None}
        urls = {n: self.url_for(n, nodes[n]) for n in heads}
        if urls:
            scrape.fetch_all(urls, min(2.0, self.deadline_s), max(1, self.workers),
                             min(self.timeout, 2.0), key_headers=heads)

    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        reading = Reading()
        # Explicit URLs name the only agents there are (several nodes on one host share an
        # address, so guessing host:port would scrape one node's agent for all of them).
        wanted = [n for n in nodes if n in self.urls] if self.urls else list(nodes)
        urls = {n: self.url_for(n, nodes.get(n, "")) for n in wanted}
        # the header is the monitor's heartbeat on each node (slurmiso/restraints.py)
        beats = {n: {HEARTBEAT_HEADER: c} for n in wanted
                 if (c := heartbeat_credential(n)) is not None}
        got = scrape.fetch_all(urls, self.deadline_s, max(1, self.workers),
                               min(self.timeout, self.deadline_s), key_headers=beats)
        for node in wanted:
            res = got[node]
            if res.body is None:
                reading.miss("agents", res.reason, f"agent {urls[node]}: {res.reason}"
                             f"{' (' + res.detail + ')' if res.detail else ''}", node)
                continue
            try:
                gpus, age, samples = agent_reading(res.body, now)
            except BadData as exc:
                reading.miss("agents", exc.reason, f"agent {urls[node]}: {exc}", node)
                continue
            # Each inference job's own figures (the ladder's input). A job on several nodes
            # keeps one node's: the first its agents answered for. A reply whose per-job
            # series do not parse is this node's unknown data, never the whole cycle's.
            try:
                jobs = job_series.from_samples(samples, node)
            except (ValueError, KeyError, TypeError) as exc:
                reading.miss("agents", "bad-job-series", f"agent {urls[node]}: {exc}", node)
                continue
            reading.gpus[node] = gpus
            for jid, js in jobs.items():
                reading.job_signals.setdefault(jid, js)
            host_figures(reading, samples, node, now, self._host_before)
            for jid, seen in park_view(samples).items():
                reading.parks.setdefault(jid, seen)
            if age is not None:  # no age: unknown, and gather treats it so
                reading.ages[node] = age
        self._host_before = (dict(reading.host_nodes), dict(reading.host_jobs))
        return reading


def park_view(samples: List[Sample]) -> Dict[str, ParkSeen]:
    """Each job's park as one agent's answer gives it: parked now (its seconds series) and
    the notes it will not park (by ``since``); samples that do not parse are skipped."""
    from slurmiso.restraints import M_PARK, M_PARK_REFUSED

    parked: Set[str] = set()
    refused: Dict[str, List[float]] = {}
    for s in samples:
        job = s.labels.get("job", "")
        if not job:
            continue
        if s.name == M_PARK:
            parked.add(job)
        elif s.name == M_PARK_REFUSED and s.value >= 1:
            try:
                refused.setdefault(job, []).append(float(s.labels.get("since", "")))
            except ValueError:
                continue
    return {j: ParkSeen(j in parked, tuple(sorted(refused.get(j, ()))))
            for j in sorted(parked | set(refused))}


def host_figures(reading: Reading, samples: List[Sample], node: str, now: float,
                 before: Tuple[Dict[str, NodeHostFigures], Dict[str, JobHostFigures]]) -> None:
    """The node's and its jobs' host figures from one agent's answer into ``reading``, with
    rates where ``before`` (the scrape before: node -> figures, job -> figures) has them."""
    figures, jobs = host_view.from_samples(samples, node, now)
    if figures is None:
        return  # an agent without host figures (older) or that could not read them
    reading.host_nodes[node] = host_view.node_with_rates(figures, before[0].get(node))
    for jid, fig in jobs.items():
        reading.host_jobs.setdefault(jid, host_view.with_rates(fig, before[1].get(jid)))


class FileSource:
    """Recorded agent output: ``DIR/<node>.prom``; age from the collected-at series, else
    the file's modification time."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        reading = Reading()
        for node in nodes:
            path = os.path.join(self.folder, f"{node}.prom")
            try:
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                mtime = os.path.getmtime(path)
            except OSError as exc:
                reading.miss("files", "unreadable", f"{path}: {exc.strerror}", node)
                continue
            try:
                gpus, age, samples = agent_reading(text, now)
            except BadData as exc:
                reading.miss("files", exc.reason, f"{path}: {exc}", node)
                continue
            reading.gpus[node] = gpus
            host_figures(reading, samples, node, now, ({}, {}))  # one file: no rates
            reading.ages[node] = age if age is not None else max(0.0, now - mtime)
        return reading


class AgentRow(Protocol):
    """One whole GPU (``gi`` "") or MIG instance as the node agent reads it in-process
    (``slurmiso.agent.gpus.DeviceRow``): what :class:`BackendSource` folds into samples."""

    @property
    def gpu(self) -> int: ...
    @property
    def gi(self) -> str: ...
    @property
    def profile(self) -> str: ...
    @property
    def memory_used_mb(self) -> int: ...
    @property
    def memory_total_mb(self) -> int: ...
    @property
    def sm_active(self) -> Optional[float]: ...
    @property
    def gr_active(self) -> Optional[float]: ...
    @property
    def processes(self) -> int: ...
    @property
    def jobs(self) -> Tuple[str, ...]: ...
    @property
    def classes(self) -> Tuple[str, ...]: ...


class AgentReport(Protocol):
    """One node read in-process (``slurmiso.agent.gpus.NodeReport``)."""

    @property
    def collected(self) -> float: ...
    @property
    def rows(self) -> Sequence[AgentRow]: ...


def report_samples(report: AgentReport) -> List[GpuSample]:
    """The monitor's view of an in-process read: one sample per GPU, MIG instances folded
    in."""
    out = []
    for r in report.rows:
        if r.gi:
            continue
        insts = [i for i in report.rows if i.gi and i.gpu == r.gpu]
        jobs = set(r.jobs).union(*(i.jobs for i in insts))
        classes = set(r.classes).union(*(i.classes for i in insts))
        out.append(GpuSample(
            r.gpu, r.memory_used_mb, r.memory_total_mb,
            None if r.sm_active is None else 100.0 * r.sm_active,
            None if r.gr_active is None else 100.0 * r.gr_active,
            r.processes, tuple(sorted(jobs)), tuple(sorted(classes)),
            tuple(sorted(i.profile for i in insts))))
    return out


class BackendSource:
    """Read each node's GPU backend in-process: for one host serving several simulated nodes
    (the sandbox), or a monitor running on the GPU node itself. ``read_node`` is the node
    agent's reader (``slurmiso.agent.gpus.gather_node``), handed in by the CLI so the
    monitor never imports the agent; it raises :class:`SlurmisoError` when the GPUs cannot
    be read."""

    def __init__(self, cfg: Config, read_node: Callable[[Config, str], AgentReport]) -> None:
        self.cfg = cfg
        self.read_node = read_node

    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        from slurmiso.errors import SlurmisoError

        reading = Reading()
        for node in nodes:
            if self.cfg.pool_for_node(node) is None:
                continue
            try:
                report = self.read_node(self.cfg, node)
            except SlurmisoError as exc:
                reading.miss("local", "gpu-error", f"{node}: {exc}", node)
                continue
            reading.gpus[node] = report_samples(report)
            reading.ages[node] = max(0.0, now - report.collected)
        return reading


class PrometheusSource:
    """DCGM-exporter series (or the agents') and per-class P99 latency from a Prometheus
    server's ``/api/v1/query``, all queries of a cycle within ``deadline_s``."""

    def __init__(self, url: str, latency_queries: Optional[Mapping[str, str]] = None,
                 timeout: float = 5.0, deadline_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.latency_queries = dict(latency_queries or {})
        self.timeout = timeout
        self.deadline_s = deadline_s
        self._end = 0.0

    def query(self, promql: str) -> List[Sample]:
        """One instant query; raises OSError/ValueError when the server fails."""
        left = self._end - time.monotonic() if self._end else self.timeout
        if left <= 0:
            raise OSError("cycle deadline passed")
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        return parse_query_result(json.loads(http_get(url, min(self.timeout, left))))

    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        reading = Reading()
        self._end = time.monotonic() + self.deadline_s
        series: Dict[str, List[Sample]] = {}
        for name in (DCGM_USED, DCGM_FREE, DCGM_SM, DCGM_GR, DCGM_UTIL,
                     f"timestamp({DCGM_USED})"):
            try:
                series[name] = self.query(name)
            except (OSError, ValueError) as exc:
                reading.miss("prometheus", "query", f"prometheus {self.url} {name}: {exc}")
                break
        try:
            if series.get(DCGM_USED):
                dcgm_gpus(series, nodes, now, reading)
            elif DCGM_USED in series:
                self._agent_series(nodes, now, reading)
        except BadData as exc:
            reading.gpus.clear()
            reading.ages.clear()
            reading.miss("prometheus", exc.reason, f"prometheus {self.url}: {exc}")
        ages = []
        for cls, promql in sorted(self.latency_queries.items()):
            try:
                values = self.query(promql)
                stamps = [v.value for v in self.query(f"timestamp({promql})")]
            except (OSError, ValueError) as exc:
                reading.miss("latency", "query", f"prometheus latency of {cls}: {exc}")
                continue
            if not values:
                reading.miss("latency", "empty", f"prometheus latency of {cls}: no sample")
                continue
            reading.latency_p99_ms[cls] = max(v.value for v in values)
            if stamps:  # the samples' own time, not the query's
                ages.append(max(0.0, now - min(stamps)))
            else:
                reading.miss("latency", "no-timestamp", f"latency of {cls}: age unknown")
        reading.latency_age_s = max(ages) if ages and len(ages) == len(
            reading.latency_p99_ms) else None
        self._end = 0.0
        return reading

    def _agent_series(self, nodes: Mapping[str, str], now: float, reading: Reading) -> None:
        """No DCGM series: fall back to slurmiso agents scraped by the same server."""
        by_node: Dict[str, List[Sample]] = {}
        try:
            for name in (M_MEM_USED, M_MEM_TOTAL, M_SM, M_GR, M_PROCS, M_COLLECTED):
                for s in self.query(name):
                    by_node.setdefault(s.labels.get("node", ""), []).append(
                        Sample(name, s.labels, s.value, s.ts))
        except (OSError, ValueError) as exc:
            reading.miss("prometheus", "query", f"prometheus {self.url}: {exc}")
            return
        for node in nodes:
            if node in by_node:
                gpus, collected = agent_gpus(by_node[node])
                if not collected:
                    reading.miss("prometheus", "no-timestamp", f"{node}: sample age unknown",
                         node)
                    continue
                reading.gpus[node] = gpus
                reading.ages[node] = max(0.0, now - collected)


def parse_query_result(doc: Any) -> List[Sample]:
    """``/api/v1/query`` JSON (vector result) into samples; ValueError if it is an error."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise ValueError(f"query failed: {doc.get('error') if isinstance(doc, dict) else doc}")
    data = doc.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"expected a vector result, got {data.get('resultType')!r}")
    out = []
    try:
        for item in data.get("result", []):
            metric = {str(k): str(v) for k, v in dict(item.get("metric", {})).items()}
            ts, value = item["value"]
            out.append(Sample(metric.get("__name__", ""), metric, float(value), float(ts)))
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed query result: {exc!r}") from None
    return out


#: The labels that name a DCGM series' node: the exporter's own (``Hostname`` in its releases,
#: ``hostname`` in its newer source; absent with ``--no-hostname``), then Prometheus's target.
NODE_LABELS = ("Hostname", "hostname", "instance")


def dcgm_node(labels: Mapping[str, str], nodes: Mapping[str, str]) -> str:
    """The cluster node a DCGM series is about ("" if none): by name, short name or address;
    ``instance`` without its port."""
    by_addr = {addr: n for n, addr in nodes.items() if addr}
    for label in NODE_LABELS:
        host = labels.get(label, "")
        if label == "instance" and host.count(":") == 1:
            host = host.rsplit(":", 1)[0]
        host = host.strip("[]")
        if not host:
            continue
        short = host.split(".")[0]
        node = host if host in nodes else short if short in nodes else by_addr.get(host, "")
        if node:
            return node
    return ""


def _label_words(labels: Mapping[str, str]) -> str:
    shown = [f"{k}={labels[k][:40]!r}" for k in NODE_LABELS + ("gpu",) if k in labels]
    return ", ".join(shown) or "none of them"


def dcgm_gpus(
    series: Mapping[str, List[Sample]], nodes: Mapping[str, str], now: float, reading: Reading
) -> None:
    """Fold DCGM series into per-GPU samples: MIG instances (``GPU_I_ID``) add up their
    framebuffer; SM/engine activity takes the busiest instance (what can hurt inference).
    A series whose node cannot be told is counted (``prometheus/unmapped``) with its labels,
    never dropped in silence."""
    acc: Dict[Tuple[str, int], Dict[str, Any]] = {}
    unmapped = 0
    for name, key in ((DCGM_USED, "mem"), (DCGM_FREE, "free"), (DCGM_SM, "sm"),
                      (DCGM_GR, "gr"), (DCGM_UTIL, "util"), (f"timestamp({DCGM_USED})", "seen")):
        for s in series.get(name, []):
            node = dcgm_node(s.labels, nodes)
            if not node or "gpu" not in s.labels:
                unmapped += 1
                if unmapped == 1:
                    line = (f"DCGM series {name} maps to no node of the cluster by its "
                            f"Hostname, hostname or instance labels "
                            f"({_label_words(s.labels)}): counted as prometheus/unmapped; "
                            f"run DCGM exporter without --no-hostname, or relabel instance "
                            f"to the node's name")
                    log.warning("monitor: %s", line)
                    reading.errors.append(line)  # the journal's and doctor's words
                continue
            try:
                index = int(s.labels["gpu"])
            except ValueError:
                raise BadData("bad-label", f"gpu label {s.labels['gpu'][:20]!r} of "
                              f"{name}") from None
            g = acc.setdefault((node, index), {"mig": []})
            if key in ("mem", "free"):
                g[key] = g.get(key, 0.0) + s.value  # MiB, summed over MIG instances
                if key == "mem" and s.labels.get("GPU_I_PROFILE"):
                    g["mig"].append(s.labels["GPU_I_PROFILE"])
            elif key == "seen":
                g["seen"] = min(g.get("seen", s.value), s.value)
            elif key == "util":  # percent already; graphics-engine busy, not SM
                g[key] = max(g.get(key, 0.0), s.value)
            else:
                g[key] = max(g.get(key, 0.0), 100.0 * s.value)
    if unmapped:  # counted, not an error: a Prometheus may hold GPUs outside the cluster
        reading.unknown["prometheus/unmapped"] = unmapped
    for (node, index), g in sorted(acc.items()):
        used = int(g.get("mem", 0))
        total = used + int(g["free"]) if "free" in g else 0  # 0: unknown, never calm
        reading.gpus.setdefault(node, []).append(GpuSample(
            index, used, total, g.get("sm"), g.get("gr", g.get("util")),
            mig_profiles=tuple(sorted(g["mig"]))))
        age = max(0.0, now - g["seen"]) if "seen" in g else None
        if age is None:
            reading.miss("prometheus", "no-timestamp", f"{node}: sample age unknown",
                         node)
            continue
        reading.ages[node] = max(reading.ages.get(node, 0.0), age)
    for node in nodes:
        if node in reading.gpus and node not in reading.ages:
            del reading.gpus[node]
