"""The agent's per-job signals: inference latency from each job's own endpoint, training step
times from each job's step file, read in the background and exported on every scrape.

A scrape must stay fast whatever the jobs do, so nothing here runs in the scrape: a
:class:`Refresher` thread reads every ``monitor.signals.refresh`` (all endpoints at once through
the non-blocking :mod:`slurmiso.exposition.scrape`, each limited to ``timeout`` and ``max_body``),
and the collector only renders the last :class:`JobSignalsState` with ages as of the scrape.
A refresher that fell behind (a step file on a hung NFS mount) shows as growing ages and
``reason="stale"``, never as old figures passed off as fresh. The answers are parsed outside
the lock a scrape needs, within a :class:`Budget` per job and per user, users taking turns;
one user's endpoints share the fetch's slots fairly with every other user's.

Trust: the agent connects to 127.0.0.1:PORT only, the port and path from the prolog's record
(``--iso-metrics``), and only when the kernel says the listener there is the job's user
(:mod:`slurmiso.agent.port_owners`); an answer only ever fills its own job's series, so a job can
lie about itself and nothing else. Redirects, non-200 answers, bodies over the limit and
garbage are unknown with a reason.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Set, Tuple, Union

from slurmiso.agent.endpoint import E2E, Answer, BadAnswer, Profile, Profiles
from slurmiso.agent.stepfile import StepFigures
from slurmiso.exposition import job_series as sig
from slurmiso.exposition.histogram import Window, quantile

log = logging.getLogger(__name__)

#: A refresher this many intervals behind makes every job's signals stale.
STALE_AFTER = 3


#: One window histogram: (signal, model) -> ((edge in s, requests at or under it), ...).
Windows = Dict[Tuple[str, str], Tuple[Tuple[float, float], ...]]


@dataclass(frozen=True)
class Latency:
    """One reading's figures: quantiles in seconds per (signal, model) (absent when idle),
    the window's histogram per (signal, model), requests and error ratio over the window, and
    what is unknown about them."""

    quantiles: Dict[Tuple[str, str], Dict[str, float]] = field(default_factory=dict)
    requests: Optional[float] = None
    error_ratio: Optional[float] = None
    unknown: Tuple[str, ...] = ()
    windows: Windows = field(default_factory=dict)

    def e2e(self) -> Dict[str, float]:
        """The end-to-end quantiles, each the worst over the models."""
        out: Dict[str, float] = {}
        for (signal, _), qs in self.quantiles.items():
            if signal == E2E:
                for q, v in qs.items():
                    out[q] = max(out.get(q, 0.0), v)
        return out


@dataclass(frozen=True)
class Budget:
    """What reading one job's answer may cost the agent in a refresh, and one user's answers
    together. Over it, that job's latency is unknown (``over-budget``), nobody else's, and it
    is not fetched again for a backoff that doubles each time (at most ``max_backoff``
    refreshes): a heavy answer costs one parse now and then, never one per refresh."""

    job_lines: int = 50_000  # counted before parsing (cheap)
    job_series: int = 2_000  # the window keeps every series of ~16 readings
    job_cpu_s: float = 0.1  # a vLLM or Triton answer parses in a few milliseconds
    user_cpu_s: float = 0.25  # all of one user's answers, per refresh
    user_bytes: int = 4 << 20  # all of one user's answers, held at once, per refresh
    max_backoff: int = 16


#: A parse's outcome: the answer, or (reason, detail) when there is none to use.
Parsed = Union[Answer, Tuple[str, str]]


@dataclass
class _Job:
    window: Window
    profile: str = ""
    last_ok: Optional[float] = None
    latency: Optional[Latency] = None
    reason: str = ""  # why the last reading gave no figure
    said: str = ""  # the last reason logged
    overs: int = 0  # over budget so many readings in a row
    skip: int = 0  # refreshes left before it is fetched again


@dataclass(frozen=True)
class JobView:
    """One job as a scrape renders it. An age of None: that signal is not expected of the
    job (no row); ``inf``: expected, never read."""

    job: str
    job_class: str
    latency: Optional[Latency] = None
    latency_age: Optional[float] = None
    latency_unknown: Tuple[str, ...] = ()
    steps: Optional[StepFigures] = None
    steps_age: Optional[float] = None
    steps_unknown: Tuple[str, ...] = ()


def figures(answer: Answer, window: Window) -> Latency:
    """The window's figures after ``answer`` was added to it."""
    inc = window.increases()
    unknown: List[str] = []
    windows: Dict[Tuple[str, str], Dict[float, float]] = {}
    requests: Optional[float] = None
    errors: Optional[float] = None
    if inc is not None:
        keyed: Dict[Tuple[Any, ...], float] = {k: v for k, v in inc.items()
                                               if isinstance(k, tuple)}
        req = [v for k, v in keyed.items() if k[0] == "r"]
        err = [v for k, v in keyed.items() if k[0] == "e"]
        for k, v in keyed.items():
            if k[0] == "b":  # ("b", signal, model, series, edge)
                hist = windows.setdefault((str(k[1]), str(k[2])), {})
                hist[float(k[4])] = hist.get(float(k[4]), 0.0) + v
        requests = sum(req) if req else _counted(answer, inc, windows)
        errors = sum(err) if answer.errors_known else None
    quantiles: Dict[Tuple[str, str], Dict[str, float]] = {}
    for key, qs in answer.quantiles.items():
        quantiles[key] = dict(qs)  # a summary's own window
    for key, hist in windows.items():
        qs = {q: v for q in sig.QUANTILES
              for v in (quantile(float(q), sorted(hist.items())),) if v is not None}
        if qs:
            quantiles[key] = qs
    has_e2e = any(sg == E2E for sg, _ in quantiles)
    if not has_e2e:
        if answer.kind == "":
            unknown.append(sig.R_NO_QUANTILES)
        elif inc is None and answer.kind == "histogram":
            unknown.append(sig.R_FIRST_SAMPLE)
        elif not requests:
            pass  # idle: nothing served in the window is no latency, not unknown latency
        else:
            unknown.append(sig.R_NO_QUANTILES)
    ratio = None
    if requests and errors is not None:
        ratio = min(1.0, errors / requests)
    elif requests and not answer.errors_known:
        unknown.append(sig.R_NO_ERRORS)
    frozen = {key: tuple(sorted(hist.items())) for key, hist in windows.items()}
    return Latency(quantiles, requests, ratio, tuple(unknown), frozen)


