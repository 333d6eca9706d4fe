"""One table-driven test per defect in issue 15's first list; each failed on the old code.

Telemetry is served by real sockets on 127.0.0.1 (raw servers that misbehave on purpose);
Slurm is :class:`test_monitor_scenarios.FakeCluster` or a recording double.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import pytest
from test_monitor_scenarios import BASE, T0, FakeCluster, gpu, run

from slurmiso.exposition import gpu_series as gs
from slurmiso.monitor import telemetry as t
from slurmiso.monitor.admission_state import Gate, Hold
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.decide import decide
from slurmiso.monitor.loop import Monitor, file_snapshots
from slurmiso.monitor.policy import Memory, SloLimit
from slurmiso.monitor.snapshot import JobInfo, NodeInfo, Snapshot, dumps

NOW = 1796287000.0
GOOD = (f"{gs.M_UP}{{node=\"n1\"}} 1\n{gs.M_COLLECTED}{{node=\"n1\"}} {NOW - 2}\n"
        f"{gs.M_MEM_USED}{{node=\"n1\",gpu=\"0\",gi=\"\"}} {10 * gs.MIB}\n"
        f"{gs.M_MEM_TOTAL}{{node=\"n1\",gpu=\"0\",gi=\"\"}} {80_000 * gs.MIB}\n"
        f"{gs.M_SM}{{node=\"n1\",gpu=\"0\",gi=\"\"}} 0.1\n")


def http(body: str, length: Optional[int] = None) -> bytes:
    raw = body.encode()
    return (f"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(raw) if length is None else length}\r\n\r\n").encode() + raw


# ------------------------------------------------------------------ raw loopback servers
class RawServer:
    """Answers every connection on 127.0.0.1 with ``behave(conn)``; stops itself."""

    def __init__(self, behave: Callable[[socket.socket], None]) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(512)
        self.sock.settimeout(0.2)
        self.behave = behave
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/metrics"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(30)
            conn.recv(4096)
            self.behave(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        self.sock.close()


def send(data: bytes) -> Callable[[socket.socket], None]:
    return lambda conn: conn.sendall(data)


#: How long a holding server keeps a connection if the test never releases it: a hang
#: guard, far above the 2 s deadline under test.
HOLD_CAP_S = 120.0


class Holding:
    """Servers that keep their connection until the test releases them (or HOLD_CAP_S):
    "the cycle ended while they still held on" is then an order of events, not a time."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.count = 0  # connections now held

    def _hold(self, conn: socket.socket, every_s: float, step: Callable[[int], None]) -> None:
        self.count += 1
        try:
            end, i = time.monotonic() + HOLD_CAP_S, 0
            while not self.release.wait(every_s) and time.monotonic() < end:
                step(i)
                i += 1
        finally:
            self.count -= 1

    def hang(self, conn: socket.socket) -> None:
        self._hold(conn, 0.5, lambda i: None)

    def trickle(self, conn: socket.socket) -> None:
        """One byte every 0.2 s: no single recv ever times out."""
        data = http(GOOD)
        self._hold(conn, 0.2, lambda i: conn.sendall(data[i % len(data):][:1]))


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[socket.socket], None]], RawServer]]:
    servers: List[RawServer] = []

    def make(behave: Callable[[socket.socket], None]) -> RawServer:
        servers.append(RawServer(behave))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


# --- 1. an agent that cannot read its GPUs is unknown, not calm -------------------------
# --- 4. a non-HTTP line, a cut body, a non-integer gpu label: counted stale, no exception
BAD_AGENTS = [
    ("agent up 0, no GPU series", send(http(f"{gs.M_UP}{{node=\"n1\"}} 0\n")), "agent-down"),
    ("answers without GPU series", send(http(f"{gs.M_UP}{{node=\"n1\"}} 1\n")), "no-gpus"),
    ("non-HTTP line", send(b"SSH-2.0-OpenSSH_9.2\r\n"), "not-http"),
    ("truncated body", send(http(GOOD, length=len(GOOD) + 50)), "truncated"),
    ("cut mid-line, no length", send(http(GOOD)[:-12].replace(b"Content-Length", b"X-L")),
     "parse"),
    ("non-integer gpu label", send(http(GOOD.replace('gpu="0"', 'gpu="GPU-0"'))),
     "bad-label"),
    ("HTTP 500", send(b"HTTP/1.0 500 Internal Server Error\r\n\r\n"), "http-status"),
    ("connection closed at once", lambda conn: None, "not-http"),
]


