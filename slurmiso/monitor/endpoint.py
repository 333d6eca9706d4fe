"""An inference server's ``/metrics`` answer as the counters the latency window needs.

Which series mean latency, requests and failures differs per server; ``monitor.signals.
servers`` names them (defaults for vLLM, TGI, Triton and generic HTTP servers in
:mod:`slurmiso.config.model`). Each name is a small PromQL-style selector,
``name{label="v",label=~"regex"}``, whose name may hold ``*`` (any run of name characters).
The first server profile any of whose series is present wins; its latency family (the first
alternative present) is a histogram (``_bucket`` series, cumulative) or a summary
(``quantile`` series, the server's own window).

The answer is hostile input: only lines whose name one of the profiles asks for are parsed
at all, at most :data:`MAX_LINES` lines are looked at and :data:`MAX_SERIES` kept, and a
value that is not a finite non-negative number is no value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, Hashable, Iterable, List, Optional, Sequence, Tuple

from slurmiso.config.model import ServerProfile
from slurmiso.config.selector import Selector, parse_selector
from slurmiso.monitor import signals as sig
from slurmiso.monitor.histogram import Counters
from slurmiso.monitor.telemetry import Sample, parse_prometheus_text

MAX_LINES = 200_000
MAX_SERIES = 20_000
MAX_NAME = 200  # longer names are nobody's metric (and would make the name regex work hard)
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
#: Labels of a histogram or summary sample that are not the series' identity.
_SHAPE_LABELS = ("le", "quantile")


@dataclass(frozen=True)
class Profile:
    """One server kind's series (config ``monitor.signals.servers[]``), compiled."""

    name: str
    latency: Tuple[Selector, ...]
    unit_s: float = 1.0
    requests: Tuple[Selector, ...] = ()
    errors: Tuple[Selector, ...] = ()
    #: When the errors' series are absent altogether: "unknown", or "zero" for servers that
    #: create their failure counter at the first failure (TGI).
    errors_missing: str = "unknown"

    @classmethod
    def from_config(cls, p: ServerProfile) -> Profile:
        """From the config's profile (selectors as text, checked by the loader)."""
        return cls(
            p.name, tuple(parse_selector(t) for t in p.latency), _UNITS[p.unit],
            tuple(parse_selector(t) for t in p.requests),
            tuple(parse_selector(t) for t in p.errors), p.errors_missing,
        )


@dataclass
class Answer:
    """What one answer says, for the window (cumulative counters) and now (summary
    quantiles)."""

    profile: str
    kind: str  # "histogram", "summary" or "" (no latency family: totals only)
    counters: Counters = field(default_factory=dict)
    #: Summary quantiles in seconds, the server's own window (the highest over its series).
    quantiles: Dict[str, float] = field(default_factory=dict)
    errors_known: bool = True


class BadAnswer(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


class Profiles:
    """The configured profiles, with one pre-filter for the lines any of them needs."""

    def __init__(self, profiles: Sequence[Profile]) -> None:
        self.profiles = tuple(profiles)
        names = {s.name.pattern for p in self.profiles
                 for s in (*p.latency, *p.requests, *p.errors)}
        alts = "|".join(sorted(names)) or "(?!)"
        self._wanted = re.compile(f"(?:{alts})(?:_bucket|_count|_sum)?")

    def samples(self, text: str) -> List[Sample]:
        """The answer's samples whose name a profile asks for (bounded)."""
        keep: List[str] = []
        for n, line in enumerate(text.splitlines()):
            if n >= MAX_LINES:
                raise BadAnswer("too-large", f"more than {MAX_LINES} lines")
            line = line.strip()
            if not line or line[0] == "#":
                continue
            cut = min((i for i in (line.find("{"), line.find(" ")) if i > 0), default=-1)
            if 0 < cut <= MAX_NAME and self._wanted.fullmatch(line[:cut]):
                keep.append(line)
                if len(keep) > MAX_SERIES:
                    raise BadAnswer("too-many-series", f"more than {MAX_SERIES} series")
        return parse_prometheus_text("\n".join(keep))

    def read(self, text: str) -> Answer:
        """The first profile present in ``text``; BadAnswer(no-known-series) if none is."""
        samples = self.samples(text)
        for p in self.profiles:
            answer = _apply(p, samples)
            if answer is not None:
                return answer
        raise BadAnswer(sig.R_NO_SERIES, "none of the configured servers' series")


def _value(s: Sample) -> Optional[float]:
    v = s.value
    return v if isinstance(v, float) and math.isfinite(v) and v >= 0 else None


def _identity(labels: Dict[str, str]) -> Tuple[Tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in labels.items() if k not in _SHAPE_LABELS))


def _family(sel: Selector, samples: Sequence[Sample]) -> Tuple[str, str]:
    """(kind, family name) of the first histogram or summary ``sel`` names, or ("", "")."""
    found = set()
    for s in samples:
        name, labels = s.name, s.labels
        if name.endswith("_bucket") and "le" in labels and sel.name.fullmatch(name[:-7]):
            found.add(("histogram", name[:-7]))
        elif "quantile" in labels and sel.name.fullmatch(name):
            found.add(("summary", name))
    return min(found, key=lambda f: f[1]) if found else ("", "")


def _present(sels: Iterable[Selector], samples: Sequence[Sample]) -> bool:
    return any(sel.name.fullmatch(s.name) for sel in sels for s in samples)


def _apply(p: Profile, samples: Sequence[Sample]) -> Optional[Answer]:
    kind = family = ""
    chosen: Optional[Selector] = None
    for sel in p.latency:
        kind, family = _family(sel, samples)
        if kind:
            chosen = sel
            break
    if not kind and not _present(p.requests, samples):
        return None
    answer = Answer(p.name, kind)
    c = answer.counters
    for s in samples:
        name, labels = s.name, s.labels
        v = _value(s)
        if v is None or chosen is None or not chosen.labels_match(labels):
            continue
        ident: Hashable = _identity(labels)
        if kind == "histogram" and name == family + "_bucket":
            try:
                le = float(labels.get("le", ""))
            except ValueError:
                continue
            if not math.isnan(le):
                c[("b", ident, le * p.unit_s if math.isfinite(le) else le)] = v
        elif kind == "summary" and name == family:
            q = labels.get("quantile", "")
            for want in sig.QUANTILES:
                if _same_quantile(q, want):
                    answer.quantiles[want] = max(answer.quantiles.get(want, 0.0), v * p.unit_s)
        elif kind == "summary" and name == family + "_count":
            c[("n", ident)] = v
    for tag, sels in (("r", p.requests), ("e", p.errors)):
        for i, sel in enumerate(sels):
            for s in samples:
                v = _value(s)
                if v is not None and sel.name.fullmatch(s.name) and sel.labels_match(s.labels):
                    c[(tag, i, s.name, _identity(s.labels))] = v
    answer.errors_known = bool(p.errors) and (
        _present(p.errors, samples) or p.errors_missing == "zero")
    return answer


def _same_quantile(label: str, want: str) -> bool:
    try:
        return abs(float(label) - float(want)) < 1e-9
    except ValueError:
        return False
