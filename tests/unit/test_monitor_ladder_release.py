"""How the ladder lets go (issue 33): a cause that is gone is its own verdict (every rung
released within the cycle, the journal saying why); after a requeue the node is given back
after one dwell, not one per rung; a calm dwell goes on across a gap only as far as the
agents' windows prove the gap calm. Driven through decide() and the real applier."""

from __future__ import annotations

import dataclasses
from typing import List, Optional, Tuple

import pytest
from test_monitor_ladder import (
    BREACH_MS,
    CALM_MS,
    DT,
    POL,
    T0,
    Cluster,
    drive,
    ladder_kinds,
    shared_pair,
)

from slurmiso.monitor.action import Action
from slurmiso.monitor.ladder import CALM, calm_start
from slurmiso.monitor.ladder_state import Rung
from slurmiso.monitor.policy import Memory, Policy, override
from slurmiso.monitor.snapshot import Snapshot


def _end(c: Cluster, jid: str, how: str) -> None:
    """Inference job ``jid`` leaves its GPU the way Slurm would show it."""
    if how == "ended":
        del c.jobs[jid], c.place[jid]
    elif how == "requeued":
        c.jobs[jid] = dataclasses.replace(c.jobs[jid], state="PENDING", nodes=(),
                                          reason="BeginTime")
    elif how == "moved":
        c.jobs[jid] = dataclasses.replace(c.jobs[jid], nodes=("n2",))
        c.place[jid] = ("n2", 0)
        c.p99[jid] = CALM_MS
        return
    c.p99.pop(jid, None)


def _releases(steps: List[List[Action]]) -> List[Tuple[int, str, str]]:
    return [k for k in ladder_kinds(steps) if k[1] in ("resume-job", "unthrottle")]


# ------------------------------------------------------------ item 3: the cause is gone
@pytest.mark.parametrize("how,words", [
    ("ended", "inference job i1 has ended"),
    ("requeued", "inference job i1 is pending, no longer running"),
    ("moved", "inference job i1 no longer runs on n1"),
])
@pytest.mark.parametrize("mode", ["mps", "mig-static"])
def test_a_gone_cause_releases_every_rung_in_one_cycle(how: str, words: str,
                                                       mode: str) -> None:
    """Suspended (or, on MIG, throttled) while i1 breached; i1 leaves: within the next cycle
    t1 is resumed (and unthrottled in the cycle after: slurmstepd drops a signal sent while
    its step is still suspended), the pending job is admitted on n1 again, and each line
    says the cause is gone, never that inference is 'within its SLO'."""
    c = shared_pair(mode)
    n = 5 if mode == "mps" else 3
    steps, mem = drive(c, n)
    assert mem.ladder["n1/0"].step == ("suspend" if mode == "mps" else "throttle")
    _end(c, "i1", how)
    steps, mem = drive(c, 2, mem=mem, start=T0 + n * DT)
    kinds = [k[:2] for k in ladder_kinds(steps)]
    assert kinds == ([(0, "resume-job"), (1, "unthrottle")] if mode == "mps"
                     else [(0, "unthrottle")])
    assert c.jobs["t1"].state == "RUNNING" and not mem.restrained and not mem.ladder
    assert c.jobs["p1"].exc_nodes == "", "the hold goes in the same cycle"
    for a in steps[0] + steps[1]:
        if a.kind in ("resume-job", "unthrottle"):
            assert words in a.reason and "within its SLO" not in a.reason, a.reason
            assert a.details["cause"] == "i1" and a.details["cause_gone"] is True