@pytest.mark.parametrize("name,behave,reason", BAD_AGENTS, ids=[b[0] for b in BAD_AGENTS])
def test_bad_agent_is_unknown_with_a_counted_reason(
        serve: Any, name: str, behave: Any, reason: str) -> None:
    bad, good = serve(behave), serve(send(http(GOOD)))
    src = t.AgentSource(9, {"n1": bad.url, "n2": good.url}, timeout=2, deadline_s=3)
    r = src.read({"n1": "", "n2": ""}, NOW)
    assert "n1" not in r.gpus and "n1" not in r.ages, "no data: no age, so unknown"
    assert r.unknown == {f"agents/{reason}": 1}
    assert [g.sm_active_pct for g in r.gpus["n2"]] == [10.0], "the good agent still counts"


# --- 5. one deadline per cycle, bounded concurrency; a trickling server can't hold it -----
def test_trickling_and_hanging_agents_end_within_the_deadline(serve: Any) -> None:
    held = Holding()
    slow = serve(held.trickle)
    hang = serve(held.hang)
    good = serve(send(http(GOOD)))
    urls = {"slow": slow.url, "hang": hang.url}
    urls.update({f"g{i}": good.url for i in range(40)})
    # a per-request timeout no cycle reaches: only the cycle's deadline can end the two. The
    # 2 s deadline is generous for the 40 good answers (loopback, milliseconds each).
    src = t.AgentSource(9, urls, timeout=600, workers=8, deadline_s=2.0)
    try:
        r = src.read({k: "" for k in urls}, NOW)
        assert held.count == 2, "the cycle waited for a server, not for its deadline"
    finally:
        held.release.set()
    assert len(r.gpus) == 40 and "slow" not in r.gpus and "hang" not in r.gpus
    # the deadline bounds each request too (min(timeout, deadline)), so either name may say so
    assert sum(r.unknown.values()) == 2 and set(r.unknown) <= {"agents/deadline",
                                                               "agents/timeout"}


# --- 2. missing SM or latency is unknown; latency age from the sample -----------------
def held_snapshot(n1: NodeInfo, ts: float, **kw: Any) -> Snapshot:
    job = JobInfo("1", "PENDING", "train", ("shared",), "train", T0 - 100, True,
                  "JobHeldAdmin")
    serving = JobInfo("9", "RUNNING", "infer", ("shared",), "infer", T0 - 900,
                      nodes=("n1",))  # inference runs there: unknown is not calm
    return Snapshot(ts, (n1,), {"shared": ("n1",)}, (job, serving), **kw)


HOLD = dataclasses.replace(BASE, admission="hold")
CALM_AFTER = [
    # (case, node after the hot spell, extra snapshot fields, policy, released?)
    ("calm and fresh: released", NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "", "",
                                          (gpu(10, 10),), 5.0), {}, HOLD, True),
    ("agent up but no GPUs", NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "", "", (), 1.0),
     {}, HOLD, False),
    ("SM and engine activity missing", NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "", "",
                                                (gpu(10, None),), 5.0), {}, HOLD, False),
    ("memory total missing", NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "", "",
                                      (gpu(None, 10),), 5.0), {}, HOLD, False),
    ("latency missing while its SLO is set", NodeInfo(
        "n1", "MIXED", ("shared",), "p", "mps", "", "", (gpu(10, 10),), 5.0),
     {}, dataclasses.replace(HOLD, slo=(SloLimit("infer", None, 250),)), False),
    ("latency sample too old", NodeInfo(
        "n1", "MIXED", ("shared",), "p", "mps", "", "", (gpu(10, 10),), 5.0),
     {"latency_p99_ms": {"infer": 100.0}, "latency_age_s": 400.0},
     dataclasses.replace(HOLD, slo=(SloLimit("infer", None, 250),)), False),
]


@pytest.mark.parametrize("case,n1,extra,policy,released", CALM_AFTER,
                         ids=[c[0] for c in CALM_AFTER])
