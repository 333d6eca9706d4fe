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
from typing import Dict, Hashable, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

from slurmiso.config.model import ServerProfile
from slurmiso.config.selector import Selector, parse_selector
from slurmiso.exposition import job_series as sig
from slurmiso.exposition.histogram import Counters
from slurmiso.exposition.text import Sample, parse_prometheus_text

MAX_LINES = 200_000
MAX_SERIES = 20_000
MAX_NAME = 200  # longer names are nobody's metric (and would make the name regex work hard)
_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
#: Labels of a histogram or summary sample that are not the series' identity.
_SHAPE_LABELS = ("le", "quantile")


#: The latency signals a profile may name: end-to-end request latency, time to first token,
#: inter-token latency (LLM servers; their documentation recommends the last two as SLOs).
E2E, TTFT, ITL = "e2e", "ttft", "itl"
LATENCY_SIGNALS: Tuple[str, ...] = (E2E, TTFT, ITL)
#: Distinct models one answer may hold; more is nobody's server (and unbounded labels).
MAX_MODELS = 32
MAX_MODEL_NAME = 128


@dataclass(frozen=True)
class Profile:
    """One server kind's series (config ``monitor.signals.servers[]``), compiled.

    ``latency``: per signal (e2e, ttft, itl), the alternatives (first family present wins)
    and the unit of their values in seconds. ``model_labels``: the labels that name the
    model a series is about (the first present); each model is judged on its own."""

    name: str
    latency: Tuple[Tuple[str, Tuple[Selector, ...], float], ...]
    requests: Tuple[Selector, ...] = ()
    errors: Tuple[Selector, ...] = ()
    #: When the errors' series are absent altogether: "unknown", or "zero" for servers that
    #: create their failure counter at the first failure (TGI).
    errors_missing: str = "unknown"
    model_labels: Tuple[str, ...] = ("model_name", "model")
    errors_need: str = "any"
    match: Tuple[Selector, ...] = ()

    @classmethod
    def from_config(cls, p: ServerProfile) -> Profile:
        """From the config's profile (selectors as text, checked by the loader)."""
        lat = tuple((signal, tuple(parse_selector(t) for t in texts), _UNITS[unit])
                    for signal, texts, unit in ((E2E, p.latency, p.unit),
                                                (TTFT, p.ttft, p.ttft_unit),
                                                (ITL, p.itl, p.itl_unit)) if texts)
        return cls(p.name, lat, tuple(parse_selector(t) for t in p.requests),
                   tuple(parse_selector(t) for t in p.errors), p.errors_missing,
                   p.model_labels, p.errors_need, tuple(parse_selector(t) for t in p.match))

    def selectors(self) -> Iterator[Selector]:
        for _, sels, _ in self.latency:
            yield from sels
        yield from self.requests
        yield from self.errors
        yield from self.match


@dataclass
class Answer:
    """What one answer says, for the window (cumulative counters) and now (summary
    quantiles)."""

    profile: str
    #: signal -> "histogram" or "summary", for the signals the answer has.
    kinds: Dict[str, str] = field(default_factory=dict)
    counters: Counters = field(default_factory=dict)
    #: Summary quantiles in seconds, the server's own window: (signal, model) -> {q: value}.
    quantiles: Dict[Tuple[str, str], Dict[str, float]] = field(default_factory=dict)
    errors_known: bool = True

    @property
    def kind(self) -> str:
        """The end-to-end latency family's kind ("" if none: totals only)."""
        return self.kinds.get(E2E, "")


class BadAnswer(ValueError):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


class Profiles:
    """The configured profiles, with one pre-filter for the lines any of them needs."""

    def __init__(self, profiles: Sequence[Profile]) -> None:
        self.profiles = tuple(profiles)
        names = {s.name.pattern for p in self.profiles for s in p.selectors()}
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


