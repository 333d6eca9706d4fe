"""``qos apply``, preemption under the applied QoS, and ``doctor`` on the real sandbox.

The QoS limits ``qos apply`` adds (MaxWall, MaxTRESPerJob) are removed again after this module,
so other tests see the QoS the sandbox itself sets up. Misconfigurations are planted in a
snapshot recorded from the live cluster (``doctor --save-snapshot``), never in the shared
slurm.conf; the one live plant (a QoS GraceTime) is repaired by ``qos apply``.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
from typing import Any, Dict, Iterator, List, Set

import pytest

from slurmiso.cli.main import main
from slurmiso.slurm.client import parse_version
from tests.unit.test_doctor import CASES, KNOWN

QOS_FORMAT = "Name,Priority,Preempt,PreemptMode,GraceTime,MaxWall,MaxTRESPerJob,Flags"


def forced(sandbox: Any) -> Set[str]:
    """What doctor rightly finds because of this machine, not the sandbox's setup: a hybrid
    host's cgroup v2 root has no cpuset or memory controller, so the 26.05 v2 sandbox writes
    ConstrainCores=no and ConstrainRAMSpace=no, saying why (host-constrain warns of both)."""
    with open(sandbox.path("etc", "cgroup.conf"), encoding="utf-8") as fh:
        text = fh.read()
    return {"host-constrain"} if re.search(r"^Constrain(Cores|RAMSpace)=no", text, re.M) \
        else set()
MANAGED = ("infer", "train", "debug")


def show_qos(sandbox: Any) -> str:
    return sandbox.cmd("sacctmgr", "-P", "-n", "show", "qos", f"format={QOS_FORMAT}")


def _restore(sandbox: Any, before: str) -> None:
    """Set back each field that differs from ``before`` (only those: 22.05's sacctmgr calls
    re-setting an unchanged ``Preempt=train`` a preemption loop and then changes nothing)."""
    def rows(text: str) -> Dict[str, List[str]]:
        return {r[0]: r for r in ((ln.split("|") + [""] * 8)[:8] for ln in text.splitlines())}

    now = rows(show_qos(sandbox))
    for name, (_n, prio, preempt, mode, grace, wall, tres, _flags) in rows(before).items():
        if name not in MANAGED or name not in now:
            continue
        gpus = next((t.split("=", 1)[1] for t in tres.split(",") if t.startswith("gres/gpu=")),
                    "-1")
        secs = sum(int(x) * m for x, m in zip(reversed(grace.split("-")[-1].split(":")),
                                               (1, 60, 3600)))
        want = {1: f"Priority={prio}", 2: f"Preempt={preempt}",
                3: f"PreemptMode={mode}", 4: f"GraceTime={secs}", 5: f"MaxWall={wall or -1}",
                6: f"MaxTRESPerJob=gres/gpu={gpus}"}
        changes = [v for i, v in want.items() if now[name][i] != (prio, preempt, mode, grace,
                                                                   wall, tres)[i - 1]]
        if changes:
            sandbox.cmd("sacctmgr", "-i", "modify", "qos", "where", f"name={name}", "set",
                        *changes)


@pytest.fixture(scope="module")
def applied(sandbox: Any) -> Iterator[str]:
    """QoS as the sandbox config says (qos apply); the sandbox's own QoS restored after."""
    before = show_qos(sandbox)
    cp = sandbox.slurmiso("qos", "apply")
    assert cp.returncode == 0, cp.stderr
    yield cp.stdout
    _restore(sandbox, before)
    assert show_qos(sandbox) == before


def run_doctor(sandbox: Any, *args: str) -> Any:
    """``slurmiso doctor`` as a node runs it: on a cgroup v2 sandbox in the nodes' view
    (their mount namespace, where /sys/fs/cgroup is the cgroup2 hierarchy), not the host's."""
    if sandbox.cgroup_version == 2:
        return sandbox.node_slurmiso("doctor", *args)
    return sandbox.slurmiso("doctor", *args)


def doctor(sandbox: Any, *args: str) -> Dict[str, Any]:
    cp = run_doctor(sandbox, "--json", *args)
    assert cp.returncode in (0, 1), cp.stderr
    data = json.loads(cp.stdout)
    assert (cp.returncode == 0) == data["ok"]
    return data