def test_unknown_signals_never_release(case: str, n1: NodeInfo, extra: Dict[str, Any],
                                       policy: Any, released: bool) -> None:
    mem = Memory(holds={"1": Hold(T0, ("shared",), "hot")},
                 gates={"shared": Gate(True, T0, None, "hot")}, last_ts=T0)
    for i in range(1, 40):
        actions, mem = decide(held_snapshot(n1, T0 + 30 * i, **extra), policy, mem)
        if actions:
            break
    assert ([a.kind for a in actions] == ["release"]) is released, actions


# --- 3. stale telemetry admits no new training ------------------------------------------
@pytest.mark.parametrize("admission", ["hold", "nodes"])
def test_stale_telemetry_admits_no_new_training(admission: str) -> None:
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    c.load["n1"] = (90.0, 10.0, 5.0)
    pol = dataclasses.replace(BASE, admission=admission)
    _, mem = run(c, pol, 1)
    c.load["n1"] = (10.0, 10.0, 600.0)  # the agent went quiet

    def arrive(i: int, ts: float) -> None:
        if i == 0:
            c.submit("2", ts=ts - 1)

    run(c, pol, 1, before=arrive, memory=mem, start=T0 + 30)
    job = c.jobs["2"]
    assert job.held or job.exc_nodes == "n1", "a new arrival is kept off the unknown node"


# --- 6. SIGTERM mid-batch: the batch finishes, intent is on disk before acting ------------
class Recorder:
    def __init__(self, mon_ref: List[Monitor], state: str) -> None:
        self.mon_ref = mon_ref
        self.state = state
        self.batches: List[int] = []
        self.intent_seen: List[int] = []

    def hold(self, ids: Sequence[str]) -> None:
        with open(self.state, encoding="utf-8") as fh:
            intent = json.load(fh)["memory"]["intent"]
        self.intent_seen.append(len(intent))
        self.batches.append(len(ids))
        self.mon_ref[0].request_stop()  # SIGTERM arrives during the first batch

    def update_jobs(self, ids: Sequence[str], fields: Dict[str, str]) -> None:
        """The hold's note for the owner, in the same batch as the hold."""


def _hot_with_jobs(n: int, ts: float = T0 + 30) -> Snapshot:
    jobs = tuple(JobInfo(str(i), "PENDING", "train", ("shared",), "train", ts - 10)
                 for i in range(n))
    return Snapshot(ts, (NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "", "",
                                  (gpu(95, 10),), 5.0),), {"shared": ("n1",)}, jobs)


def test_sigterm_mid_batch_finishes_the_batch_and_a_restart_reconciles(
        tmp_path: os.PathLike[str]) -> None:
    state = os.path.join(str(tmp_path), "state.json")
    ref: List[Monitor] = []
    slurm = Recorder(ref, state)
    pol = HOLD
    mon = Monitor(pol, lambda: _hot_with_jobs(2000), Applier(None, slurm), state,
                  state + ".lock", 30, sleep=lambda s: None)
    mon.memory.last_ts = T0  # the 2,000 jobs are arrivals of this cycle
    ref.append(mon)
    outcomes = list(mon.run(cycles=5))
    mon.close()
    assert len(outcomes) == 1, "SIGTERM: no further cycle"
    assert slurm.batches == [500], "the batch under way finished, no other started"
    assert slurm.intent_seen == [2000], "the intent was on disk before the first call"
    done = [o for o in outcomes[0] if o.ok]
    assert len(done) == 500 and all("SIGTERM" in o.error for o in outcomes[0] if not o.ok)
    with open(state, encoding="utf-8") as fh:
        saved = json.load(fh)["memory"]
    assert len(saved["holds"]) == 500 and saved["intent"] == [], "memory = what happened"


def test_crash_between_intent_and_acting_is_reconciled() -> None:
    """Killed after writing intent: holds that never happened are forgotten (not mistaken
    for an admin's release), a release that never happened is owned again and released."""
    jobs = (JobInfo("1", "PENDING", "train", ("shared",), "train", T0 - 10),  # hold lost
            JobInfo("2", "PENDING", "train", ("shared",), "train", T0 - 10, True,
                    "JobHeldAdmin"))  # release lost
    calm = Snapshot(T0 + 30, (NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "", "",
                                       (gpu(10, 10),), 5.0),), {"shared": ("n1",)}, jobs)
    mem = Memory(holds={"1": Hold(T0, ("shared",))}, last_ts=T0,
                 intent=[["hold", "1", "", ""], ["release", "2", "", ""]])
    actions, mem = decide(calm, HOLD, mem)
    assert "1" not in mem.overridden and "1" not in mem.holds
    assert [(a.kind, a.target) for a in actions] == [("release", "2")]
    assert mem.intent == []


