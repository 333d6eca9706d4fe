"""The probe's Slurm path against a fake Slurm that runs each batch script as a local process
(as the wrapper tests fake scontrol): what is submitted per mode, results collected from the
files, and every job cancelled - also when the site's command fails or hangs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from typing import Dict, List, Optional, Sequence

import psutil
import pytest
import yaml

from slurmiso.config.loader import parse_config
from slurmiso.errors import ProbeError, SlurmError
from slurmiso.probe.run import Request, run_probe
from slurmiso.probe.session import Options

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SANDBOX_CONFIG = os.path.join(ROOT, "tests", "golden", "sandbox", "slurmiso.yaml")
NODE_OF_PARTITION = {"gpu": "n1", "mps": "n2", "mig": "n3", "migd": "n4", "tslice": "n5"}


class FakeSlurm:
    """sbatch starts the script at once (``sh script``, own session, output to --output);
    squeue lists live jobs as RUNNING; scancel SIGTERMs the job's process group.

    ``requeue``: runs (``timeslice-solo-train``) that are preempted and requeued once, as
    Slurm does it: once the run has printed its first step (its ready file), the job's
    processes get SIGTERM, squeue says REQUEUED once, and the script starts again with
    ``SLURM_RESTART_COUNT=1``; squeue -O RestartCnt says 1 from then on."""

    def __init__(self, pending: Sequence[str] = (), requeue: Sequence[str] = ()) -> None:
        self.calls: List[List[str]] = []
        self.procs: Dict[str, subprocess.Popen] = {}
        self.args: Dict[str, List[str]] = {}
        self.pending = set(pending)  # partitions whose jobs never start
        self.requeue = set(requeue)
        self.restarts: Dict[str, int] = {}
        self.next_id = 100

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
            env: Optional[Dict[str, str]] = None) -> str:
        self.calls.append([cmd, *args])
        if cmd == "sbatch":
            return self._sbatch(list(args))
        if cmd == "squeue":
            job = args[args.index("-j") + 1]
            if job not in self.procs and job not in self.args:
                raise SlurmError("squeue: error: Invalid job id specified")
            if "-O" in args:  # job_fields: Slurm's own fields, fixed width
                assert args[args.index("-O") + 1] == "RestartCnt:64"
                return f"{self.restarts.get(job, 0):<64}\n"
            fmt = args[args.index("-o") + 1]
            if job not in self.procs:
                return ("PENDING" if fmt == "%T" else "Resources") + "\n"
            if fmt == "%T" and self._preempt(job):
                return "REQUEUED\n"
            return "RUNNING\n" if self.procs[job].poll() is None else ""
        if cmd == "scancel":
            for job in args:
                proc = self.procs.get(job)
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(20)
                if job not in self.procs:  # a pending job: cancelled before it started
                    self.args.pop(job, None)
            return ""
        raise AssertionError(f"unexpected Slurm command {cmd}")

    def _preempt(self, job: str) -> bool:
        """Requeue ``job`` now if it is to be preempted and has printed a step."""
        args = self.args[job]
        opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        name = opts["job-name"][len("slurmiso-probe-"):]
        if (name not in self.requeue or job in self.restarts
                or not os.path.exists(os.path.join(opts["chdir"], name + ".ready"))):
            return False
        os.killpg(self.procs[job].pid, signal.SIGTERM)  # Slurm signals every process
        self.procs[job].wait(20)
        self.restarts[job] = 1
        self._launch(job, restart_count=1)
        return True

    def _sbatch(self, args: List[str]) -> str:
        job = str(self.next_id)
        self.next_id += 1
        part = args[args.index("-p") + 1]
        self.args[job] = args
        if part in self.pending:
            return f"{job}\n"
        self._launch(job)
        return f"{job}\n"

    def _launch(self, job: str, restart_count: int = 0) -> None:
        args = self.args[job]
        opts = dict(a[2:].split("=", 1) for a in args if a.startswith("--") and "=" in a)
        node = opts.get("nodelist") or NODE_OF_PARTITION[args[args.index("-p") + 1]]
        env = dict(os.environ, SLURM_JOB_ID=job, SLURMD_NODENAME=node, SLURM_JOB_GPUS="0")
        if restart_count:
            env["SLURM_RESTART_COUNT"] = str(restart_count)
        with open(opts["output"], "a") as out:
            self.procs[job] = subprocess.Popen(["sh", args[-1]], stdout=out,
                                               stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True, cwd=opts["chdir"])

    def submitted(self) -> List[List[str]]:
        return [c[1:] for c in self.calls if c[0] == "sbatch"]

    def alive(self) -> List[str]:
        return [j for j, p in self.procs.items() if p.poll() is None]


@pytest.fixture
def cfg():
    with open(SANDBOX_CONFIG) as fh:
        data = yaml.safe_load(fh)
    data["monitor"]["slo"] = [{"class": "infer", "p99_latency_ms": 500, "max_error_rate": 0.05}]
    return parse_config(data, SANDBOX_CONFIG)


def quick(**kw) -> Options:
    base = dict(requests=6, rate=0.0, train_seconds=0.3, poll_s=0.05, run_timeout_s=60,
                queue_timeout_s=30, ready_timeout_s=30)
    base.update(kw)
    return Options(**base)


def gres(args: List[str]) -> str:
    return next(a for a in args if a.startswith("--gres=")).split("=", 1)[1]


def test_each_mode_is_submitted_as_its_pool_shares_a_gpu(cfg, tmp_path) -> None:
    slurm = FakeSlurm()
    req = Request(options=quick(), modes=("timeslice", "mps", "mig-dynamic"),
                  work_dir=str(tmp_path), slurm=slurm)
    report = run_probe(cfg, req)
    assert [m["mode"] for m in report["modes"]] == ["timeslice", "mps", "mig-dynamic"]
    assert [m["pool"] for m in report["modes"]] == ["tslice", "mps", "migd"]
    subs = slurm.submitted()
    assert len(subs) == 12  # 3 modes x (infer alone, train alone, train + infer)
    by_name = {next(a for a in s if a.startswith("--job-name=")).split("=")[1]: s for s in subs}
    mps_infer = by_name["slurmiso-probe-mps-mixed-infer"]
    assert mps_infer[mps_infer.index("-p"):mps_infer.index("-p") + 2] == ["-p", "mps"]
    assert "--qos=infer" in mps_infer and "--no-requeue" in mps_infer
    assert "--open-mode=append" in by_name["slurmiso-probe-mps-mixed-train"]
    assert "--qos=train" in by_name["slurmiso-probe-mps-mixed-train"]
    assert "--no-requeue" not in by_name["slurmiso-probe-mps-mixed-train"]  # job_submit demands it
    # the pair fits one GPU's 100 gres/mps, in the ratio of the classes' 100 % and 60 %
    assert gres(mps_infer) == "mps:62"
    assert gres(by_name["slurmiso-probe-mps-mixed-train"]) == "mps:38"
    assert gres(by_name["slurmiso-probe-mig-dynamic-solo-infer"]) == "shard:3"  # 3g.40gb
    assert gres(by_name["slurmiso-probe-mig-dynamic-solo-train"]) == "shard:4"  # 4g.40gb
    assert gres(by_name["slurmiso-probe-timeslice-mixed-train"]) == "shard:1"
    # the mixed inference job joins the node its training partner runs on
    assert "--nodelist=n5" in by_name["slurmiso-probe-timeslice-mixed-infer"]
    for m in report["modes"]:
        assert m["infer"]["requests"] == 6 and m["infer"]["p99_ms"] > 0
        assert m["train"]["step_s"] > 0 and m["colocated"] is True
        assert m["node"] == NODE_OF_PARTITION[{"tslice": "tslice", "mps": "mps",
                                               "migd": "migd"}[m["pool"]]]
    assert report["recommendation"]["mode"] == "timeslice"
    assert report["where"] == "slurm" and len(report["runs"]) == 12
    assert not slurm.alive()
    scancels = [c for c in slurm.calls if c[0] == "scancel"]
    assert scancels and set(scancels[-1][1:]) == set(slurm.procs)  # everything, at the end


def test_a_failing_infer_cmd_stops_the_probe_and_cancels_its_jobs(cfg, tmp_path) -> None:
    slurm = FakeSlurm()
    req = Request(options=quick(infer_cmd="echo oops >&2; exit 7"), modes=("mps",),
                  work_dir=str(tmp_path), slurm=slurm)
    with pytest.raises(ProbeError) as err:
        run_probe(cfg, req)
    msg = str(err.value)
    assert "--infer-cmd 'echo oops >&2; exit 7'" in msg and "exit status 7" in msg
    assert "job 100" in msg and str(tmp_path / "mps-solo-infer.out") in msg
    assert str(tmp_path / "mps-solo-infer.slurm.out") in msg
    assert (tmp_path / "mps-solo-infer.err").read_text().strip() == "oops"
    assert not slurm.alive() and ["scancel", "100"] in slurm.calls


def test_a_hang_beside_training_cancels_both_jobs(cfg, tmp_path) -> None:
    slurm = FakeSlurm()
    counter = tmp_path / "count"
    cmd = (f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; "
           f"echo 3; [ $n -ge 1 ] && sleep 300; true")
    req = Request(options=quick(infer_cmd=cmd, run_timeout_s=2), modes=("timeslice",),
                  work_dir=str(tmp_path), slurm=slurm)
    with pytest.raises(ProbeError, match="did not finish within 2s and was killed"):
        run_probe(cfg, req)
    assert not slurm.alive()
    started = json.loads((tmp_path / "timeslice-mixed-train.started.json").read_text())
    assert not psutil.pid_exists(started["child_pgid"]) or psutil.Process(
        started["child_pgid"]).status() == psutil.STATUS_ZOMBIE


def test_a_job_that_never_starts_is_an_error_and_is_cancelled(cfg, tmp_path) -> None:
    slurm = FakeSlurm(pending=["mps"])
    req = Request(options=quick(queue_timeout_s=0.5), modes=("mps",), work_dir=str(tmp_path),
                  slurm=slurm)
    with pytest.raises(ProbeError, match=r"did not start within 0.5s \(Slurm: Resources\)"):
        run_probe(cfg, req)
    assert ["scancel", "100"] in slurm.calls


def test_modes_and_pools_come_from_the_config(cfg, tmp_path) -> None:
    from slurmiso.probe.plan import parse_modes, pools_to_probe

    assert [p.name for p in pools_to_probe(cfg, (), ())] == [
        "tslice", "mps", "migd", "migs", "excl"]
    assert parse_modes("exclusive,timeslice", local=False) == ["timeslice", "exclusive"]
    with pytest.raises(Exception, match="needs --local"):
        parse_modes("mps-priority", local=False)


@pytest.mark.parametrize("preempted", ["timeslice-solo-train", "timeslice-mixed-train"])
def test_a_requeued_training_run_is_not_measured_and_the_probe_goes_on(cfg, tmp_path,
                                                                      preempted: str) -> None:
    slurm = FakeSlurm(requeue=[preempted])
    req = Request(options=quick(), modes=("timeslice", "mps"), work_dir=str(tmp_path),
                  slurm=slurm)
    report = run_probe(cfg, req)
    assert slurm.restarts, "premise: the fake requeued a job"
    ts, mps = report["modes"]
    assert ts["invalid"] is True and ts["infer"]["p99_ms"] is None
    assert ts["train"]["step_s"] is None  # no half-measured step time
    msg = ts["error"]
    assert f"probe run {preempted}" in msg and "was requeued mid-probe" in msg
    assert "started 2 times" in msg and "Slurm's restart count is 1" in msg
    assert "are not used" in msg and str(tmp_path / f"{preempted}.slurm.out") in msg
    assert len((tmp_path / f"{preempted}.starts").read_text().splitlines()) == 2
    assert not mps.get("skipped") and mps["train"]["step_s"] > 0
    assert report["recommendation"]["mode"] == "mps"
    assert report["recommendation"]["missed"]["timeslice"].startswith("not measured:")
    assert any(n.startswith("timeslice: not measured, a run was interrupted") for n in
               report["notes"])
    assert not slurm.alive()
