"""What ``--infer-cmd`` and ``--train-cmd`` print, and reading it back from their output file.

The contract is small so that any site benchmark can meet it with a ``print``:

``--infer-cmd``: one line per request, either a bare number (the request's latency in ms, a
success) or a JSON object ``{"latency_ms": 12.3, "ok": true}`` (``ok`` defaults to true; a failed
request may leave out ``latency_ms``). A request slower than ``--request-timeout`` counts as an
error (a timeout) whatever ``ok`` says.

``--train-cmd``: one line per training step, a bare number (seconds) or ``{"step_s": 0.21}``. It
runs until it exits by itself or the probe sends SIGTERM (training beside inference is stopped
once inference is done).

Either may also print ``{"gpu_mem_peak_mb": 18432}`` (its GPU memory peak) and
``{"info": {...}}`` (free-form facts shown in the report). Any other line (logs, progress bars)
is ignored and counted. The commands get ``SLURMISO_PROBE_*`` variables (see
:data:`ENV_DOC`) they may use or ignore.
"""

from __future__ import annotations

import json
import math
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.probe.stats import InferSample
from slurmiso.values import Value, field

#: Variables every workload command gets (documented in docs/probe.md and --help).
ENV_DOC = {
    "SLURMISO_PROBE_ROLE": "infer or train",
    "SLURMISO_PROBE_REQUESTS": "inference: how many requests to send",
    "SLURMISO_PROBE_RATE": "inference: requests per second to aim for (0 = back to back)",
    "SLURMISO_PROBE_REQUEST_TIMEOUT_MS": "inference: a request slower than this is an error",
    "SLURMISO_PROBE_TRAIN_SECONDS": "training alone: how long to run",
    "SLURMISO_PROBE_STOP_FILE": "training: stop when this file appears (also sent SIGTERM)",
}
#: Ignored lines kept to show in an error message.
_KEEP_IGNORED = 3
_MAX_LINE = 4096


class Parsed(Value, frozen=False):
    """What one workload's output file held."""

    infer: List[InferSample] = field(default_factory=list)
    steps: List[float] = field(default_factory=list)
    gpu_mem_peak_mb: Optional[float] = None
    info: Dict[str, Any] = field(default_factory=dict)
    ignored: int = 0
    ignored_samples: List[str] = field(default_factory=list)


def _number(text: str) -> Optional[float]:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _json_number(obj: Dict[str, Any], key: str) -> Tuple[bool, Optional[float]]:
    """(key present, its value as a finite non-negative number or None)."""
    if key not in obj:
        return False, None
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True, None
    return True, _number(str(value))


def parse_line(line: str, role: str, into: Parsed) -> bool:
    """Add one output line to ``into``; False when the line is not part of the contract."""
    text = line.strip()[:_MAX_LINE]
    if not text:
        return True
    value = _number(text)
    if value is not None:
        if role == "infer":
            into.infer.append(InferSample(value, True))
        else:
            into.steps.append(value)
        return True
    if not text.startswith("{"):
        return False
    try:
        obj = json.loads(text)
    except ValueError:
        return False
    if not isinstance(obj, dict):
        return False
    known = False
    present, mem = _json_number(obj, "gpu_mem_peak_mb")
    if present and mem is not None:
        into.gpu_mem_peak_mb = max(mem, into.gpu_mem_peak_mb or 0.0)
        known = True
    if isinstance(obj.get("info"), dict):
        into.info.update(obj["info"])
        known = True
    if role == "infer" and ("latency_ms" in obj or "ok" in obj):
        _, lat = _json_number(obj, "latency_ms")
        ok = obj.get("ok", True)
        into.infer.append(InferSample(lat, bool(ok) and lat is not None))
        return True
    if role == "train" and "step_s" in obj:
        _, step = _json_number(obj, "step_s")
        if step is None:
            return False
        into.steps.append(step)
        return True
    return known


def parse_output(text: str, role: str) -> Parsed:
    """Every line of a workload's output, read by the contract above."""
    out = Parsed()
    for line in text.splitlines():
        if not parse_line(line, role, out):
            out.ignored += 1
            if len(out.ignored_samples) < _KEEP_IGNORED:
                out.ignored_samples.append(line.strip()[:120])
    return out


def read_output(path: str, role: str) -> Parsed:
    """:func:`parse_output` of a file; a missing file reads as no output."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return parse_output(fh.read(), role)
    except FileNotFoundError:
        return Parsed()