# --- 7. per-node admission, not the worst GPU of the partition ---------------------------
def test_one_hot_gpu_keeps_training_off_that_node_only() -> None:
    names = [f"n{i:03d}" for i in range(400)]
    c = FakeCluster(names, {"shared": names, "infer": names})
    c.load["n007"] = (76.0, 10.0, 5.0)
    for i in range(300):
        c.submit(str(i))
    c.submit("900", cls="infer", part="infer")
    steps, _ = run(c, BASE, 1)
    assert {a.kind for a in steps[0]} == {"exclude"}
    assert all(c.jobs[str(i)].exc_nodes == "n007" for i in range(300))
    assert not any(j.held for j in c.jobs.values())
    assert c.jobs["900"].exc_nodes == "", "inference untouched"
    assert "n007 GPU 0 memory 76%" in c.jobs["0"].comment
    assert c.calls == [("update", 300)], "one Slurm call for 300 jobs"


def test_user_exclusions_and_comments_are_kept() -> None:
    c = FakeCluster(["n1", "n2", "n3"], {"shared": ["n1", "n2", "n3"]})
    c.load["n1"] = (90.0, 10.0, 5.0)
    c.submit("1")
    c.jobs["1"] = dataclasses.replace(c.jobs["1"], exc_nodes="n3", comment="my run")
    _, mem = run(c, BASE, 1)
    assert c.jobs["1"].exc_nodes in ("n[1,3]", "n1,n3") and c.jobs["1"].comment == "my run"
    c.load["n1"] = (10.0, 10.0, 5.0)
    run(c, BASE, 30, memory=mem)
    assert c.jobs["1"].exc_nodes == "n3", "the user's own exclusion comes back"


# --- 8. a BeginTime-pending inference job is not an SLO breach ----------------------------
@pytest.mark.parametrize("reason,breach", [("BeginTime", False), ("Dependency", False),
                                           ("JobHeldUser", False), ("Resources", True),
                                           ("Priority", True)])
def test_only_eligible_inference_counts_for_the_slo(reason: str, breach: bool) -> None:
    c = FakeCluster(["n1"], {"shared": ["n1"], "infer": ["n1"]})
    c.submit("50", cls="infer", part="infer", ts=T0 - 3600, reason=reason)
    c.jobs["50"] = dataclasses.replace(c.jobs["50"], held=reason == "JobHeldUser")
    c.submit("1")
    run(c, dataclasses.replace(BASE, slo=(SloLimit("infer", 60, None),)), 1)
    assert (c.jobs["1"].held or c.jobs["1"].exc_nodes == "n1") is breach


# --- 9. arrivals and releases staggered, backlog drained in bound, priority order --------
def test_arrivals_are_staggered_in_priority_order() -> None:
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    c.load["n1"] = (10.0, 10.0, 5.0)

    def arrive(i: int, ts: float) -> None:
        if i == 0:
            for j in range(10):
                c.submit(f"a{j}", ts=ts - 1, priority=float(j))

    run(c, BASE, 1, before=arrive, memory=Memory(last_ts=T0 - 10))
    started = sorted(j.id for j in c.jobs.values() if not j.held)
    assert started == ["a6", "a7", "a8", "a9"], "the 4 of highest priority go first"


# --- 10. per-hour limits and dwell per action kind ---------------------------------------
def test_gate_opens_are_limited_per_hour() -> None:
    """Hot 1 cycle, calm 11 (= 330 s, past the dwell) over and over: at most
    gate_opens_per_hour openings an hour."""
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    c.submit("1")
    opens = []
    mem = Memory()
    applier = Applier(None, c)
    for i in range(240):
        c.load["n1"] = (90.0 if i % 12 == 0 else 10.0, 10.0, 5.0)
        before = "node:n1" in mem.gates and mem.gates["node:n1"].closed
        actions, mem = decide(c.snapshot(T0 + 30 * i), BASE, mem)
        applier.apply(actions)
        if before and not mem.gates["node:n1"].closed:
            opens.append(T0 + 30 * i)
    for start in opens:
        assert sum(1 for o in opens if start <= o < start + 3600) <= BASE.gate_opens_per_hour