def _model(p: Profile, labels: Dict[str, str], seen: Set[str]) -> str:
    """The model a series is about ("" where the server names none); BadAnswer past
    :data:`MAX_MODELS` distinct ones."""
    model = next((labels[m] for m in p.model_labels if m in labels), "")[:MAX_MODEL_NAME]
    if model not in seen:
        seen.add(model)
        if len(seen) > MAX_MODELS:
            raise BadAnswer("too-many-models", f"more than {MAX_MODELS} models in one answer")
    return model


#: The latency family a profile's signal takes in one answer: (kind, family, selector, unit).
_Chosen = Tuple[str, str, Selector, float]


def _apply(p: Profile, samples: Sequence[Sample]) -> Optional[Answer]:
    """What ``samples`` say as profile ``p`` reads them; None when ``p`` is not present."""
    if p.match and not _present(p.match, samples):
        return None
    chosen = _choose(p, samples)
    if not chosen and not _present(p.requests, samples):
        return None
    answer = Answer(p.name, {sg: k for sg, (k, _, _, _) in chosen.items()})
    models: Set[str] = set()
    for signal, family in chosen.items():
        _read_latency(p, answer, signal, family, samples, models)
    _read_totals(p, answer.counters, samples)
    need = all if p.errors_need == "all" else any
    answer.errors_known = bool(p.errors) and (
        need(_present((sel,), samples) for sel in p.errors) or p.errors_missing == "zero")
    return answer


def _choose(p: Profile, samples: Sequence[Sample]) -> Dict[str, _Chosen]:
    """Per latency signal, the first alternative whose family the answer has."""
    chosen: Dict[str, _Chosen] = {}
    for signal, sels, unit in p.latency:
        for sel in sels:
            kind, family = _family(sel, samples)
            if kind:
                chosen[signal] = (kind, family, sel, unit)
                break
    return chosen


def _read_latency(p: Profile, answer: Answer, signal: str, chosen: _Chosen,
                  samples: Sequence[Sample], models: Set[str]) -> None:
    """One signal's buckets (histogram) or quantiles and count (summary) into ``answer``."""
    kind, family, sel, unit = chosen
    c = answer.counters
    for s in samples:
        name, labels = s.name, s.labels
        if not name.startswith(family) or not sel.labels_match(labels):
            continue
        v = _value(s)
        if v is None:
            continue
        model = _model(p, labels, models)
        ident: Hashable = _identity(labels)
        if kind == "histogram" and name == family + "_bucket":
            le = _edge(labels.get("le", ""))
            if le is not None:
                c[("b", signal, model, ident, le * unit if math.isfinite(le) else le)] = v
        elif kind == "summary" and name == family:
            _read_quantile(answer.quantiles.setdefault((signal, model), {}),
                           labels.get("quantile", ""), v * unit)
        elif kind == "summary" and name == family + "_count":
            c[("n", signal, model, ident)] = v


def _read_quantile(got: Dict[str, float], label: str, seconds: float) -> None:
    """A summary's ``quantile`` sample, kept if it is one of :data:`~slurmiso.exposition.
    job_series.QUANTILES` (the worst series' value)."""
    for want in sig.QUANTILES:
        if _same_quantile(label, want):
            got[want] = max(got.get(want, 0.0), seconds)


def _read_totals(p: Profile, c: Counters, samples: Sequence[Sample]) -> None:
    """The requests' and errors' counters the profile names."""
    for tag, sels in (("r", p.requests), ("e", p.errors)):
        for i, sel in enumerate(sels):
            for s in samples:
                v = _value(s)
                if v is not None and sel.name.fullmatch(s.name) and sel.labels_match(s.labels):
                    c[(tag, i, s.name, _identity(s.labels))] = v


def _edge(text: str) -> Optional[float]:
    """A bucket's ``le`` as a number of the unit; None for what no latency can be (NaN,
    negative, -Inf, not a number): a hostile answer's bucket is no bucket."""
    try:
        le = float(text)
    except ValueError:
        return None
    return le if le >= 0 else None


def _same_quantile(label: str, want: str) -> bool:
    try:
        return abs(float(label) - float(want)) < 1e-9
    except ValueError:
        return False
