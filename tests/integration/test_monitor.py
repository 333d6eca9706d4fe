"""The monitor against the live sandbox: holds and releases training under simulated load,
lends a node between partitions and takes it back, re-lays MIG on a drained node.

Each test runs ``slurmiso monitor --once`` (in-process GPU backends: the five simulated
nodes share this host) with a copy of the sandbox config whose dwell is 0 and which applies
its decisions; whatever the test changes in the sandbox is restored in ``finally``.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from typing import Any, Callable, List

import pytest

from slurmiso.slurm.hostlist import expand

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXTRA_LAYOUT = """    sandbox-all-3g:
      - devices: all
        mig-enabled: true
        mig-devices:
          3g.40gb: 2
"""


@pytest.fixture
def monitor(sandbox: Any, tmp_path: Any) -> Callable[..., str]:
    """Run one applied monitor cycle; returns its stdout (fails on a non-zero exit)."""
    from slurmiso.sandbox.demo import monitor_config, run_monitor

    cfg = monitor_config(sandbox, str(tmp_path), EXTRA_LAYOUT)

    def run(*args: str) -> str:
        return run_monitor(sandbox, cfg, str(tmp_path), *args)

    run.config = cfg  # type: ignore[attr-defined]
    return run


def _held(sandbox: Any, job: str) -> bool:
    return sandbox.job_fields(job).get("Reason", "") in ("JobHeldAdmin", "JobHeldUser")


def _nodes(sandbox: Any, partition: str) -> List[str]:
    out = sandbox.cmd("scontrol", "show", "partition", "-o", partition)
    value = re.search(r" Nodes=(\S+)", out)
    return expand(value.group(1)) if value and value.group(1) != "(null)" else []


def _wait(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def test_load_holds_training_and_calm_releases_it(sandbox: Any, tmp_path: Any) -> None:
    from slurmiso.sandbox.demo import monitor_hold_scenario

    r = monitor_hold_scenario(sandbox, str(tmp_path))
    pending = r["pending_job"]
    assert f"did hold {pending}: training held: n5 GPU 0" in r["hot"], r["hot"]
    assert r["held"]
    assert "no action" in r["still_hot"], "hot still: nothing more to do"
    assert f"did release {pending}" in r["calm"], r["calm"]
    assert r["pending_state"] == "COMPLETED"
    journal = sandbox.path("log", f"journal-{os.uname().nodename.split('.')[0]}.jsonl")
    with open(journal) as fh:
        lines = [json.loads(ln) for ln in fh if '"monitor-action"' in ln]
    mine = [ln for ln in lines if ln.get("target") == pending]
    assert [ln["action"] for ln in mine][-2:] == ["hold", "release"]
    assert mine[-2]["details"]["memory_pct"] > 75 and mine[-2]["dry_run"] is False


def test_idle_node_lent_and_reclaimed(sandbox: Any, submit: Any, wait_for: Any,
                                      monitor: Callable[..., str]) -> None:
    original = _nodes(sandbox, "tslice")
    try:
        sandbox.wait_idle()
        out = monitor("--lend", "mps:tslice")
        assert "did partition-update tslice: lend idle n2 of mps to tslice" in out, out
        assert sorted(_nodes(sandbox, "tslice")) == sorted(original + ["n2"])
        infer = submit("#!/bin/bash\nsleep 20\n", "-p", "mps", "--qos=infer", "--gres=mps:50")
        _wait(lambda: sandbox.job_state(infer) in ("RUNNING", "PENDING"), 20, "infer job")
        out = monitor("--lend", "mps:tslice")
        assert "did partition-update tslice: reclaim n2 for mps" in out, out
        assert _nodes(sandbox, "tslice") == original
    finally:
        sandbox.cmd("scontrol", "update", "PartitionName=tslice",
                    f"Nodes={','.join(original)}")


def test_mig_relayout_drains_applies_resumes_and_new_gres_schedule(
        sandbox: Any, submit: Any, wait_for: Any, monitor: Callable[..., str]) -> None:
    """Pending 3g.40gb demand beyond n3's three: drain n3, wait for its jobs (never killed),
    lay out 4x 3g.40gb, tell Slurm (the sandbox's after-relayout step restarts slurmctld:
    22.05 keeps GRES counts across reconfigure), resume; then four 3g.40gb jobs run at once,
    each on its own instance, the two that waited through the re-layout among them."""
    cfg = monitor.config  # type: ignore[attr-defined]
    sync = f"{sys.executable} -m slurmiso sandbox sync-gres"
    hold = "#!/bin/bash\necho CVD=$CUDA_VISIBLE_DEVICES\nsleep {secs}\n"
    try:
        running = [submit(hold.format(secs=8), "-p", "mig", "--gres=gpu:3g.40gb:1",
                          "--qos=infer") for _ in range(3)]
        for job in running:
            wait_for(job, {"RUNNING"}, timeout=40)
        waiting = [submit(hold.format(secs=15), "-p", "mig", "--gres=gpu:3g.40gb:1",
                          "--qos=infer") for _ in range(2)]
        out = monitor()
        assert "did drain n3: MIG re-layout to sandbox-all-3g" in out, out
        assert "DRAIN" in sandbox.cmd("scontrol", "show", "node", "n3")
        assert "no action" in monitor(), "jobs still run: wait for them"
        for job in running:
            wait_for(job, timeout=40)  # they finish: nothing was killed
        _wait(lambda: not sandbox.cmd("squeue", "-h", "-w", "n3").strip(), 30, "n3 empty")
        out = monitor("--after-relayout", sync)
        assert "did mig-apply n3: drained and empty: lay out MIG sandbox-all-3g" in out, out
        shown = json.loads(sandbox.slurmiso("--config", cfg, "mig", "show", "--node", "n3",
                                            "--json").stdout)
        assert sorted(i["profile"] for i in shown["instances"]) == ["3g.40gb"] * 4
        node = sandbox.cmd("scontrol", "show", "node", "n3")
        assert "Gres=gpu:3g.40gb:4" in node and "DRAIN" in node, node  # still drained
        out = monitor()
        assert "did resume n3: MIG layout sandbox-all-3g applied" in out, out
        more = [submit(hold.format(secs=15), "-p", "mig", "--gres=gpu:3g.40gb:1",
                       "--qos=infer") for _ in range(2)]
        for job in waiting + more:  # four at once: the fourth GRES is schedulable
            wait_for(job, {"RUNNING"}, timeout=40)
        cvd = set()
        for job in waiting + more:
            _wait(lambda j=job: "CVD=MIG-" in sandbox.job_output(j), 20, f"job {job} output")
            cvd.add(re.search(r"CVD=(\S+)", sandbox.job_output(job)).group(1))  # type: ignore
        assert cvd == {i["uuid"] for i in shown["instances"]}
    finally:
        sandbox.cmd("scancel", "-p", "mig", check=False)
        _wait(lambda: not sandbox.cmd("squeue", "-h", "-w", "n3").strip(), 30, "n3 empty")
        for args in [("mig", "apply", "--node", "n3"), ("sandbox", "sync-gres")]:
            cp = sandbox.slurmiso(*args)  # the sandbox's own layout, and Slurm told
            assert cp.returncode == 0, cp.stdout + cp.stderr
        sandbox.cmd("scontrol", "update", "nodename=n3", "state=resume", check=False)
    assert "Gres=gpu:3g.40gb:3" in sandbox.cmd("scontrol", "show", "node", "n3")
    assert sandbox.slurmiso("mig", "assert", "--node", "n3").returncode == 0