def test_status_shows_limits(tmp_path: os.PathLike[str]) -> None:
    from slurmiso.monitor.report import status, status_lines

    mem = Memory(events={"partition-update": [T0 - 100] * 6, "relayout:migs": [T0 - 50]})
    st = status(BASE, mem, T0)
    lines = "\n".join(status_lines(st))
    assert "partition updates: 6 in the last hour (limit 6)  -- LIMIT REACHED" in lines
    assert "re-layouts of migs: 1 in the last hour (limit 2)" in lines


# --- 13. a dry run's memory is a real run's ----------------------------------------------
def test_dry_run_remembers_what_a_real_run_would(tmp_path: os.PathLike[str]) -> None:
    """An unchanging hot snapshot: the real run holds 3,000 once; the dry run used to
    report 3000, 0, 2000, 0, 2000 (it took its own unapplied holds for admin releases)."""
    tmp = str(tmp_path)

    def cluster() -> FakeCluster:
        c = FakeCluster(["n1"], {"shared": ["n1"]})
        c.load["n1"] = (95.0, 10.0, 5.0)
        for i in range(3000):
            c.submit(str(i), ts=T0 + 1)
        return c

    real_c, frozen = cluster(), cluster()
    clock = {"ts": T0}

    def tick(c: FakeCluster) -> Callable[[], Snapshot]:
        def f() -> Snapshot:
            clock["ts"] += 30
            return c.snapshot(clock["ts"])
        return f

    results = {}
    for name, c, dry in (("real", real_c, False), ("dry", frozen, True)):
        clock["ts"] = T0
        mon = Monitor(HOLD, tick(c), Applier(None, c), os.path.join(tmp, f"{name}.json"),
                      os.path.join(tmp, f"{name}.lock"), 30, dry_run=dry,
                      sleep=lambda s: None)
        mon.memory.last_ts = T0
        counts = [sum(1 for o in out if o.action.kind == "hold") for out in mon.run(cycles=5)]
        mon.close()
        results[name] = (counts, mon.memory.to_dict())
    assert results["dry"][0] == results["real"][0] == [3000, 0, 0, 0, 0]
    assert results["dry"][1] == results["real"][1], "identical memory"
    assert not any(j.held for j in frozen.jobs.values()), "the dry run changed nothing"


# --- 14. a replay runs each snapshot at its own time --------------------------------------
def test_replay_uses_each_snapshots_own_timestamp(tmp_path: os.PathLike[str]) -> None:
    seq = os.path.join(str(tmp_path), "day.jsonl")
    with open(seq, "w", encoding="utf-8") as fh:
        for i in range(20):
            pct = 95.0 if i == 0 else 10.0
            snap = Snapshot(T0 + 60 * i, (NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "",
                                                   "", (gpu(pct, 10),), 5.0),),
                            {"shared": ("n1",)},
                            (JobInfo("1", "PENDING", "train", ("shared",), "train", T0 - 9),))
            fh.write(dumps(snap) + "\n")
    fn, is_seq = file_snapshots(seq)
    stamps = [fn().ts for _ in range(20)]
    assert is_seq
    assert stamps == [T0 + 60 * i for i in range(20)]
    from slurmiso.cli.main import main

    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
    out = os.path.join(str(tmp_path), "out.json")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["-c", cfg, "monitor", "--dry-run", "--snapshot", seq, "--json",
                   "--state", out, "--lock", out + ".lock", "--set", "admission=hold"])
    doc = json.loads(buf.getvalue())
    kinds = [(e["ts"], e["kind"]) for e in doc["timeline"]]
    assert rc == 0 and kinds[0] == (T0, "hold")
    assert any(k == "release" for _, k in kinds), "dwell passes within the replay"
    assert doc["totals"]["jobs_held"] == 1 and doc["totals"]["time_held_s"] >= 300
    assert doc["totals"]["gate_flips"] == 2


