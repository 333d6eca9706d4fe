"""The host rung, the monitor's half (issue 36 item 4): a breach diagnosed as host contention
host-limits the training jobs the diagnosis names on the node, whatever their GPU, level by
level, released in reverse after calm, budgeted and bounded; the GPU neighbour is not
suspended for it; nothing changes while no levels are configured."""

from __future__ import annotations

import dataclasses
import json
import random
from typing import Any, Callable, Dict, List, Optional, Tuple

import pytest

from slurmiso.config.loader import read_ladder
from slurmiso.errors import ConfigError
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.decide import decide, failed, reconcile_intent
from slurmiso.monitor.host_view import NodeHostFigures
from slurmiso.monitor.ladder_state import HostLimited, HostRung
from slurmiso.monitor.policy import HostRungPolicy, Memory, Policy
from slurmiso.monitor.report import ladder_lines, ladder_status
from slurmiso.restraints import Note
from tests.unit.test_monitor_diagnosis import CALM_PSI, HostCluster, burning_cluster, psi
from tests.unit.test_monitor_ladder import BREACH_MS, CALM_MS, DT, POL, T0

HOST = HostRungPolicy(levels=2, after_s=60, release_after_s=60, per_job=6, per_hour=100,
                      max_s=3600)
HPOL = dataclasses.replace(POL, ladder=dataclasses.replace(POL.ladder, host=HOST))
HOST_KINDS = ("host-limit", "host-unlimit", "ladder-end")


class NotedCluster(HostCluster):
    """The burning cluster's Slurm, keeping the restraint note of each job as written."""

    notes: Dict[str, Optional[Note]]

    def set_restraint_note(self, job: str, note: Optional[Note]) -> None:
        self.notes[job] = note


def noted(c: HostCluster) -> NotedCluster:
    c.__class__ = NotedCluster
    assert isinstance(c, NotedCluster)
    c.notes = {}
    return c


def drive(c: HostCluster, cycles: int, policy: Policy = HPOL, mem: Optional[Memory] = None,
          each: Optional[Callable[[int], None]] = None,
          ) -> Tuple[List[List[Action]], Memory]:
    applier = Applier(None, c)
    mem = mem or Memory()
    out = []
    for i in range(cycles):
        if each is not None:
            each(i)
        actions, mem = decide(c.snapshot(T0 + i * DT), policy, mem)
        for o in applier.apply(actions):
            assert o.ok, o.error
        for a in actions:
            job = c.jobs.get(a.target)
            assert job is None or job.job_class != "infer", f"inference touched: {a}"
        out.append(actions)
    return out, mem


def host_acts(steps: List[List[Action]]) -> List[Tuple[int, str, str, int]]:
    return [(i, a.name, a.target, int(a.details.get("level", -1)))
            for i, acts in enumerate(steps) for a in acts if a.name in HOST_KINDS]


def kinds(steps: List[List[Action]]) -> List[Tuple[int, str, str]]:
    return [(i, a.name, a.target) for i, acts in enumerate(steps) for a in acts]


# ------------------------------------------------------------------- the rung climbs
def test_the_cpu_burner_on_another_gpu_is_host_limited_not_the_gpu_neighbour() -> None:
    c = noted(burning_cluster())
    steps, mem = drive(c, 6)
    # breach from cycle 0; after_s 60 -> level 1 at cycle 2, level 2 at cycle 4
    assert host_acts(steps) == [(2, "host-limit", "t2", 1), (4, "host-limit", "t2", 2)]
    first = next(a for acts in steps for a in acts if a.name == "host-limit")
    assert first.details["diagnosis"]["cause"] == "host-cpu-pressure"
    assert first.details["host_cause"] == "host-cpu-pressure"
    assert first.details["gpu"] == "n1/0" and first.details["cause"] == "i1"
    # the GPU neighbour t1 is throttled at most: never suspended, never requeued
    assert all(a.target != "t1" or a.name == "throttle" for acts in steps for a in acts)
    assert c.jobs["t1"].state == "RUNNING"
    rung = mem.ladder["n1/0"]
    assert rung.step == "throttle"
    assert rung.capped.startswith("suspend waits: the diagnosis places the contention on "
                                  "the host") and "job t2" in rung.capped
    assert mem.host_rungs["n1"].level == 2
    assert mem.host_limited["t2"].level == 2 and "t1" not in mem.host_limited
    # the journal says why: the host-limit line taken when the GPU rung was held names it
    second = next(a for a in steps[4] if a.name == "host-limit")
    assert second.details["gpu_rungs_held"] == {"n1/0": rung.capped}
    assert "gpu_rungs_held" not in first.details, "at cycle 2 nothing was held yet"


