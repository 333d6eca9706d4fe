"""Where GPU load and inference latency come from: one protocol, several sources.

* :class:`AgentSource` — ``slurmiso agent`` on each node (HTTP GET of its ``/metrics``);
* :class:`PrometheusSource` — a Prometheus server holding DCGM-exporter series (or the
  agents' own), plus one PromQL expression per class for P99 latency;
* :class:`FileSource` — recorded agent output (``<node>.prom`` files), for tests and replays;
* :class:`BackendSource` — the GPU backend read in-process (one host, e.g. the sandbox).

A source never raises for missing data: what it could not get is an error line in the
:class:`Reading` and a node without an age, which the policy treats as stale. HTTP is urllib
with a timeout on every request. Stdlib only: the monitor host needs no prometheus_client.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Protocol, Tuple

from slurmiso.monitor.snapshot import GpuSample

log = logging.getLogger(__name__)

# Series the agent exports (slurmiso.monitor.agent) and this module reads back.
M_MEM_USED = "slurmiso_gpu_memory_used_bytes"
M_MEM_TOTAL = "slurmiso_gpu_memory_total_bytes"
M_SM = "slurmiso_gpu_sm_active_ratio"
M_GR = "slurmiso_gpu_gr_engine_active_ratio"
M_PROCS = "slurmiso_gpu_processes"
M_COLLECTED = "slurmiso_agent_collected_timestamp_seconds"
DCGM_USED, DCGM_FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
DCGM_SM, DCGM_GR = "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
MIB = 1024 * 1024


class Sample(NamedTuple):
    name: str
    labels: Dict[str, str]
    value: float
    ts: Optional[float] = None


@dataclass
class Reading:
    """GPU samples and data age per node, P99 latency per class, and what went missing."""

    gpus: Dict[str, List[GpuSample]] = field(default_factory=dict)
    ages: Dict[str, float] = field(default_factory=dict)
    latency_p99_ms: Dict[str, float] = field(default_factory=dict)
    latency_age_s: Optional[float] = None
    errors: List[str] = field(default_factory=list)


class TelemetrySource(Protocol):
    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        """Telemetry of ``nodes`` (name -> address) as of ``now`` (Unix seconds)."""


# ------------------------------------------------------------------------ text format
def parse_prometheus_text(text: str) -> List[Sample]:
    """Prometheus text exposition format (0.0.4) into samples; bad lines are skipped."""
    out: List[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            out.append(_parse_line(line))
        except (ValueError, IndexError):
            log.debug("skipping unparsable metrics line %r", line[:120])
    return out


def _parse_line(line: str) -> Sample:
    labels: Dict[str, str] = {}
    brace = line.find("{")
    space = line.find(" ")
    if brace != -1 and (space == -1 or brace < space):
        name = line[:brace]
        i = brace + 1
        while line[i] != "}":
            eq = line.index("=", i)
            key = line[i:eq].strip().lstrip(",").strip()
            i = eq + 2  # past ="
            buf = []
            while line[i] != '"':
                if line[i] == "\\":
                    i += 1
                    buf.append({"n": "\n", "\\": "\\", '"': '"'}.get(line[i], line[i]))
                else:
                    buf.append(line[i])
                i += 1
            labels[key] = "".join(buf)
            i += 1
            while line[i] in ", ":
                i += 1
        rest = line[i + 1:].split()
    else:
        name, *rest = line.split()
    value = float(rest[0])
    ts = float(rest[1]) / 1000.0 if len(rest) > 1 else None
    return Sample(name, labels, value, ts)


def agent_gpus(samples: List[Sample]) -> Tuple[List[GpuSample], Optional[float]]:
    """GPUs of one node from the agent's series, and when the agent collected them."""
    gpus: Dict[int, Dict[str, Any]] = {}
    collected: Optional[float] = None
    for s in samples:
        if s.name == M_COLLECTED:
            collected = s.value
            continue
        if "gpu" not in s.labels:
            continue
        g = gpus.setdefault(int(s.labels["gpu"]), {"mig": [], "jobs": set(), "classes": set()})
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