def test_set_rejects_unknown_knobs() -> None:
    from slurmiso.errors import UsageError
    from slurmiso.monitor.policy import override

    assert override(BASE, ["min_dwell_s=120", "unknown_admits=true"]).min_dwell_s == 120.0
    with pytest.raises(UsageError, match="knobs:"):
        override(BASE, ["no_such=1"])
    with pytest.raises(UsageError, match="not a int"):
        override(BASE, ["stagger_max_starts=many"])


# --- 15. admin releases are remembered, not the last 1,000 only ---------------------------
def test_admin_releases_are_all_remembered() -> None:
    n = 1500
    held = tuple(JobInfo(str(i), "PENDING", "train", ("shared",), "train", T0 - 9)
                 for i in range(n))  # someone released every one of our holds
    hot = Snapshot(T0, (NodeInfo("n1", "MIXED", ("shared",), "p", "mps", "", "",
                                 (gpu(95, 10),), 5.0),), {"shared": ("n1",)}, held)
    mem = Memory(holds={str(i): Hold(T0 - 60, ("shared",)) for i in range(n)},
                 gates={"shared": Gate(True, T0 - 60, None, "hot")}, last_ts=T0 - 30)
    _, mem = decide(hot, HOLD, mem)
    actions, mem = decide(dataclasses.replace(hot, ts=T0 + 30), HOLD, mem)
    assert len(mem.overridden) == n and actions == [], "none of them is held again"


# --- 16. --once says why it did nothing, with a non-zero status ---------------------------
def _main(args: List[str]) -> Tuple[int, str]:
    import contextlib
    import io

    from slurmiso.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(args)
    return rc, buf.getvalue()


@pytest.mark.parametrize("case,snap,code,words", [
    ("slurm down", Snapshot(T0, slurm_ok=False, errors=("slurm: scontrol timed out",)), 5,
     "Slurm did not answer"),
    ("a source failed", Snapshot(T0, errors=("agent http://n1:9810/metrics: timeout",),
                                 unknown={"agents/timeout": 1}), 8, "telemetry failed"),
    ("all fine", Snapshot(T0), 0, "no action"),
])
def test_once_exit_status(tmp_path: os.PathLike[str], case: str, snap: Snapshot, code: int,
                          words: str) -> None:
    path = os.path.join(str(tmp_path), "s.json")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(dumps(snap))
    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
    st = os.path.join(str(tmp_path), "state.json")
    rc, out = _main(["-c", cfg, "monitor", "--once", "--dry-run", "--snapshot", path,
                     "--state", st, "--lock", st + ".lock"])
    assert rc == code and words in out, out
    rc, out = _main(["-c", cfg, "monitor", "--once", "--dry-run", "--snapshot", path,
                     "--state", st, "--lock", st + ".lock", "--json"])
    assert json.loads(out)["exit"]["code"] == code


def test_once_when_another_monitor_leads(tmp_path: os.PathLike[str]) -> None:
    from slurmiso.state.lock import FileLock

    path = os.path.join(str(tmp_path), "s.json")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(dumps(Snapshot(T0)))
    cfg = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
    st = os.path.join(str(tmp_path), "state.json")
    lock = FileLock(st + ".lock", timeout=0)
    lock.acquire(timeout=0)
    try:
        import subprocess
        import sys

        repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        proc = subprocess.run([sys.executable, "-m", "slurmiso", "-c", cfg, "monitor",
                               "--once", "--snapshot", path, "--state", st, "--lock",
                               st + ".lock"], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=repo))
    finally:
        lock.release()
    assert proc.returncode == 9 and "another monitor leads" in proc.stdout