def _counted(answer: Answer, inc: Dict[Any, float],
             windows: Dict[Tuple[str, str], Dict[float, float]]) -> Optional[float]:
    """Requests in the window from the end-to-end family itself (no request counter): its
    ``+Inf`` buckets, or a summary's ``_count``; None (unknown, never 0: 0 reads as idle) if
    it has neither."""
    if answer.kind == "histogram":
        tops = [h.get(math.inf) for (sg, _), h in windows.items() if sg == E2E]
        known = [t for t in tops if t is not None]
        return sum(known) if known else None
    if answer.kind == "summary":
        counts = [v for k, v in inc.items() if k[0] == "n" and k[1] == E2E]
        return sum(counts) if counts else None
    return None


class JobSignalsState:
    """Per-job windows and last figures, updated by :meth:`refresh`, read by :meth:`view`.

    ``records``: job id -> JobRecord (the node's). ``slo_classes``: classes with an SLO
    (their jobs are expected to serve latency); ``training_classes``: preemptible classes
    (expected to report steps). ``fetch``/``listeners``/``steps``/``clock`` are injectable.
    """

    def __init__(
        self, settings: Any, slo_classes: Tuple[str, ...] = (),
        training_classes: Tuple[str, ...] = (), fetch: Optional[Callable[..., Any]] = None,
        listeners: Optional[Callable[[], Optional[Mapping[int, Set[int]]]]] = None,
        steps: Optional[Callable[..., StepFigures]] = None,
        clock: Callable[[], float] = time.time, budget: Budget = Budget(),
        cpu: Callable[[], float] = time.thread_time,
        elsewhere: Optional[Callable[[List[str], Mapping[str, Any]], Set[str]]] = None,
    ) -> None:
        from slurmiso.agent import port_owners, stepfile
        from slurmiso.exposition import scrape

        self.settings = settings
        self.profiles = Profiles([Profile.from_config(p) for p in settings.servers])
        self.slo_classes = set(slo_classes)
        self.training_classes = set(training_classes)
        self.fetch = fetch or scrape.fetch_all
        self.listeners = listeners or port_owners.loopback_listeners
        self.steps = steps or stepfile.figures
        self.clock = clock
        self.budget = budget
        self.cpu = cpu
        #: (jobs, their records) -> those in another network namespace (slurmiso.agent.netns)
        self.elsewhere = elsewhere
        self.turn = 0  # which user, and which of a user's jobs, is parsed first
        self.jobs: Dict[str, _Job] = {}
        self.step_figures: Dict[str, StepFigures] = {}
        self.records: Dict[str, Any] = {}
        self.refreshed_at: Optional[float] = None
        self.lock = threading.Lock()

    # -- reading ----------------------------------------------------------------------------

    def refresh(self, records: Mapping[str, Any]) -> None:
        """Read every running job's endpoint and step file once (bounded in time)."""
        s = self.settings
        live = {j: r for j, r in records.items() if getattr(r.status, "value", r.status)
                == "ready"}
        urls, refused = self._urls(live)
        uids = {job: live[job].uid for job in urls}
        got = self.fetch(urls, s.timeout_s + 0.5, 64, float(s.timeout_s),
                         s.max_body_mb * 1024 * 1024, uids, self.budget.user_bytes
                         ) if urls else {}
        now = self.clock()
        steps: Dict[str, StepFigures] = {}
        for job, rec in live.items():
            if rec.steps_file:
                steps[job] = self.steps(rec.steps_file, job, rec.uid, now, s.step_window_s,
                                        s.baseline_steps)
        parsed, heavy = self._parse_all(got, uids)
        # the windows are this thread's alone (a scrape reads only the figures): updated
        # before the lock too, so it is held for assignments only
        figured = {job: self._figures(job, res, now) for job, res in parsed.items()
                   if isinstance(res, Answer)}
        with self.lock:
            for job in list(self.jobs):
                if job not in live or not live[job].metrics:
                    del self.jobs[job]
            for job, why in refused.items():
                self._failed(job, why)
            for job, res in parsed.items():
                if isinstance(res, Answer):
                    self._answered(job, figured[job], now)
                else:
                    self._failed(job, *res)
            for job in heavy:
                self._back_off(job)
            self.step_figures = steps
            self.records = dict(live)
            self.refreshed_at = now

    def _urls(self, live: Mapping[str, Any]) -> Tuple[Dict[str, str], Dict[str, str]]:
        urls: Dict[str, str] = {}
        refused: Dict[str, str] = {}
        wanted = {j: r for j, r in live.items() if r.metrics}
        if not wanted:
            return urls, refused
        owners = self.listeners()
        from slurmiso.submit.options import metrics_endpoint

        for job, rec in wanted.items():
            try:  # the record is root's, but the URL is built from it: checked again
                port, path = metrics_endpoint(rec.metrics)
            except ValueError:
                refused[job] = sig.R_PARSE
                continue
            uids = None if owners is None else owners.get(port, set())
            held = self.jobs.get(job)
            if held is not None and held.skip > 0:
                held.skip -= 1  # (only this thread writes it)
                refused[job] = sig.R_OVER_BUDGET
            elif uids is not None and not uids:
                refused[job] = sig.R_UNREACHABLE  # nothing listens there: nothing to connect to
            elif uids is not None and rec.uid >= 0 and uids != {rec.uid}:
                refused[job] = sig.R_PORT_NOT_OWNED
            else:  # (no /proc/net: the uid check is not possible; the read still is)
                urls[job] = f"http://127.0.0.1:{port}{path}"
        unreached = sorted(j for j, why in refused.items() if why == sig.R_UNREACHABLE)
        for job in self._elsewhere(unreached, live):  # say why nothing listens, where it can
            refused[job] = sig.R_OTHER_NETNS
        return urls, refused

    def _elsewhere(self, jobs: List[str], live: Mapping[str, Any]) -> Set[str]:
        """Only a finer reason: a failure to find it leaves them "unreachable"."""
        if not jobs or self.elsewhere is None:
            return set()
        try:
            return self.elsewhere(jobs, live)
        except Exception:  # noqa: BLE001 - the refresh must go on
            log.warning("cannot tell which jobs listen in another network namespace",
                        exc_info=True)
            return set()

    def _job(self, job: str) -> _Job:
        j = self.jobs.get(job)
        if j is None:
            n = int(self.settings.window_s / max(1, self.settings.refresh_s)) + 4
            j = self.jobs[job] = _Job(Window(self.settings.window_s, n))
        return j

    def _parse_all(self, got: Mapping[str, Any], uids: Mapping[str, int]
                   ) -> Tuple[Dict[str, Parsed], Set[str]]:
        """Every answer parsed, outside the lock (a scrape never waits for a parse): one job
        of each user in turn, the first user and job moving on each refresh, while the
        user's CPU this refresh is under ``budget.user_cpu_s``. Also returns the jobs over
        their own budget (a job left unread for its user's is not one)."""
        out: Dict[str, Parsed] = {}
        heavy: Set[str] = set()
        by_user: Dict[int, List[str]] = {}
        for job, res in got.items():
            if res.body is None:
                out[job] = (res.reason, res.detail)
            else:
                by_user.setdefault(uids.get(job, -1), []).append(job)
        self.turn += 1  # (answers arrive in the order the fetches end: sorted, so turns move)
        users = _rotated(sorted(by_user), self.turn)
        queues = [_rotated(sorted(by_user[u]), self.turn) for u in users]
        spent = dict.fromkeys(users, 0.0)
        for turn in itertools.zip_longest(*queues):
            for user, job in zip(users, turn):
                if job is None:
                    continue
                if spent[user] >= self.budget.user_cpu_s:
                    out[job] = (sig.R_OVER_BUDGET, f"uid {user}'s answers took "
                                f"{spent[user]:.2f}s CPU this refresh")
                    continue
                res, cost = self._parse(got[job].body)
                out[job] = res
                spent[user] += cost
                if not isinstance(res, Answer) and res[0] == sig.R_OVER_BUDGET:
                    heavy.add(job)
        return out, heavy

    def _parse(self, body: str) -> Tuple[Parsed, float]:
        """One answer within the job's budget, and the CPU it cost."""
        b = self.budget
        lines = body.count("\n")
        if lines > b.job_lines:
            return (sig.R_OVER_BUDGET, f"{lines} lines"), 0.0
        start = self.cpu()
        res: Parsed
        try:
            res = self.profiles.read(body)
        except BadAnswer as exc:
            res = (exc.reason, str(exc))
        except (ValueError, IndexError) as exc:
            res = (sig.R_PARSE, str(exc))
        cost = self.cpu() - start
        if cost > b.job_cpu_s:
            res = (sig.R_OVER_BUDGET, f"{cost:.2f}s CPU")
        elif isinstance(res, Answer) and len(res.counters) > b.job_series:
            res = (sig.R_OVER_BUDGET, f"{len(res.counters)} series")
        return res, cost

    def _back_off(self, job: str) -> None:
        """Over its own budget: not fetched for 1, 2, 4... refreshes (at most max_backoff)."""
        j = self._job(job)
        j.overs += 1
        j.skip = min(self.budget.max_backoff, 2 ** (j.overs - 1))

    def _failed(self, job: str, reason: str, detail: str = "") -> None:
        j = self._job(job)
        j.latency, j.reason = None, reason
        if j.said != reason:
            log.info("job %s: latency unknown (%s%s)", job, reason,
                     f": {detail[:120]}" if detail else "")
            j.said = reason

    def _figures(self, job: str, answer: Answer, now: float) -> Latency:
        j = self._job(job)
        if answer.profile != j.profile:
            j.window.readings.clear()  # another server now: its counters are not the old ones
            j.profile = answer.profile
        j.window.add(now, answer.counters)
        return figures(answer, j.window)

    def _answered(self, job: str, lat: Latency, now: float) -> None:
        j = self._job(job)
        j.overs = 0
        j.latency, j.reason = lat, ""
        if lat.quantiles or (lat.requests == 0 and not lat.unknown):
            j.last_ok = now  # a latency figure, or an idle window: fresh; anything else is not
        j.said = ""

    # -- what a scrape shows ----------------------------------------------------------------

    def view(self, now: Optional[float] = None) -> List[JobView]:
        now = self.clock() if now is None else now
        with self.lock:
            stale = self.refreshed_at is None or (
                now - self.refreshed_at > STALE_AFTER * self.settings.refresh_s)
            out = []
            for job, rec in sorted(self.records.items()):
                out.append(self._view(job, rec, now, stale))
            return out

    def _view(self, job: str, rec: Any, now: float, stale: bool) -> JobView:
        cls = rec.job_class
        lat = None
        lat_age: Optional[float] = None
        lat_unknown: Tuple[str, ...] = ()
        j = self.jobs.get(job)
        if rec.metrics:
            lat_age = math.inf if j is None or j.last_ok is None else max(0.0, now - j.last_ok)
            if stale:
                lat_unknown = (sig.R_STALE,)
            elif j is None:
                lat_unknown = (sig.R_FIRST_SAMPLE,)
            elif j.latency is None:
                lat_unknown = (j.reason,)
            else:
                lat, lat_unknown = j.latency, j.latency.unknown
        elif cls in self.slo_classes:
            lat_age, lat_unknown = math.inf, (sig.R_NO_ENDPOINT,)
        st = self.step_figures.get(job)
        st_age: Optional[float] = None
        st_unknown: Tuple[str, ...] = ()
        expected = cls in self.training_classes
        if st is not None and (expected or st.reason != sig.R_NO_REPORT):
            st_age = math.inf if st.reported_at is None else max(0.0, now - st.reported_at)
            if stale:
                st, st_unknown = None, (sig.R_STALE,)
            elif st.reason:
                st_unknown = (st.reason,)
            elif st.step_s is None:
                st_unknown = (sig.R_NO_RECENT,)
        elif expected:
            st_age, st_unknown, st = math.inf, (sig.R_NO_REPORT,), None
        else:
            st = None
        return JobView(job, cls, lat, lat_age, lat_unknown, st, st_age, st_unknown)