def test_a_silent_cause_is_unknown_not_gone() -> None:
    """i1 still runs but its signals stop (and then its node's agent too): nothing is
    released, however long it lasts."""
    c = shared_pair()
    steps, mem = drive(c, 3)
    c.p99.pop("i1")
    steps, mem = drive(c, 12, mem=mem, start=T0 + 3 * DT)
    assert not _releases(steps) and mem.ladder["n1/0"].step == "throttle"
    real = c.snapshot
    c.snapshot = lambda ts: dataclasses.replace(  # type: ignore[method-assign]
        real(ts), nodes=tuple(dataclasses.replace(n, gpus=(), telemetry_age_s=None)
                              for n in real(ts).nodes))
    steps, mem = drive(c, 12, mem=mem, start=T0 + 15 * DT)
    assert not _releases(steps) and "t1" in mem.restrained


def test_another_inference_job_on_the_gpu_keeps_the_ordinary_dwell() -> None:
    """i1 breached, i2 shares the GPU and is calm: i1 ending leaves i2 to protect, so the
    release waits the calm dwell as before."""
    c = shared_pair()
    c.run_job("i2", "infer", p99=CALM_MS)
    steps, mem = drive(c, 3)
    _end(c, "i1", "ended")
    steps, mem = drive(c, 6, mem=mem, start=T0 + 3 * DT)
    first = _releases(steps)[0]
    assert first[0] >= 2, "a full calm dwell first"
    release = next(a for a in steps[first[0]] if a.kind == first[1])
    assert "within its SLO" in release.reason


def test_every_cause_behind_the_rung_must_be_gone() -> None:
    """i1 breaches, then i2 on the same GPU breaches worse (both are causes of the rung);
    i2 ends while i1 still breaches: no release; i1 ends too: released at once."""
    c = shared_pair()
    steps, mem = drive(c, 3)
    c.run_job("i2", "infer", p99=BREACH_MS + 100)
    steps, mem = drive(c, 2, mem=mem, start=T0 + 3 * DT)
    assert mem.ladder["n1/0"].causes == ("i1", "i2") and mem.ladder["n1/0"].cause == "i2"
    _end(c, "i2", "ended")
    steps, mem = drive(c, 3, mem=mem, start=T0 + 5 * DT)
    assert not _releases(steps) and mem.ladder["n1/0"].step in ("suspend", "requeue")
    _end(c, "i1", "ended")
    steps, mem = drive(c, 1, mem=mem, start=T0 + 8 * DT)
    assert not mem.ladder and c.jobs["p1"].exc_nodes == ""
    assert all(a.details.get("cause_gone") for a in steps[0]
               if a.kind in ("resume-job", "unthrottle"))


@pytest.mark.parametrize("other,released", [(False, True), (True, False)])
def test_unknown_telemetry_gone_only_if_no_slo_job_runs_on_the_node(other: bool,
                                                                    released: bool) -> None:
    """The node's agent is silent, so which GPU a job holds is unknown: the cause's end
    releases the rung only if no SLO inference job runs anywhere on that node (Slurm's
    word); another one there might share the GPU."""
    c = shared_pair()
    if other:
        c.run_job("i3", "infer", gpu=1, p99=CALM_MS)
    steps, mem = drive(c, 3)
    real = c.snapshot
    c.snapshot = lambda ts: dataclasses.replace(  # type: ignore[method-assign]
        real(ts), nodes=tuple(dataclasses.replace(n, gpus=(), telemetry_age_s=None)
                              if n.name == "n1" else n for n in real(ts).nodes),
        job_signals={})
    _end(c, "i1", "ended")
    steps, mem = drive(c, 1, mem=mem, start=T0 + 3 * DT)
    assert bool(_releases(steps)) is released
    assert ("n1/0" in mem.ladder) is not released


def test_a_state_file_of_before_still_loads_and_its_cause_counts() -> None:
    """A rung written before ``causes`` existed names its cause alone: it still goes at
    once when that job ends."""
    c = shared_pair()
    steps, mem = drive(c, 3)
    data = mem.to_dict()
    for rung in data["ladder"].values():
        rung.pop("causes", None)
        rung.pop("calm_seen", None)
    mem = Memory.from_dict(data)
    assert mem.ladder["n1/0"].causes == ()
    _end(c, "i1", "ended")
    steps, mem = drive(c, 1, mem=mem, start=T0 + 3 * DT)
    assert [k[1] for k in _releases(steps)] == ["unthrottle"] and not mem.ladder


