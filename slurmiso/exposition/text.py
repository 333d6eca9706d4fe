"""The Prometheus text exposition format (0.0.4), parsed: what ``slurmiso agent`` reads from
a job's metrics endpoint and the monitor reads from the agents.

>>> parse_prometheus_text('up{node="n1"} 1')
[Sample(name='up', labels={'node': 'n1'}, value=1.0, ts=None)]
"""

from __future__ import annotations

import logging
from typing import Dict, List, NamedTuple, Optional

log = logging.getLogger(__name__)


class Sample(NamedTuple):
    name: str
    labels: Dict[str, str]
    value: float
    ts: Optional[float] = None


class BadData(ValueError):
    """An answer that parses but cannot be trusted (a non-integer ``gpu`` label)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def parse_prometheus_text(text: str, strict: bool = False) -> List[Sample]:
    """Prometheus text exposition format (0.0.4) into samples. Bad lines are skipped, or,
    with ``strict``, raise :class:`BadData` (a cut-off answer must not read as a short one)."""
    out: List[Sample] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            out.append(_parse_line(line))
        except (ValueError, IndexError):
            if strict:
                raise BadData("parse", f"unparsable line {line[:80]!r}") from None
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