def test_a_failed_restore_is_retried_not_orphaned() -> None:
    from slurmiso.errors import SlurmError
    from slurmiso.monitor.decide import failed

    c = FakeCluster(["n1", "n2"], {"shared": ["n1", "n2"]})
    c.load["n1"] = (90.0, 10.0, 5.0)
    c.submit("1")
    _, mem = run(c, BASE, 1)
    assert c.jobs["1"].exc_nodes == "n1"
    c.load["n1"] = (10.0, 10.0, 5.0)
    restore = None
    for i in range(1, 40):
        actions, mem = decide(c.snapshot(T0 + 30 * i), BASE, mem)
        if actions:
            restore = actions[0]
            break
    assert restore is not None and restore.kind == "exclude" and restore.details["nodes"] == ""

    class Down(FakeCluster):
        def update_jobs(self, ids: Sequence[str], fields: Dict[str, str]) -> None:
            raise SlurmError("scontrol update failed: Socket timed out")

    out = Applier(None, Down(["n1"], {})).apply([restore])
    assert not out[0].ok
    mem = failed(mem, restore, out[0].error)
    actions, mem = decide(c.snapshot(T0 + 30 * 41), BASE, mem)
    assert [(a.kind, a.details["nodes"]) for a in actions] == [("exclude", "")], "retried"


def test_unknown_scopes_are_journaled_with_since_when(tmp_path: os.PathLike[str]) -> None:
    from slurmiso.state import Journal

    tmp = str(tmp_path)
    journal = Journal(os.path.join(tmp, "journal.jsonl"))
    c = FakeCluster(["n1", "n2"], {"shared": ["n1", "n2"]})
    c.load["n2"] = (10.0, 10.0, 900.0)
    clock = {"ts": T0}

    def snap() -> Snapshot:
        clock["ts"] += 30
        s = c.snapshot(clock["ts"])
        return dataclasses.replace(s, unknown={"agents/timeout": 1},
                                   errors=("agent http://n2:9810/metrics: timeout",))

    mon = Monitor(BASE, snap, Applier(None, c, journal), os.path.join(tmp, "s.json"),
                  os.path.join(tmp, "l"), 30, sleep=lambda s: None)
    list(mon.run(cycles=3))
    mon.close()
    lines = [r for r in journal.read() if r["event"] == "monitor-unknown"]
    assert len(lines) == 1, "once when it changes, not every cycle"
    assert lines[0]["unknown"] == {"n2": T0 + 30} and lines[0]["reasons"] == {
        "agents/timeout": 1}
    assert mon.stats.unknown == {"agents/timeout": 1}
    from prometheus_client import CollectorRegistry, generate_latest

    from slurmiso.monitor.loop import MonitorCollector

    reg = CollectorRegistry(auto_describe=False)
    reg.register(MonitorCollector(mon.stats))
    text = generate_latest(reg).decode()
    assert 'slurmiso_monitor_unknown_signals{reason="timeout",source="agents"} 1.0' in text
    assert "slurmiso_monitor_oldest_hold_seconds" not in text, "nothing held: no sample"


def test_metrics_oldest_hold_and_holds_by_reason(tmp_path: os.PathLike[str]) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from slurmiso.monitor.loop import MonitorCollector

    tmp = str(tmp_path)
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    c.load["n1"] = (95.0, 10.0, 5.0)
    for i in range(3):
        c.submit(str(i))
    clock = {"ts": T0}

    def snap() -> Snapshot:
        clock["ts"] += 30
        return c.snapshot(clock["ts"])

    mon = Monitor(HOLD, snap, Applier(None, c), os.path.join(tmp, "s.json"),
                  os.path.join(tmp, "l"), 30, sleep=lambda s: None)
    list(mon.run(cycles=3))
    mon.close()
    assert mon.stats.oldest_hold_s == 60.0 and mon.stats.held_by_reason == {"gate": 3}
    reg = CollectorRegistry(auto_describe=False)
    reg.register(MonitorCollector(mon.stats))
    text = generate_latest(reg).decode()
    assert "slurmiso_monitor_oldest_hold_seconds 60.0" in text
    assert 'slurmiso_monitor_held_jobs_by_reason{reason="gate"} 3.0' in text


def test_a_job_with_no_admissible_node_is_held_not_excluded_everywhere() -> None:
    """Excluding every node of its partitions could make Slurm hold the job for good
    (BadConstraints): it is held by the monitor instead, and released when a node calms."""
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    c.load["n1"] = (90.0, 10.0, 5.0)
    c.submit("1")
    _, mem = run(c, BASE, 1)
    assert c.jobs["1"].held and "every node it may use (n1)" in mem.holds["1"].reason
    c.load["n1"] = (10.0, 10.0, 5.0)
    run(c, BASE, 30, memory=mem, start=T0 + 30)
    assert not c.jobs["1"].held and c.jobs["1"].exc_nodes == ""