def test_rung_round_trips_with_causes_as_a_tuple() -> None:
    rung = Rung("throttle", T0, causes=("1", "2"), calm_seen=T0 + 5)
    assert Rung.from_dict(rung.to_dict()) == rung


# ------------------------------------------------ item 6: one dwell after a requeue
def test_after_a_requeue_the_node_is_given_back_after_one_dwell() -> None:
    """t1 requeued off n1 (the top rung); inference calm from then on: the hold goes one
    release dwell (60 s) later, not one dwell per rung (requeue, suspend, throttle, hold:
    four)."""
    c = shared_pair()
    _, mem = drive(c, 7)
    assert ("requeue", "t1") in c.calls and mem.ladder["n1/0"].step == "requeue"
    c.p99["i1"] = CALM_MS
    for i in range(20):
        _, mem = drive(c, 1, mem=mem, start=T0 + (7 + i) * DT)
        if "n1/0" not in mem.ladder:
            break
    assert i * DT <= 60.0, f"rung gone after {i * DT:.0f}s of calm"
    assert c.jobs["p1"].exc_nodes == "", "n1 admits training again"
    assert i * DT >= 60.0, "one full dwell first"


def test_training_still_restrained_walks_back_one_dwell_per_rung_it_is_at() -> None:
    """Two training jobs; the requeue budget lets one go: t2 stays suspended at the
    requeue rung. Calm: the rung steps to suspend (t2 stays suspended) after a dwell,
    to throttle (t2 resumed) a dwell later, to hold (t2 unthrottled) a dwell after that."""
    pol = override(POL, ["ladder.requeue.per_hour=1"])
    c = shared_pair()
    c.run_job("t2", "train", gpu=0, priority=50.0)
    steps, mem = drive(c, 8, pol)
    assert c.jobs["t1"].state == "PENDING" and c.jobs["t2"].state == "SUSPENDED"
    c.p99["i1"] = CALM_MS
    steps, mem = drive(c, 12, pol, mem=mem, start=T0 + 8 * DT)
    got = [(i, k) for i, k, j in _releases(steps) if j == "t2"]
    assert [k for _, k in got] == ["resume-job", "unthrottle"]
    assert got[0][0] >= 4 and got[1][0] - got[0][0] >= 2, got


# ------------------------------------------- item 6: calm across a gap, only if proven
def _world(c: Cluster, pattern: List[Optional[float]]) -> object:
    """Cycle i: p99 pattern[i]; None: the job's signals are stale (unknown)."""
    def each(i: int, ts: float) -> None:
        p = pattern[i] if i < len(pattern) else CALM_MS
        c.p99["i1"] = BREACH_MS if p is None else p
        c.age["i1"] = 500.0 if p is None else 5.0
    return each


def test_unknown_cycles_inside_the_window_keep_the_calm_dwell() -> None:
    """Calm from cycle 3, two cycles unknown, calm again: the agent's 300 s window behind
    the calm figure reaches back past the last calm seen, so the dwell goes on (unthrottle
    once 60 s of calm are counted from cycle 3), not restarted at cycle 6."""
    pol = dataclasses.replace(POL, signal_window_s=300.0)
    c = shared_pair()
    pattern = [BREACH_MS] * 3 + [CALM_MS, None, None, CALM_MS, CALM_MS, CALM_MS]
    steps, mem = drive(c, 9, pol, each=_world(c, pattern))
    assert [(i, k) for i, k, _ in _releases(steps)][0] == (6, "unthrottle")