def problem_codes(data: Dict[str, Any]) -> List[str]:
    return sorted({f["code"] for f in data["findings"] if f["severity"] != "info"})


def test_qos_apply_twice_changes_nothing(sandbox: Any, applied: str) -> None:
    before = show_qos(sandbox)
    cp = sandbox.slurmiso("qos", "apply")
    assert cp.returncode == 0, cp.stderr
    assert "nothing to change" in cp.stdout
    assert show_qos(sandbox) == before
    assert sandbox.slurmiso("qos", "show").returncode == 0


@pytest.mark.slow
def test_train_is_preempted_by_infer_requeued_and_restarts(sandbox: Any, applied: str,
                                                           submit: Any, wait_for: Any) -> None:
    """Measured on 22.05.8: ~150 s (GraceTime 30 s, then the requeued job waits about two
    minutes before it is eligible again)."""
    train = submit("#!/bin/bash\necho attempt ${SLURM_RESTART_COUNT:-0}\nsleep 300\n",
                   "-p", "gpu", "--gres=gpu:2", "--qos=train")
    wait_for(train, {"RUNNING"}, timeout=30)
    infer = submit("#!/bin/bash\nsleep 2\n", "-p", "gpu", "--gres=gpu:1", "--qos=infer")
    wait_for(infer, timeout=90)  # GraceTime 30 s, then the GPU is infer's
    states = [r["State"] for r in sandbox.sacct(train)]
    assert "PREEMPTED" in states or "REQUEUED" in states, states
    deadline = time.monotonic() + 180
    fields: Dict[str, str] = {}
    while time.monotonic() < deadline:  # the GPU is free again: train starts again
        fields = sandbox.job_fields(train)
        if fields.get("JobState") == "RUNNING" and int(fields.get("Restarts", "0")) >= 1:
            break
        time.sleep(1)
    assert fields.get("JobState") == "RUNNING", fields
    assert int(fields["Restarts"]) >= 1
    deadline = time.monotonic() + 20
    while "attempt 1" not in sandbox.job_output(train) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "attempt 1" in sandbox.job_output(train)


def test_doctor_is_clean_on_the_sandbox(sandbox: Any, applied: str) -> None:
    """Every GPU node of the sandbox, and the controller's view, after ``qos apply``."""
    version = sandbox.slurm_version()
    assert version is not None, "scontrol --version printed no release"
    for node in ("n1", "n2", "n3", "n4", "n5"):
        data = doctor(sandbox, "--node", node)
        # doctor reports the release the node runs, read from Slurm, not assumed
        assert data["node"] == node and parse_version(data["slurm_version"]) == version
        codes = set(problem_codes(data))
        assert codes <= forced(sandbox) and data["ok"] is (not codes), data["findings"]
    view = doctor(sandbox)  # the controller's view: no GPU node
    assert not KNOWN and set(problem_codes(view)) <= forced(sandbox), view["findings"]


@pytest.fixture(scope="module")
def live_snapshot(sandbox: Any, applied: str, tmp_path_factory: Any) -> Dict[str, Any]:
    path = str(tmp_path_factory.mktemp("doctor") / "live.json")
    cp = run_doctor(sandbox, "--node", "n3", "--save-snapshot", path)
    assert cp.returncode in (0, 1), cp.stderr
    with open(path) as fh:
        return json.load(fh)


@pytest.mark.parametrize("name,plant,codes", CASES, ids=[c[0] for c in CASES])
def test_doctor_finds_each_misconfiguration_planted_in_a_live_snapshot(
        sandbox: Any, live_snapshot: Dict[str, Any], tmp_path: Any, capsys: Any,
        name: str, plant: Any, codes: Any) -> None:
    snap = copy.deepcopy(live_snapshot)
    plant(snap)
    path = os.path.join(str(tmp_path), f"{name}.json")
    with open(path, "w") as fh:
        json.dump(snap, fh)
    rc = main(["doctor", "--json", "--snapshot", path])  # in-process: no Slurm is read
    data = json.loads(capsys.readouterr().out)
    assert rc == 1 and set(problem_codes(data)) - KNOWN - forced(sandbox) == codes, \
        data["findings"]