def test_the_note_written_is_a_host_limit_with_its_level() -> None:
    c = noted(burning_cluster())
    drive(c, 3)
    note = c.notes["t2"]
    assert note is not None
    text = note.text()
    assert "step=host-limit" in text and text.endswith(",on=resume,lvl=1")
    assert f"since={int(T0 + 2 * DT)}" in text and "gpu=n1/0" in text and "cause=i1" in text
    assert "max=3600" in text
    assert Note.parse(text) == note and note.level == 1


def test_calm_releases_in_reverse_after_its_dwell() -> None:
    c = noted(burning_cluster())

    def calm_from_6(i: int) -> None:
        c.p99["i1"] = BREACH_MS if i < 6 else CALM_MS

    steps, mem = drive(c, 14, each=calm_from_6)
    acts = host_acts(steps)
    assert acts[:2] == [(2, "host-limit", "t2", 1), (4, "host-limit", "t2", 2)]
    # calm from cycle 6; release_after_s 60 -> level 1 at cycle 8, lifted at cycle 10
    assert acts[2:] == [(8, "host-unlimit", "t2", 1), (10, "host-unlimit", "t2", 0)]
    assert c.notes["t2"] is None, "the note is gone: the node restores the job"
    assert mem.host_rungs == {} and mem.host_limited == {}


def test_a_calm_figure_between_the_slo_and_calm_holds_position() -> None:
    c = noted(burning_cluster())

    def between_from_3(i: int) -> None:
        c.p99["i1"] = BREACH_MS if i < 3 else 240.0  # under 250, over 225 (hysteresis)

    steps, mem = drive(c, 12, each=between_from_3)
    assert host_acts(steps) == [(2, "host-limit", "t2", 1)]
    assert mem.host_limited["t2"].level == 1


def test_budgets_stop_a_flapping_rung() -> None:
    policy = dataclasses.replace(HPOL, ladder=dataclasses.replace(
        HPOL.ladder, host=dataclasses.replace(HOST, per_job=2, levels=1, release_after_s=30)))
    c = noted(burning_cluster())

    def flap(i: int) -> None:  # hot 3 cycles, calm 2, again and again
        c.p99["i1"] = BREACH_MS if i % 5 < 3 else CALM_MS

    steps, mem = drive(c, 28, policy=policy, each=flap)
    assert host_acts(steps) == [(2, "host-limit", "t2", 1), (4, "host-unlimit", "t2", 0),
                                (7, "host-limit", "t2", 1), (9, "host-unlimit", "t2", 0)]
    rung = mem.host_rungs["n1"]  # hot again at cycle 27: the rung stands, the job is spared
    assert rung.level == 1 and rung.capped == "host-limit budget of job t2 spent: 2 an hour"
    assert mem.host_limited == {}


def test_inference_and_unclassed_jobs_are_never_host_limited() -> None:
    c = noted(burning_cluster())
    c.jobs["t2"] = dataclasses.replace(c.jobs["t2"], job_class="infer2")  # not training
    steps, mem = drive(c, 8)
    assert host_acts(steps) == []
    assert mem.host_limited == {}
    c = noted(burning_cluster())
    c.run_job("i2", "infer", gpu=1)  # an inference job burning the CPUs
    c.host_jobs["i2"] = dataclasses.replace(c.host_jobs["t2"], job="i2")
    c.host_jobs["t2"] = dataclasses.replace(c.host_jobs["t2"], cpu_cores=0.2)
    steps, mem = drive(c, 8)
    assert all(a[2] != "i2" for a in host_acts(steps))