def test_unknown_cycles_beyond_the_window_restart_the_calm_dwell() -> None:
    """The same with no window to prove the gap: calm counts again from cycle 6."""
    c = shared_pair()
    pattern = [BREACH_MS] * 3 + [CALM_MS, None, None, CALM_MS, CALM_MS, CALM_MS, CALM_MS]
    pol = dataclasses.replace(POL, signal_window_s=0.0)
    steps, mem = drive(c, 10, pol, each=_world(c, pattern))
    assert [(i, k) for i, k, _ in _releases(steps)][0] == (8, "unthrottle")


def _stop_and_restart(pol: Policy, gap_s: float) -> Tuple[List[Tuple[int, str, str]], float]:
    """Throttle, calm for one cycle, the monitor stops (its memory through the state
    file's JSON) for ``gap_s``, then runs again: the releases, and when it came back."""
    c = shared_pair()
    _, mem = drive(c, 4, pol, each=_world(c, [BREACH_MS] * 3 + [CALM_MS]))
    mem = Memory.from_dict(mem.to_dict())
    back = T0 + 3 * DT + gap_s
    steps, mem = drive(c, 20, pol, mem=mem, start=back, each=_world(c, []))
    return _releases(steps), back


def test_a_restart_after_a_calm_outage_the_windows_prove_keeps_the_dwell() -> None:
    """Down for 5 minutes, the agents' 10-minute window calm behind the first figure back:
    the calm seen before the outage counts, the release dwell (300 s) is over at once."""
    pol = dataclasses.replace(override(POL, ["ladder.throttle.release_after_s=300"]),
                              signal_window_s=600.0)
    rel, back = _stop_and_restart(pol, 300.0)
    assert rel and rel[0][:2] == (0, "unthrottle"), rel


def test_a_restart_counts_no_calm_it_cannot_prove() -> None:
    """Down for 10 minutes with a 60 s window: only the window's calm is proven, so the
    300 s release dwell is served from there, never taken on the first cycle back."""
    pol = dataclasses.replace(override(POL, ["ladder.throttle.release_after_s=300"]),
                              signal_window_s=60.0)
    rel, back = _stop_and_restart(pol, 600.0)
    proven_from = back - 5.0 - 60.0
    assert rel and rel[0][1] == "unthrottle"
    assert back + rel[0][0] * DT - proven_from >= 300, rel
    assert rel[0][0] > 0, "not on the first cycle back"


@pytest.mark.parametrize("calm_from,expect", [
    (None, 1000.0),           # nothing proven: from now
    (990.0, 900.0),           # the window reaches past the last calm seen: goes on
    (995.0, 995.0),           # only part of the gap proven: from the window's start
])
def test_calm_start_after_a_gap(calm_from: Optional[float], expect: float) -> None:
    from slurmiso.monitor.ladder import Breach

    old = Rung("throttle", 500.0, calm_since=900.0, calm_seen=990.0)
    v = Breach(CALM, "i1", calm_from=calm_from)
    assert calm_start(old, v, 1000.0, 980.0, 90.0) == expect
    # consecutive cycles, both calm: goes on whatever the window
    assert calm_start(old, Breach(CALM), 1000.0, 990.0, 90.0) == 900.0


def test_snapshot_without_slurm_changes_nothing_here() -> None:
    """decide() on a snapshot Slurm did not answer keeps every rung (gone is Slurm's word
    only when Slurm spoke)."""
    from slurmiso.monitor.decide import decide

    c = shared_pair()
    _, mem = drive(c, 3)
    _end(c, "i1", "ended")
    actions, mem2 = decide(Snapshot(T0 + 4 * DT, slurm_ok=False), POL, mem)
    assert not actions and mem2.ladder == mem.ladder


def test_the_window_comes_from_the_agents_settings() -> None:
    import os

    from slurmiso.config import load_config
    from slurmiso.monitor.policy import policy_from_config

    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "etc",
                                   "slurmiso.yaml"))
    assert policy_from_config(cfg).signal_window_s == float(cfg.monitor.signals.window_s)
    assert Policy().signal_window_s == 60.0, "the agents' default window"