def test_doctor_sees_a_live_grace_time_cut_and_qos_apply_repairs_it(sandbox: Any,
                                                                    applied: str) -> None:
    sandbox.cmd("sacctmgr", "-i", "modify", "qos", "where", "name=train", "set", "GraceTime=5")
    try:
        data = doctor(sandbox, "--node", "n3")
        grace = [f for f in data["findings"] if f["code"] == "qos-grace"]
        assert grace and "GraceTime=5" in grace[0]["message"], data["findings"]
        assert sandbox.slurmiso("qos", "show").returncode == 1
    finally:
        cp = sandbox.slurmiso("qos", "apply")
    assert cp.returncode == 0 and "GraceTime 5 -> 30" in cp.stdout, cp.stdout
    assert problem_codes(doctor(sandbox, "--node", "n3")) == sorted(KNOWN | forced(sandbox))


def test_account_grants_applied_and_enforced_at_sbatch(sandbox: Any, applied: str,
                                                       tmp_path: Any) -> None:
    """A config whose debug class is for account ``ops`` only: ``qos apply`` grants debug to
    ops, and the job_submit.lua generated from it refuses debug jobs of another account at
    sbatch, with the fix; the same user's debug job under ops is accepted."""
    with open(sandbox.slurmiso_config) as fh:
        text = fh.read()
    marker = "    qos:\n      priority: 500\n"
    assert marker in text
    cfg = tmp_path / "accounts.yaml"
    cfg.write_text(text.replace(marker, marker + "      accounts: [ops]\n"))
    lua = sandbox.path("etc", "job_submit.lua")
    with open(lua) as fh:
        original = fh.read()
    argv = ["runuser", "-u", "sbxuser", "--", "env", f"SLURM_CONF={sandbox.slurm_conf}",
            "sbatch", "--parsable", "--hold", "-o", "/dev/null", "-p", "gpu", "--qos=debug"]

    def sbatch(*args: str) -> Any:
        import subprocess

        return subprocess.run(argv + list(args) + ["--wrap", "sleep 1"], env=sandbox.env,
                               text=True, capture_output=True, timeout=30, cwd="/tmp")

    try:
        plan = sandbox.slurmiso("--config", str(cfg), "qos", "apply", "--dry-run")
        assert "+ account ops: grant qos debug" in plan.stdout, plan.stdout + plan.stderr
        cp = sandbox.slurmiso("--config", str(cfg), "qos", "apply")
        assert cp.returncode == 0, cp.stdout + cp.stderr
        again = sandbox.slurmiso("--config", str(cfg), "qos", "apply")
        assert "nothing to change" in again.stdout, again.stdout
        sandbox.cmd("sacctmgr", "-i", "add", "user", "sbxuser", "account=ops",
                    "cluster=slurmiso-sbx")
        gen = sandbox.slurmiso("--config", str(cfg), "gen", "job-submit")
        assert gen.returncode == 0, gen.stderr
        _swap_script(lua, gen.stdout)
        refused = sbatch()  # the user's default account is research
        assert refused.returncode != 0, refused.stdout
        assert ("slurmiso: account research may not run debug jobs (allowed: ops): submit "
                "with --account=ops or another --qos") in refused.stderr, refused.stderr
        ok = sbatch("--account=ops")
        assert ok.returncode == 0, ok.stderr
        fields = sandbox.job_fields(ok.stdout.strip())
        assert (fields["Account"], fields["QOS"]) == ("ops", "debug")
    finally:
        sandbox.cmd("scancel", "-u", "sbxuser", check=False)
        _swap_script(lua, original)
        sandbox.cmd("sacctmgr", "-i", "delete", "user", "name=sbxuser", "account=ops",
                    check=False)
        sandbox.cmd("sacctmgr", "-i", "modify", "account", "where", "name=ops", "set",
                    "qos-=debug", check=False)
    assert "debug" not in sandbox.cmd("sacctmgr", "-n", "-P", "show", "assoc",
                                      "where", "account=ops", "format=qos")
    deadline = time.monotonic() + 30
    while True:  # slurmctld runs the sandbox's own job_submit.lua again
        back = sbatch()
        if back.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert back.returncode == 0, back.stderr
    sandbox.cmd("scancel", back.stdout.strip())


def _swap_script(path: str, text: str) -> None:
    """Replace job_submit.lua whole (rename: slurmctld never reads half a file), a second
    after the last load: job_submit/lua reloads only a script newer, in whole seconds,
    than its last load."""
    time.sleep(1.1)
    tmp = path + ".swap"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