def test_unknown_figures_take_no_step() -> None:
    c = noted(burning_cluster())
    c.host_node = NodeHostFigures("n1", T0)  # no PSI, no NIC: the diagnosis is unknown
    c.host_jobs = {}
    steps, mem = drive(c, 8)
    assert host_acts(steps) == [] and mem.host_rungs == {}


def test_unknown_signals_hold_position_then_the_bound_ends_it() -> None:
    policy = dataclasses.replace(HPOL, ladder=dataclasses.replace(
        HPOL.ladder, host=dataclasses.replace(HOST, max_s=300)))
    c = noted(burning_cluster())

    def silent_from_3(i: int) -> None:
        c.age["i1"] = 5.0 if i < 3 else None  # its signals of unknown age

    steps, mem = drive(c, 20, policy=policy, each=silent_from_3)
    acts = host_acts(steps)
    assert acts[0] == (2, "host-limit", "t2", 1)
    assert [a for a in acts if a[0] < 13 and a[0] > 2] == [], "held while unknown"
    # not hot since cycle 3; max_s 300 = 10 cycles -> the rung ends at cycle 13
    assert (13, "host-unlimit", "t2", 0) in acts
    assert mem.host_limited == {}


def test_on_an_exclusive_pool_the_host_rung_still_acts() -> None:
    c = noted(burning_cluster())
    c.mode = "exclusive"
    del c.jobs["t1"], c.place["t1"], c.host_jobs["t1"]
    steps, mem = drive(c, 4)
    assert host_acts(steps) == [(2, "host-limit", "t2", 1)]
    assert [k for k in kinds(steps) if k[1] in ("throttle", "suspend")] == []


# ----------------------------------------------------------------------- default off
def test_without_levels_nothing_changes() -> None:
    off = dataclasses.replace(HPOL, ladder=dataclasses.replace(HPOL.ladder,
                                                               host=HostRungPolicy()))
    a_steps, a_mem = drive(burning_cluster(), 12, policy=POL)
    b_steps, b_mem = drive(burning_cluster(), 12, policy=off)
    assert kinds(a_steps) == kinds(b_steps)
    assert [x.details for acts in a_steps for x in acts] == \
        [x.details for acts in b_steps for x in acts]
    assert a_mem.to_dict() == b_mem.to_dict()
    assert "host_rungs" not in a_mem.to_dict() and "host_limited" not in a_mem.to_dict()
    assert any(k[1] == "suspend" for k in kinds(a_steps)), "the GPU rung climbs as before"
    assert "host" not in ladder_status(POL, a_mem, T0)


def test_levels_removed_lift_every_limit() -> None:
    c = noted(burning_cluster())
    _, mem = drive(c, 3)
    assert mem.host_limited["t2"].level == 1
    steps, mem = drive(c, 1, policy=POL, mem=mem)
    assert host_acts(steps) == [(0, "host-unlimit", "t2", 0)]
    assert mem.host_rungs == {} and mem.host_limited == {} and c.notes["t2"] is None


# --------------------------------------------------------- memory, status, undo, restart
def test_memory_round_trips_and_old_files_load() -> None:
    _, mem = drive(noted(burning_cluster()), 5)
    assert mem.host_rungs and mem.host_limited
    back = Memory.from_dict(json.loads(json.dumps(mem.to_dict())))
    assert back == mem
    assert isinstance(back.host_rungs["n1"], HostRung)
    assert isinstance(back.host_limited["t2"], HostLimited)
    old = mem.to_dict()
    del old["host_rungs"], old["host_limited"]
    plain = Memory.from_dict(old)
    assert plain.host_rungs == {} and plain.host_limited == {}