def http_get(url: str, timeout: float) -> str:
    """GET ``url``; raises OSError (URLError is one) on any failure."""
    req = urllib.request.Request(url, headers={"Accept": "text/plain, application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (http only)
        return str(resp.read().decode("utf-8", "replace"))


# ---------------------------------------------------------------------------- sources
class AgentSource:
    """Scrape ``slurmiso agent`` on every node in parallel (a slow node costs one timeout)."""

    def __init__(self, port: int, urls: Optional[Mapping[str, str]] = None,
                 timeout: float = 3.0, workers: int = 32) -> None:
        self.port = port
        self.urls = dict(urls or {})
        self.timeout = timeout
        self.workers = workers

    def url_for(self, node: str, addr: str) -> str:
        return self.urls.get(node) or f"http://{addr or node}:{self.port}/metrics"

    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        reading = Reading()
        # Explicit URLs name the only agents there are (several nodes on one host share an
        # address, so guessing host:port would scrape one node's agent for all of them).
        wanted = [n for n in nodes if n in self.urls] if self.urls else list(nodes)

        def fetch(node: str) -> Tuple[str, Optional[str], str]:
            url = self.url_for(node, nodes.get(node, ""))
            try:
                return node, http_get(url, self.timeout), ""
            except (OSError, ValueError) as exc:
                return node, None, f"agent {url}: {getattr(exc, 'reason', exc)}"

        with ThreadPoolExecutor(max_workers=max(1, min(self.workers, len(wanted)))) as pool:
            for node, text, err in pool.map(fetch, wanted):
                if text is None:
                    reading.errors.append(err)
                    continue
                gpus, collected = agent_gpus(parse_prometheus_text(text))
                reading.gpus[node] = gpus
                reading.ages[node] = max(0.0, now - collected) if collected else 0.0
        return reading


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
                reading.errors.append(f"{path}: {exc.strerror}")
                continue
            gpus, collected = agent_gpus(parse_prometheus_text(text))
            reading.gpus[node] = gpus
            reading.ages[node] = max(0.0, now - (collected or mtime))
        return reading


class BackendSource:
    """Read each node's GPU backend in-process: for one host serving several simulated nodes
    (the sandbox), or a monitor running on the GPU node itself."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg

    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        from slurmiso.errors import SlurmisoError
        from slurmiso.monitor.agent import gather_node

        reading = Reading()
        for node in nodes:
            if self.cfg.pool_for_node(node) is None:
                continue
            try:
                report = gather_node(self.cfg, node)
            except SlurmisoError as exc:
                reading.errors.append(f"{node}: {exc}")
                continue
            reading.gpus[node] = report.samples()
            reading.ages[node] = max(0.0, now - report.collected)
        return reading


class PrometheusSource:
    """DCGM-exporter series (or the agents') and per-class P99 latency from a Prometheus
    server's ``/api/v1/query``."""

    def __init__(self, url: str, latency_queries: Optional[Mapping[str, str]] = None,
                 timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.latency_queries = dict(latency_queries or {})
        self.timeout = timeout

    def query(self, promql: str) -> List[Sample]:
        """One instant query; raises OSError/ValueError when the server fails."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        return parse_query_result(json.loads(http_get(url, self.timeout)))

    def read(self, nodes: Mapping[str, str], now: float) -> Reading:
        reading = Reading()
        series: Dict[str, List[Sample]] = {}
        for name in (DCGM_USED, DCGM_FREE, DCGM_SM, DCGM_GR, f"timestamp({DCGM_USED})"):
            try:
                series[name] = self.query(name)
            except (OSError, ValueError) as exc:
                reading.errors.append(f"prometheus {self.url} {name}: "
                                      f"{getattr(exc, 'reason', exc)}")
                break
        if series.get(DCGM_USED):
            dcgm_gpus(series, nodes, now, reading)
        elif DCGM_USED in series:
            self._agent_series(nodes, now, reading)
        for cls, promql in sorted(self.latency_queries.items()):
            try:
                values = self.query(promql)
            except (OSError, ValueError) as exc:
                reading.errors.append(f"prometheus latency of {cls}: "
                                      f"{getattr(exc, 'reason', exc)}")
                continue
            if values:
                reading.latency_p99_ms[cls] = max(v.value for v in values)
                stamps = [v.ts for v in values if v.ts]
                reading.latency_age_s = max(0.0, now - max(stamps)) if stamps else 0.0
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
            reading.errors.append(f"prometheus {self.url}: {getattr(exc, 'reason', exc)}")
            return
        for node in nodes:
            if node in by_node:
                gpus, collected = agent_gpus(by_node[node])
                reading.gpus[node] = gpus
                reading.ages[node] = max(0.0, now - collected) if collected else 0.0


def parse_query_result(doc: Any) -> List[Sample]:
    """``/api/v1/query`` JSON (vector result) into samples; ValueError if it is an error."""
    if not isinstance(doc, dict) or doc.get("status") != "success":
        raise ValueError(f"query failed: {doc.get('error') if isinstance(doc, dict) else doc}")
    data = doc.get("data") or {}
    if data.get("resultType") != "vector":
        raise ValueError(f"expected a vector result, got {data.get('resultType')!r}")
    out = []
    for item in data.get("result", []):
        metric = dict(item.get("metric", {}))
        ts, value = item["value"]
        out.append(Sample(metric.get("__name__", ""), metric, float(value), float(ts)))
    return out


def dcgm_gpus(
    series: Mapping[str, List[Sample]], nodes: Mapping[str, str], now: float, reading: Reading
) -> None:
    """Fold DCGM series into per-GPU samples: MIG instances (``GPU_I_ID``) add up their
    framebuffer; SM/engine activity takes the busiest instance (what can hurt inference)."""
    by_addr = {addr: n for n, addr in nodes.items() if addr}
    acc: Dict[Tuple[str, int], Dict[str, Any]] = {}

    def node_of(s: Sample) -> str:
        host = s.labels.get("Hostname", "")
        short = host.split(".")[0]
        return host if host in nodes else short if short in nodes else by_addr.get(host, "")

    for name, key in ((DCGM_USED, "mem"), (DCGM_FREE, "free"), (DCGM_SM, "sm"),
                      (DCGM_GR, "gr"), (f"timestamp({DCGM_USED})", "seen")):
        for s in series.get(name, []):
            node = node_of(s)
            if not node or "gpu" not in s.labels:
                continue
            g = acc.setdefault((node, int(s.labels["gpu"])), {"mig": []})
            if key in ("mem", "free"):
                g[key] = g.get(key, 0.0) + s.value  # MiB, summed over MIG instances
                if key == "mem" and s.labels.get("GPU_I_PROFILE"):
                    g["mig"].append(s.labels["GPU_I_PROFILE"])
            elif key == "seen":
                g["seen"] = min(g.get("seen", s.value), s.value)
            else:
                g[key] = max(g.get(key, 0.0), 100.0 * s.value)
    for (node, index), g in sorted(acc.items()):
        used = int(g.get("mem", 0))
        reading.gpus.setdefault(node, []).append(GpuSample(
            index, used, used + int(g.get("free", 0)), g.get("sm"), g.get("gr"),
            mig_profiles=tuple(sorted(g["mig"]))))
        age = max(0.0, now - g["seen"]) if "seen" in g else 0.0
        reading.ages[node] = max(reading.ages.get(node, 0.0), age)
