"""A restraint outlives its monitor, visibly and boundedly (issue 33, "how it must be shown").

The ladder's scene (:class:`slurmiso_sandbox.protect.Ladder`): on n2 an inference job and a
training job share one MPS GPU; a real agent and a real monitor daemon (1 s cycles). The
stand-in's latency goes over its SLO until Slurm shows the training job SUSPENDED; then the
monitor is killed (SIGKILL: no goodbye, no release). From then on only the node knows:

* ``slurmiso status`` on n2 shows the job suspended by the ladder, with age, bound and cause;
* ``slurmiso monitor status --state`` (the dead monitor's memory) has a ladder section;
* ``slurmiso audit`` names the unreleased restraint by job id;
* ``slurmiso doctor --node n2`` warns: a restraint past its bound, a monitor not alive;
* the bound ends it: ``slurmiso reconcile`` on n2 (or the agent's watch) resumes the job
  once its heartbeat is old, journaled as a ``ladder-end`` line ``by: node``.

Every wait is for a state, under a deadline that only guards a hang.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any, Dict, List

from slurmiso_sandbox.client import REPO
from slurmiso_sandbox.protect import HOT_MS, Ladder
from tests.integration.test_ladder import until

HANG = 180  # seconds: only says "this hangs" (the heartbeat's limit alone is 60 s)
BOUND_S = 12  # each step's max: well past the dwells (2 s), far below the hang



def _bounded(path: str) -> None:
    """The scene's config with each step's ``max`` and a 1 s interval (the node's heartbeat
    limit is then its floor, 60 s)."""
    with open(path) as fh:
        text = fh.read()
    text = re.sub(r"release_after: (\d+)s", rf"release_after: \1s, max: {BOUND_S}s", text)
    text = text.replace("\nmonitor:\n", "\nmonitor:\n  interval: 1s\n", 1)
    with open(path, "w") as fh:
        fh.write(text)


def _run(lad: Ladder, *args: str) -> subprocess.CompletedProcess:
    """``slurmiso ARGS`` as root on the node (the nodes' view), with the scene's config."""
    env = dict(lad.sbx.env, PYTHONPATH=REPO)
    argv = lad.sbx.ns_argv(sys.executable, "-m", "slurmiso", "--config", lad.config, *args)
    return subprocess.run(argv, env=env, cwd=REPO, text=True, capture_output=True, timeout=240)


def _node_ends(lad: Ladder, job: str) -> List[Dict[str, Any]]:
    return [e for e in lad.actions() if e.get("target") == job and e.get("action") ==
            "ladder-end" and (e.get("details") or {}).get("by") == "node"]


def test_a_monitor_killed_with_training_suspended(sandbox: Any) -> None:
    lad = Ladder(sandbox, ("hold", "throttle", "suspend"), dwell_s=2, window_s=4)
    _bounded(lad.config)
    lad.monitor_config = lad.config
    try:
        lad.start_jobs()
        lad.start_daemons()
        lad.set_latency(HOT_MS)
        lad.wait_kinds(lad.train, ["throttle", "suspend"], HANG)
        until(lambda: sandbox.job_state(lad.train) == "SUSPENDED", "Slurm to show SUSPENDED")
        # the note the node reads: in the job's AdminComment, admin-written (just after the
        # suspend, in the same cycle)
        def note() -> str:
            text = sandbox.cmd("squeue", "-h", "-j", lad.train, "-O", "admin_comment:400")
            return text.strip() if "slurmiso-restraint:step=suspend," in text else ""
        admin = until(note, "the monitor's note in the job's AdminComment")
        assert f"cause={lad.infer}," in admin and f"max={BOUND_S}," in admin, admin
        assert lad.monitor is not None
        os.killpg(lad.monitor.pid, signal.SIGKILL)
        lad.monitor.wait(timeout=30)
        killed = time.time()

        # -- slurmiso status on the node: suspended, with age, bound and cause ------------
        cp = _run(lad, "status", "--node", "n2", "--no-gpus", "--json")
        assert cp.returncode == 0, cp.stderr
        data = json.loads(cp.stdout)
        job = next(j for j in data["jobs"] if j["job"] == lad.train)
        assert job["status"] == "suspended", job
        r = job["restraint"]
        assert r["step"] == "suspend" and r["cause"] == lad.infer and r["max_s"] == BOUND_S
        text = _run(lad, "status", "--node", "n2", "--no-gpus").stdout
        assert f"job {lad.train}: suspended by the ladder for" in text, text
        assert f"inference job {lad.infer} on n2 GPU" in text, text

        # -- the agent exports it (status kept root's record of it on the node) -----------
        series = re.search(r'^slurmiso_job_restraint_seconds\{[^}]*job="' + lad.train +
                           r'"[^}]*step="suspend"[^}]*\} (\S+)$', lad.scrape(), re.M)
        assert series is not None, lad.scrape()[-2000:]
        # From here the node's tools are run by hand: the agent's own watch (every 30 s)
        # would end the restraint at the same moment doctor is to see it (unit-tested:
        # test_the_agents_watch_ends_a_restraint_past_its_bound_with_no_monitor).
        lad.stop_agent()

        # -- monitor status from the dead monitor's memory: a ladder section ---------------
        cp = lad.sbx.slurmiso("--config", lad.config, "monitor", "status", "--state",
                              lad.state)
        assert cp.returncode == 0, cp.stderr
        assert "ladder: 1 GPU(s) at a step, 1 training job(s) restrained" in cp.stdout, \
            cp.stdout
        assert f"job {lad.train} suspended on n2/" in cp.stdout, cp.stdout

        # -- the audit: the unreleased restraint is a finding naming the job ---------------
        journals = [os.path.join(sandbox.path("log"), f) for f in
                    os.listdir(sandbox.path("log")) if f.startswith("journal-")]
        # (the last 5 minutes: a run killed earlier may have left restraints in the journal)
        cp = lad.sbx.slurmiso("--config", lad.config, "audit", "--since", "5m", "--format",
                              "json", "--journal", *journals)
        assert cp.returncode in (0, 1), cp.stderr
        found = [f for f in json.loads(cp.stdout)["findings"]
                 if f["code"] == "ladder-unreleased" and lad.train in f["subjects"]]
        assert found, cp.stdout[-3000:]

        # -- doctor on the node: past its bound, and no live monitor -----------------------
        snap = os.path.join(lad.work, "doctor-snapshot.json")
        last: List[Any] = []

        def doctor() -> Any:
            cp = _run(lad, "doctor", "--node", "n2", "--json", "--save-snapshot", snap)
            codes = {f["code"]: f for f in json.loads(cp.stdout)["findings"]}
            with open(snap) as fh:
                last[:] = [sorted(codes), json.load(fh).get("restraints"), cp.stderr[-500:]]
            return codes if {"ladder-restraint-over-bound", "ladder-monitor-silent"} <= \
                set(codes) else None
        deadline = time.monotonic() + HANG
        while not doctor():
            assert time.monotonic() < deadline, f"doctor never warned; last: {last}"
            time.sleep(2)
        codes = doctor()
        for code in ("ladder-restraint-over-bound", "ladder-monitor-silent"):
            assert codes[code]["severity"] == "warning"
            assert lad.train in codes[code]["subjects"], codes[code]
        assert time.time() - killed >= 59, ("the heartbeat's limit held the monitor alive",
                                            codes["ladder-monitor-silent"]["message"])

        # -- the bound ends it on the node, journaled --------------------------------------
        def ended() -> bool:
            _run(lad, "reconcile", "--node", "n2")
            return sandbox.job_state(lad.train) == "RUNNING"
        until(ended, "the node to resume the training past its bound")
        line = until(lambda: _node_ends(lad, lad.train), "the node's ladder-end line")[0]
        assert line["ok"] is True and line["details"]["bound"]["max_s"] == BOUND_S
        assert line["details"]["suspended_s"] >= BOUND_S
        admin = sandbox.cmd("squeue", "-h", "-j", lad.train, "-O", "admin_comment:400").strip()
        assert "slurmiso-restraint:" not in admin, admin
        cp = _run(lad, "status", "--node", "n2", "--no-gpus", "--json")
        job = next(j for j in json.loads(cp.stdout)["jobs"] if j["job"] == lad.train)
        assert job["restraint"] is None and job["status"] != "suspended", job
    except BaseException:
        lad.debug_cycle()
        raise
    finally:
        lad.stop()
        sandbox.clear_queue()