def _rotated(items: List[Any], turn: int) -> List[Any]:
    k = turn % len(items) if items else 0
    return items[k:] + items[:k]


class JobSignalsCollector:
    """client_python custom collector: renders :meth:`JobSignalsState.view` as of the scrape."""

    def __init__(self, state: JobSignalsState) -> None:
        self.state = state

    def describe(self) -> List[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        jc = [sig.L_JOB, sig.L_CLASS]
        fam = {
            sig.M_LATENCY: GaugeMetricFamily(
                sig.M_LATENCY, "Request latency percentile over the window (interpolated in "
                "the server's buckets; the SLO is judged on slurmiso_job_window_latency_seconds)",
                labels=[*jc, sig.L_LATENCY_SIGNAL, sig.L_MODEL, sig.L_PERCENTILE]),
            sig.M_ERROR_RATIO: GaugeMetricFamily(
                sig.M_ERROR_RATIO, "Failed / all requests over the window", labels=jc),
            sig.M_REQUESTS: GaugeMetricFamily(
                sig.M_REQUESTS, "Requests finished in the window", labels=jc),
            sig.M_SIGNAL_AGE: GaugeMetricFamily(
                sig.M_SIGNAL_AGE, "Seconds since the signal's last fresh reading (+Inf: never)",
                labels=[*jc, sig.L_SIGNAL]),
            sig.M_SIGNAL_UNKNOWN: GaugeMetricFamily(
                sig.M_SIGNAL_UNKNOWN, "1 while the signal cannot be read, with why",
                labels=[*jc, sig.L_SIGNAL, sig.L_REASON]),
            sig.M_STEP_SECONDS: GaugeMetricFamily(
                sig.M_STEP_SECONDS, "Mean training step time over the step window", labels=jc),
            sig.M_STEPS_TOTAL: GaugeMetricFamily(
                sig.M_STEPS_TOTAL, "Training steps the job reported (this attempt)", labels=jc),
            sig.M_THROUGHPUT_VS_SOLO: GaugeMetricFamily(
                sig.M_THROUGHPUT_VS_SOLO, "Baseline step time / recent step time", labels=jc),
        }
        window = _WindowFamily()
        for v in self.state.view():
            who = [v.job, v.job_class]
            _add_latency(fam, window, who, v)
            _add_steps(fam, who, v)
        yield from fam.values()
        yield window.family


class _WindowFamily:
    """``slurmiso_job_window_latency_seconds``: each job's requests per bucket over the window,
    per signal and model, as a gauge histogram (what the monitor judges the SLO on)."""

    def __init__(self) -> None:
        from prometheus_client.metrics_core import Metric

        self.family = Metric(sig.M_WINDOW, "Requests at or under each bucket edge over the "
                             "window (the server's own buckets, seconds)", "gaugehistogram")

    def add(self, who: List[str], signal: str, model: str,
            hist: Tuple[Tuple[float, float], ...]) -> None:
        labels = dict(zip((sig.L_JOB, sig.L_CLASS), who))
        labels.update({sig.L_LATENCY_SIGNAL: signal, sig.L_MODEL: model})
        top = 0.0
        for edge, count in hist:
            top = max(top, count)
            self.family.add_sample(sig.M_WINDOW + "_bucket",
                                   {**labels, "le": _edge_label(edge)}, top)
        if not hist or hist[-1][0] != math.inf:
            self.family.add_sample(sig.M_WINDOW + "_bucket", {**labels, "le": "+Inf"}, top)
        self.family.add_sample(sig.M_WINDOW + "_gcount", labels, top)


def _edge_label(edge: float) -> str:
    """An ``le`` as Prometheus writes it (``+Inf``, ``0.25``)."""
    return "+Inf" if edge == math.inf else repr(float(edge))


def _add_latency(fam: Dict[str, Any], window: _WindowFamily, who: List[str], v: JobView
                 ) -> None:
    """One job's latency signal: its age, why it is unknown, its figures."""
    if v.latency_age is not None:
        fam[sig.M_SIGNAL_AGE].add_metric([*who, sig.SIGNAL_LATENCY], v.latency_age)
    for reason in v.latency_unknown:
        fam[sig.M_SIGNAL_UNKNOWN].add_metric([*who, sig.SIGNAL_LATENCY, reason], 1.0)
    if v.latency is None:
        return
    for (signal, model), qs in sorted(v.latency.quantiles.items()):
        for q, value in sorted(qs.items()):
            fam[sig.M_LATENCY].add_metric([*who, signal, model, sig.PERCENTILE[q]], value)
    for (signal, model), hist in sorted(v.latency.windows.items()):
        window.add(who, signal, model, hist)
    if v.latency.requests is not None:
        fam[sig.M_REQUESTS].add_metric(who, v.latency.requests)
    if v.latency.error_ratio is not None:
        fam[sig.M_ERROR_RATIO].add_metric(who, v.latency.error_ratio)


def _add_steps(fam: Dict[str, Any], who: List[str], v: JobView) -> None:
    """One job's steps signal: its age, why it is unknown, its figures."""
    if v.steps_age is not None:
        fam[sig.M_SIGNAL_AGE].add_metric([*who, sig.SIGNAL_STEPS], v.steps_age)
    for reason in v.steps_unknown:
        fam[sig.M_SIGNAL_UNKNOWN].add_metric([*who, sig.SIGNAL_STEPS, reason], 1.0)
    st = v.steps
    if st is None or st.reason:
        return
    if st.steps_total is not None:
        fam[sig.M_STEPS_TOTAL].add_metric(who, st.steps_total)
    if st.step_s is not None:
        fam[sig.M_STEP_SECONDS].add_metric(who, st.step_s)
    if st.throughput_vs_solo is not None:
        fam[sig.M_THROUGHPUT_VS_SOLO].add_metric(who, st.throughput_vs_solo)


class Refresher:
    """The background reader: ``state.refresh(read_records())`` every ``interval`` seconds,
    in a daemon thread; an exception is logged and the next turn tries again."""

    def __init__(self, state: JobSignalsState, read_records: Callable[[], Mapping[str, Any]],
                 interval: float) -> None:
        self.state = state
        self.read_records = read_records
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="slurmiso-signals", daemon=True)

    def start(self) -> Refresher:
        self.thread.start()
        return self

    def once(self) -> None:
        try:
            self.state.refresh(self.read_records())
        except Exception:  # noqa: BLE001 - one bad turn never ends the agent's signals
            log.exception("agent: reading the jobs' signals failed; trying again next turn")

    def _run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.once()
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - started)))
