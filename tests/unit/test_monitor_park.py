"""The monitor's half of the park rung (issue 35, item 3): the ladder writes a park note
between throttle and suspend, releases it on calm, at its bound and before a requeue, and lets
suspend stand in where the node refuses; what the node says comes back through its agent's
series (``slurmiso_job_park_seconds``, ``slurmiso_job_park_refused``)."""

from __future__ import annotations

import dataclasses
from typing import Dict, List, Optional, Tuple

from slurmiso.exposition.text import parse_prometheus_text
from slurmiso.monitor.action import Action
from slurmiso.monitor.policy import LadderPolicy, Memory, Policy, SloLimit, StepPolicy
from slurmiso.monitor.snapshot import ParkSeen, Snapshot, dumps, loads
from slurmiso.monitor.telemetry import park_view
from slurmiso.restraints import Note, OnBound, RestraintStep
from tests.unit.test_monitor_ladder import BREACH_MS, CALM_MS, DT, T0, Cluster, drive

STEPS = (StepPolicy("hold", 0, 60), StepPolicy("throttle", 60, 60, 6, 100),
         StepPolicy("park", 60, 60, 6, 100, 600), StepPolicy("suspend", 60, 60, 6, 100),
         StepPolicy("requeue", 60, 60, 6, 100))
POL = Policy(min_dwell_s=60, stagger_max_starts=100, max_data_age_s=90, admission="nodes",
             slo=(SloLimit("infer", None, 250, 0.05, class_latency=False),),
             ladder=LadderPolicy(STEPS, hysteresis_pct=10))
KINDS = ("throttle", "park", "unpark", "suspend", "resume-job", "unthrottle", "requeue",
         "ladder-end")


class Node(Cluster):
    """The Slurm stand-in plus the node's park rung as its agent reports it: a park note is
    parked at once, or refused (``refuse``); a note that goes or changes is released."""

    def __init__(self, mode: str = "mps", refuse: bool = False) -> None:
        super().__init__(nodes=("n1", "n2"), mode=mode)
        self.refuse = refuse
        self.notes: Dict[str, Optional[Note]] = {}
        self.parked: Dict[str, float] = {}  # job -> the note's since it is parked for
        self.refused: Dict[str, List[float]] = {}
        self.run_job("i1", "infer", p99=BREACH_MS)
        self.run_job("t1", "train")
        self.submit("p1")

    def set_restraint_note(self, job: str, note: Optional[Note]) -> None:
        self.notes[job] = note
        self.calls.append((f"note-{note.step.value if note else 'none'}", job))

    def node_round(self) -> None:
        for job, note in self.notes.items():
            if note is not None and note.step is RestraintStep.PARK:
                since = float(int(note.since))
                if self.parked.get(job) == since or since in self.refused.get(job, []):
                    continue
                if self.refuse:
                    self.refused.setdefault(job, []).append(since)
                else:
                    self.parked[job] = since
            else:
                self.parked.pop(job, None)

    def snapshot(self, ts: float) -> Snapshot:
        self.node_round()
        snap = super().snapshot(ts)
        seen = {j: ParkSeen(j in self.parked, tuple(self.refused.get(j, ())))
                for j in set(self.parked) | set(self.refused)}
        return dataclasses.replace(snap, parks=seen)


def kinds(steps: List[List[Action]]) -> List[Tuple[int, str]]:
    return [(i, str(a.kind)) for i, acts in enumerate(steps) for a in acts if a.kind in KINDS]


def test_park_comes_between_throttle_and_suspend_and_stands_for_suspend() -> None:
    """Breach: throttle, park (a note, no Slurm call), then no suspend while parked; at the
    requeue step the park is released first and the requeue waits for the node's release."""
    c = Node()
    steps, mem = drive(c, 11, POL)
    assert kinds(steps) == [(2, "throttle"), (4, "park"), (8, "unpark"), (9, "requeue")]
    assert ("suspend", "t1") not in c.calls
    park = next(a for a in steps[4] if a.kind == "park")
    assert park.details["cause"] == "i1" and "cuda-checkpoint" in park.reason
    assert park.details["left"]["step"] == "park" and park.details["left"]["max_s"] == 600
    unpark = next(a for a in steps[8] if a.kind == "unpark")
    assert "released before its requeue: a parked program cannot checkpoint" in unpark.reason
    assert unpark.details["parked_s"] == 4 * DT
    assert unpark.details["left"]["step"] == "throttle", "the throttle's note again"
    notes = [n for n, j in c.calls if n.startswith("note-")]
    assert notes[:3] == ["note-throttle", "note-park", "note-throttle"]
    assert c.jobs["t1"].state == "PENDING" and "t1" not in mem.restrained