def test_status_shows_the_host_rung_per_node() -> None:
    _, mem = drive(noted(burning_cluster()), 5)
    st = ladder_status(HPOL, mem, T0 + 5 * DT)
    assert st["host"]["nodes"][0]["node"] == "n1" and st["host"]["nodes"][0]["level"] == 2
    assert st["host"]["limited"] == [{"job": "t2", "node": "n1", "level": 2, "for_s": 30.0,
                                      "cause": "i1", "host_cause": "host-cpu-pressure"}]
    lines = ladder_lines(st)
    assert "host rung (2 level(s)): 1 node(s) at a level, 1 training job(s) host-limited" in lines
    assert any(ln.startswith("  n1: level 2 for 30s, inference job i1 on n1") for ln in lines)
    assert any(ln.startswith("  job t2 host-limited (level 2) on n1 for 30s (bound 3600s), "
                             "host-cpu-pressure behind inference job i1") for ln in lines)


def test_a_refused_note_is_undone_and_tried_again() -> None:
    c = noted(burning_cluster())
    steps, mem = drive(c, 3)
    act = next(a for a in steps[2] if a.name == "host-limit")
    back = failed(mem, act, "slurmctld refused")
    assert "t2" not in back.host_limited
    assert back.count("ladder:host-limit:t2", T0 + 2 * DT) == 0
    steps2, _ = drive(c, 1, mem=back)
    assert [a.name for a in steps2[0] if a.target == "t2"] == ["host-limit"]


def test_a_removal_meant_before_a_crash_is_owned_again() -> None:
    c = noted(burning_cluster())
    mem = Memory(intent=[["host-unlimit", "t2", "", ""]])
    reconcile_intent(c.snapshot(T0), mem)
    assert mem.host_limited["t2"].node == "n1"
    steps, mem = drive(c, 1, policy=HPOL, mem=mem)
    assert host_acts(steps) == [(0, "host-unlimit", "t2", 0)]


def test_a_job_the_gpu_ladder_restrains_keeps_its_harder_note() -> None:
    """t2 shares GPU 0 with i1 and burns the CPUs: the GPU rung follows the diagnosis (the
    suspect is on this GPU) and the host rung leaves the job to it."""
    c = noted(burning_cluster())
    c.place["t2"] = ("n1", 0)
    steps, mem = drive(c, 8)
    assert host_acts(steps) == []
    assert any(k == (4, "suspend", "t2") for k in kinds(steps)), kinds(steps)


def _psi_calm_cluster() -> Any:
    c = burning_cluster()
    c.host_node = NodeHostFigures("n1", T0, CALM_PSI, ())
    c.host_jobs["i1"] = dataclasses.replace(c.host_jobs["i1"],
                                            pressure=psi(CALM_PSI, cpu_some=0.01))
    return c


def test_a_hot_breach_that_is_not_the_hosts_takes_no_host_step() -> None:
    c = noted(_psi_calm_cluster())
    c.sm[("n1", 0)] = 30.0
    steps, mem = drive(c, 6)
    assert host_acts(steps) == [] and "n1" not in mem.host_rungs
    assert ActionKind.HOST_LIMIT.journal == "host-limit"


# ---------------------------------------------------------------------------- the config
def test_the_config_gives_the_rung_its_levels_dwell_budgets_and_bound() -> None:
    from slurmiso.monitor.policy import LadderPolicy, override

    raw = {"host_limit": {"after": "2m", "release_after": "10m", "per_job": 3,
                          "per_hour": 9, "max": "2h",
                          "levels": [{"cpu_cores": 8}, {"cpu_cores": 2, "io_weight": 10}]}}
    policy = LadderPolicy.of(read_ladder(raw))
    assert policy.host == HostRungPolicy(2, 120.0, 600.0, 3, 9, 7200.0)
    assert LadderPolicy.of(read_ladder({})).host == HostRungPolicy()
    assert HostRungPolicy().levels == 0, "off by default"
    # a --set of another ladder knob keeps the host rung
    kept = override(dataclasses.replace(HPOL, ladder=policy), ["ladder.hysteresis_pct=20"])
    assert kept.ladder.host == policy.host and kept.ladder.hysteresis_pct == 20


