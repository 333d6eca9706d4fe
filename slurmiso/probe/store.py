"""Probe results on disk: one JSON per probe, the latest per pool, and a Prometheus textfile.

A probe is a baseline the live figures are read against, so it is kept (``paths.probe_dir``,
default ``/var/lib/slurmiso/probe``; not the tmpfs state dir, which a reboot empties). The audit
shows the newest probe of each pool beside its own figures, and the textfile
(``slurmiso_probe.prom``, for node_exporter's textfile collector) puts the same baselines on the
Grafana dashboard next to the agent's per-job series.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from typing import Any, Dict, List, Optional

from slurmiso.atomic import write_atomic
from slurmiso.errors import SlurmisoError

log = logging.getLogger(__name__)

PREFIX = "probe-"
TEXTFILE = "slurmiso_probe.prom"
#: name -> (help, how to get the value from a modes[] entry, scale)
SERIES = {
    "slurmiso_probe_p99_seconds": ("Inference P99 latency beside training, per mode (probe)",
                                   ("infer", "p99_ms"), 1e-3),
    "slurmiso_probe_solo_p99_seconds": ("Inference P99 latency alone, per mode (probe)",
                                        ("infer_solo", "p99_ms"), 1e-3),
    "slurmiso_probe_error_ratio": ("Share of inference requests failed or timed out beside "
                                   "training (probe)", ("infer", "error_rate"), 1.0),
    "slurmiso_probe_step_seconds": ("Median training step time beside inference (probe)",
                                    ("train", "step_s"), 1.0),
    "slurmiso_probe_solo_step_seconds": ("Median training step time alone (probe)",
                                         ("train_solo", "step_s"), 1.0),
    "slurmiso_probe_throughput_vs_solo": ("Training throughput beside inference over alone "
                                          "(probe)", ("train", "throughput_vs_solo"), 1.0),
}
EXTRA_SERIES = {
    "slurmiso_probe_recommended": "1 for the mode the probe recommends for the pool",
    "slurmiso_probe_timestamp_seconds": "When the probe ran (Unix s)",
}


def save(report: Dict[str, Any], results_dir: str) -> str:
    """Write the report as ``probe-<UTC time>.json`` (atomically); return its path."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(report.get("generated_ts") or None))
    path = os.path.join(results_dir, f"{PREFIX}{stamp}-{os.getpid()}.json")
    try:
        os.makedirs(results_dir, 0o755, exist_ok=True)
        write_atomic(path, json.dumps(report, indent=2, sort_keys=True, default=str) + "\n")
    except OSError as exc:
        raise SlurmisoError(f"cannot save the probe's results in {results_dir}: "
                            f"{exc.strerror or exc}",
                            hint="run as root, or pass --results-dir DIR") from None
    return path


def load_all(results_dir: str) -> List[Dict[str, Any]]:
    """Every readable probe report in ``results_dir``, oldest first (unreadable ones skipped)."""
    out = []
    for path in sorted(glob.glob(os.path.join(results_dir, f"{PREFIX}*.json"))):
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (OSError, ValueError) as exc:
            log.warning("probe results %s unreadable: %s", path, exc)
            continue
        if isinstance(data, dict) and isinstance(data.get("modes"), list):
            data["_path"] = path
            out.append(data)
    return sorted(out, key=lambda d: float(d.get("generated_ts") or 0))


def latest_per_pool(results_dir: str) -> Dict[str, Dict[str, Any]]:
    """pool -> the newest measured mode entry for it, with the probe's time, recommendation
    and file; what the audit shows."""
    latest: Dict[str, Dict[str, Any]] = {}
    for report in load_all(results_dir):
        rec = report.get("recommendation") or {}
        for m in report["modes"]:
            if not isinstance(m, dict) or m.get("skipped") or not m.get("pool"):
                continue
            latest[m["pool"]] = dict(m, generated=report.get("generated"),
                                     recommended=rec.get("mode"), file=report.get("_path"),
                                     slo=report.get("slo"))
    return dict(sorted(latest.items()))


def _value(entry: Dict[str, Any], where: tuple, scale: float) -> Optional[float]:
    value = (entry.get(where[0]) or {}).get(where[1])
    return None if value is None else float(value) * scale


def _label(text: str) -> str:
    return str(text).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def textfile(report: Dict[str, Any]) -> str:
    """The report's baselines in Prometheus' text format, one series per mode and pool."""
    lines: List[str] = []
    modes = [m for m in report["modes"] if not m.get("skipped")]
    for name, (help_text, where, scale) in SERIES.items():
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        for m in modes:
            value = _value(m, where, scale)
            if value is not None:
                lines.append(f'{name}{{mode="{_label(m["mode"])}",pool="{_label(m["pool"])}"}} '
                             f"{value:.9g}")
    rec = report.get("recommendation") or {}
    name = "slurmiso_probe_recommended"
    lines += [f"# HELP {name} {EXTRA_SERIES[name]}", f"# TYPE {name} gauge"]
    for m in modes:
        lines.append(f'{name}{{mode="{_label(m["mode"])}",pool="{_label(m["pool"])}"}} '
                     f'{1 if m["mode"] == rec.get("mode") else 0}')
    name = "slurmiso_probe_timestamp_seconds"
    lines += [f"# HELP {name} {EXTRA_SERIES[name]}", f"# TYPE {name} gauge"]
    when = float(report.get("generated_ts") or 0)
    for pool in sorted({m["pool"] for m in modes}):
        lines.append(f'{name}{{pool="{_label(pool)}"}} {when:.0f}')
    return "\n".join(lines) + "\n"


def write_textfile(report: Dict[str, Any], path: str) -> None:
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), 0o755, exist_ok=True)
        write_atomic(path, textfile(report), mode=0o644)
    except OSError as exc:
        raise SlurmisoError(f"cannot write the probe's metrics to {path}: "
                            f"{exc.strerror or exc}") from None


def metric_names() -> List[str]:
    """Every series name the textfile can hold (the dashboard test checks against these)."""
    return sorted(list(SERIES) + list(EXTRA_SERIES))