def test_a_refused_park_is_released_and_suspend_stands_in_at_once() -> None:
    c = Node(refuse=True)

    def world(i: int, ts: float) -> None:
        c.p99["i1"] = BREACH_MS if i < 7 else CALM_MS

    steps, mem = drive(c, 16, POL, each=world)
    got = kinds(steps)
    assert got[:4] == [(2, "throttle"), (4, "park"), (5, "suspend"), (5, "unpark")]
    unpark = next(a for a in steps[5] if a.kind == "unpark")
    assert unpark.details["refused"] is True and "would not park it" in unpark.reason
    suspend = next(a for a in steps[5] if a.kind == "suspend")
    assert suspend.details["instead_of"] == "park"
    assert suspend.details["left"]["step"] == "suspend"
    assert [k for _, k in got[4:]] == ["resume-job", "unthrottle"]
    assert not mem.restrained and c.jobs["t1"].state == "RUNNING"
    assert len(c.refused["t1"]) == 1, "the node is asked once per breach"


def test_calm_releases_the_park_after_its_dwell() -> None:
    c = Node()

    def world(i: int, ts: float) -> None:
        c.p99["i1"] = BREACH_MS if i < 6 else CALM_MS

    steps, mem = drive(c, 14, POL, each=world)
    got = kinds(steps)
    assert [k for _, k in got] == ["throttle", "park", "unpark", "unthrottle"]
    (_, _), (i_park, _), (i_unpark, _), (i_unt, _) = got
    assert (i_unpark - 6) * DT >= 60 and (i_unt - i_unpark) * DT >= 60
    unpark = next(a for a in steps[i_unpark] if a.kind == "unpark")
    assert unpark.reason.startswith("training unparked after")
    assert unpark.details["parked_s"] == (i_unpark - i_park) * DT
    assert not c.parked and not mem.restrained and c.jobs["t1"].state == "RUNNING"


def test_mig_pools_skip_park_as_they_skip_suspend() -> None:
    c = Node(mode="mig-static")
    steps, _ = drive(c, 8, POL)
    assert [k for _, k in kinds(steps)] == ["throttle", "requeue"]


def test_a_park_past_its_bound_is_released_never_requeued() -> None:
    """The cause stops answering (unknown) while the job is parked: after the park step's
    600 s bound the park is released (with the bound's facts) and the job runs again, even
    with on_bound requeue: a parked program could not checkpoint."""
    pol = dataclasses.replace(POL, ladder=dataclasses.replace(POL.ladder, on_bound=OnBound.REQUEUE))
    c = Node()

    def world(i: int, ts: float) -> None:
        c.p99["i1"] = BREACH_MS if i < 6 else None

    steps, mem = drive(c, 30, pol, each=world)
    ends = [(i, a) for i, acts in enumerate(steps) for a in acts if a.details.get("bound")]
    assert [a.kind for _, a in ends] == ["unpark", "unthrottle"]
    assert ends[0][1].details["bound"]["step"] == "park"
    assert ("requeue", "t1") not in c.calls and "t1" not in mem.restrained


def test_the_snapshot_keeps_what_the_agents_said() -> None:
    c = Node()
    snap = dataclasses.replace(c.snapshot(T0), parks={"t1": ParkSeen(True, (T0,))})
    assert loads(dumps(snap)).parks == {"t1": ParkSeen(True, (T0,))}
    assert ParkSeen(False, (1000.0,)).refuses(1000.6)
    assert not ParkSeen(False, (1000.0,)).refuses(1002.0)


def test_the_agents_series_say_parked_and_refused_per_job() -> None:
    text = ("# TYPE slurmiso_job_park_seconds gauge\n"
            'slurmiso_job_park_seconds{job="7",step="park",processes="2"} 12.0\n'
            "# TYPE slurmiso_job_park_refused gauge\n"
            'slurmiso_job_park_refused{job="8",since="1733460000"} 1.0\n'
            'slurmiso_job_park_refused{job="9",since="soon"} 1.0\n')
    got = park_view(parse_prometheus_text(text, strict=True))
    assert got == {"7": ParkSeen(True, ()), "8": ParkSeen(False, (1733460000.0,)),
                   "9": ParkSeen(False, ())}


def test_without_park_in_the_ladder_nothing_changes() -> None:
    pol = dataclasses.replace(POL, ladder=dataclasses.replace(
        POL.ladder, steps=tuple(s for s in STEPS if s.name != "park")))
    c = Node()
    steps, _ = drive(c, 8, pol)
    assert [k for _, k in kinds(steps)] == ["throttle", "suspend", "requeue"]
    assert not c.parked and all(n != "note-park" for n, _ in c.calls)