def test_the_configs_host_rung_keys_are_checked() -> None:
    with pytest.raises(ConfigError) as exc:
        read_ladder({"host_limit": {"per_job": 0, "release_after": -5, "colour": "red"}})
    text = "\n".join(exc.value.problems)
    assert "monitor.ladder.host_limit.per_job" in text
    assert "monitor.ladder.host_limit.release_after" in text
    assert "monitor.ladder.host_limit.colour" in text


def test_a_limited_job_that_ends_has_its_note_removed_once() -> None:
    c = noted(burning_cluster())
    _, mem = drive(c, 3)
    del c.jobs["t2"], c.place["t2"], c.host_jobs["t2"]
    steps, mem2 = drive(c, 2, mem=mem)
    acts = [a for acts in steps for a in acts if a.name in HOST_KINDS]
    assert [(a.name, a.target, a.details["gone"]) for a in acts] == [
        ("host-unlimit", "t2", True)]
    assert mem2.host_limited == {}
    assert "t2" not in failed(mem2, acts[0], "no such job").host_limited


def test_with_levels_but_no_host_figures_nothing_changes() -> None:
    """No agent exports host figures: no diagnosis, so neither the host rung nor the GPU
    rungs' cap moves anything; actions and memory are those of a monitor without levels."""
    def plain() -> HostCluster:
        c = burning_cluster()
        c.host_node, c.host_jobs = None, {}
        return c

    a_steps, a_mem = drive(plain(), 12, policy=POL)
    b_steps, b_mem = drive(plain(), 12, policy=HPOL)
    assert kinds(a_steps) == kinds(b_steps)
    assert [x.details for acts in a_steps for x in acts] == \
        [x.details for acts in b_steps for x in acts]
    assert a_mem.to_dict() == b_mem.to_dict()
    assert any(k[1] == "suspend" for k in kinds(b_steps))


def _weather(c: HostCluster, rnd: random.Random) -> Callable[[int], None]:
    """Random breaches, gaps and missing host figures for 40 cycles, then calm."""
    figures = (c.host_node, dict(c.host_jobs))

    def weather(i: int) -> None:
        if i >= 40:  # the long calm at the end
            c.p99["i1"], c.age["i1"] = CALM_MS, 5.0
            return
        c.p99["i1"] = rnd.choice([BREACH_MS] * 6 + [CALM_MS, 240.0, None])
        c.age["i1"] = rnd.choice([5.0] * 9 + [None])
        c.host_node, c.host_jobs = figures if rnd.random() < 0.8 else (None, {})
    return weather


def test_random_weather_keeps_the_rungs_rules() -> None:
    """Levels within those configured, only running training jobs limited, the per-job
    budget kept, and a long calm lifts every limit."""
    rnd = random.Random(36)
    taken = 0
    for _ in range(5):
        c = noted(burning_cluster())
        steps, mem = drive(c, 60, each=_weather(c, rnd))
        limits = [a for acts in steps for a in acts if a.name == "host-limit"]
        taken += len(limits)
        assert all(1 <= a.details["level"] <= HOST.levels for a in limits)
        assert all(c.jobs[a.target].job_class == "train" for a in limits)
        assert len([a for a in limits if a.target == "t2"]) <= HOST.per_job
        assert mem.host_limited == {} and mem.host_rungs == {}
        assert c.notes.get("t2") is None
    assert taken >= 5, "the weather must make the rung climb for the rules to be tested"


def test_a_level_a_budget_held_back_is_not_taken_while_unknown() -> None:
    policy = dataclasses.replace(HPOL, ladder=dataclasses.replace(
        HPOL.ladder, host=dataclasses.replace(HOST, per_job=1, max_s=7200)))
    c = noted(burning_cluster())

    def weather(i: int) -> None:  # hot, then unknown past the budget's hour, then hot
        c.age["i1"] = None if 5 <= i < 130 else 5.0

    steps, mem = drive(c, 132, policy=policy, each=weather)
    assert host_acts(steps) == [(2, "host-limit", "t2", 1), (130, "host-limit", "t2", 2)]
    assert mem.host_limited["t2"].level == 2