def test_mem_round_trips_a_parked_restraint() -> None:
    c = Node()
    _, mem = drive(c, 5, POL)
    back = Memory.from_dict(mem.to_dict())
    assert back.restrained["t1"].parked_since == mem.restrained["t1"].parked_since is not None
    assert back.restrained["t1"].parked_since >= T0


def test_the_config_takes_park_between_throttle_and_suspend(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import yaml

    from slurmiso.config import load_config
    from slurmiso.errors import ConfigError
    from tests.hookctx import write_config

    path = write_config(str(tmp_path), "mps")

    def with_steps(steps: List[str]) -> str:
        with open(path) as fh:
            data = yaml.safe_load(fh)
        data["monitor"] = {"ladder": {"steps": steps}}
        with open(path, "w") as fh:
            yaml.safe_dump(data, fh)
        return path

    cfg = load_config(with_steps(["hold", "throttle", "park", "suspend"]))
    park = next(s for s in cfg.monitor.ladder.steps if s.name == "park")
    assert (park.after_s, park.per_job, park.max_s) == (120, 3, 1800)
    assert "park" not in [s.name for s in load_config(with_steps(
        ["hold", "throttle", "suspend", "requeue"])).monitor.ladder.steps]
    try:
        load_config(with_steps(["hold", "suspend", "park"]))
    except ConfigError as exc:
        assert "steps go soft to hard, in the order hold, throttle, park, suspend, requeue" \
            in str(exc)
    else:
        raise AssertionError("park after suspend was accepted")


def test_the_monitor_nudges_the_node_of_each_note_it_acts_on(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """After a cycle that wrote a park note (or released one), the node's agent is told to
    read its restraints now; a throttle (Slurm acts on it) nudges nobody, nor a dry run."""
    from slurmiso.monitor.apply import Applier
    from slurmiso.monitor.loop import Monitor

    def run(dry: bool) -> List[Tuple[str, ...]]:
        c = Node()
        ticks = iter(range(100))
        nudged: List[Tuple[str, ...]] = []

        def world(i: int) -> None:
            c.p99["i1"] = BREACH_MS if i < 6 else CALM_MS

        def snap() -> Snapshot:
            i = next(ticks)
            world(i)
            return c.snapshot(T0 + i * DT)

        mon = Monitor(POL, snap, Applier(None, c), str(tmp_path / f"s{dry}.json"),
                      str(tmp_path / f"l{dry}"), 30, dry_run=dry, sleep=lambda s: None,
                      nudge=lambda nodes: nudged.append(tuple(sorted(nodes))))
        kinds = [[str(o.action.kind) for o in outs] for outs in mon.run(cycles=14)]
        mon.close()
        flat = [k for ks in kinds for k in ks]
        assert dry or ("park" in flat and "unpark" in flat)
        return nudged

    assert run(False) == [("n1",), ("n1",)], "the park's cycle and the unpark's"
    assert run(True) == []


def test_the_nudge_is_a_scrape_with_the_credential_and_the_wake_header(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import http.server
    import threading

    from slurmiso.monitor import telemetry

    heads: List[Dict[str, str]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            heads.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        monkeypatch.setattr(telemetry, "heartbeat_credential", lambda node: f"cred-{node}")
        src = telemetry.AgentSource(9, {"n1": url})
        src.nudge({"n1": "", "n9": ""})  # n9: no agent URL of its own, not guessed
        assert heads == [dict(heads[0], **{"x-slurmiso-monitor": "cred-n1",
                                           "x-slurmiso-wake": "restraints"})]
        monkeypatch.setattr(telemetry, "heartbeat_credential", lambda node: None)
        src.nudge({"n1": ""})
        assert len(heads) == 1, "no credential (no munged): nothing the agent would believe"
    finally:
        server.shutdown()


def test_a_restart_owns_again_an_unpark_that_may_not_have_happened() -> None:
    """The monitor stopped between its intent to unpark and the note's removal: on restart
    the job is parked again in its memory, so the next calm cycle releases it."""
    from slurmiso.monitor.decide import reconcile_intent

    c = Node()
    mem = Memory(intent=[["unpark", "t1", "", ""]])
    reconcile_intent(c.snapshot(T0), mem)
    assert mem.restrained["t1"].parked_since == T0
    c.p99["i1"] = CALM_MS
    steps, after = drive(c, 4, POL, mem=mem, start=T0 + DT)
    assert [k for _, k in kinds(steps)] == ["unpark"] and "t1" not in after.restrained
