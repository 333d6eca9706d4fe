"""``slurmiso probe --local`` end to end on this machine: the CPU stand-in, the simulated GPU
and slurmiso's simulated MPS daemons; and the bad-input paths, each one clear error (never a
traceback) with nothing left running."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import List, Tuple

import psutil
import pytest

from slurmiso.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "etc", "slurmiso.yaml")
#: No figure here may depend on how fast this machine is: a request counts as an error only
#: past 10 minutes (the default, 1 s, is a speed test on a loaded machine).
QUICK = ["--requests", "8", "--rate", "0", "--train-seconds", "0.3",
         "--request-timeout-ms", "600000"]
#: An SLO no machine misses, where the test is not about the recommendation.
ANY_SPEED = ["--p99-ms", "600000"]


@pytest.fixture(autouse=True)
def _no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """No driver here; make sure no stray sim state is picked up either."""
    monkeypatch.setenv("SLURMISO_GPU_BACKEND", "auto")
    monkeypatch.setenv("SLURMISO_SIM_STATE", "/nonexistent/sim.json")


def probe(tmp_path, capsys, *args: str) -> Tuple[int, str, str]:
    rc = main(["-c", CONFIG, "probe", "--local", "--work-dir", str(tmp_path / "work"),
               "--results-dir", str(tmp_path / "results"), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def alive_under(path: str) -> List[int]:
    """Processes whose command line or environment names ``path`` (probe leftovers)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            named = path in cmd or any(path in v for v in proc.environ().values())
            if named and proc.pid != os.getpid() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_builtin_local_probe_gives_well_formed_figures(tmp_path, capsys) -> None:
    rc, out, err = probe(tmp_path, capsys, "--workload", "builtin", "--modes", "timeslice,mps",
                         "--json", *QUICK)
    assert rc in (0, 1), err
    report = json.loads(out)
    assert [m["mode"] for m in report["modes"]] == ["timeslice", "mps"]
    for m in report["modes"]:
        i, t = m["infer"], m["train"]
        assert i["requests"] == 8 and 0 < i["p50_ms"] <= i["p95_ms"] <= i["p99_ms"]
        assert i["error_rate"] == 0.0
        assert t["step_s"] > 0 and t["throughput_vs_solo"] > 0
        assert m["colocated"] is True and m["seconds"] > 0
    # the config's SLO (P99 500 ms) decides; whether the stand-in holds it on this machine is
    # the machine's speed, so what is checked is that the recommendation follows the figures
    assert report["slo"]["p99_ms"] == 500.0 and "monitor.slo" in report["slo"]["source"]
    holding = [m["mode"] for m in report["modes"] if m["infer"]["p99_ms"] <= 500.0]
    assert report["recommendation"]["mode"] == (holding[0] if holding else "none")
    assert rc == (0 if holding else 1) and report["recommendation"]["why"]
    assert report["workload"]["kind"] == "cpu-stand-in"  # said so, in the output
    assert any("CPU stand-ins" in n for n in report["notes"])
    mps = report["modes"][1]
    assert mps["gpus"]["infer"].endswith(":gpu0")  # through slurmiso's MPS daemon layout
    # host figures per run, alone and beside training: the CPU stand-ins used CPU; a local
    # run is in no Slurm job, so its stall shares are the node's (or none without PSI)
    for m in report["modes"]:
        for role in ("infer", "train"):
            for when in ("solo", "mixed"):
                h = m["host"][role][when]
                assert h["cpu_cores"] > 0, (m["mode"], role, when, h)
                assert h["scope"] in ("node", None) and h["memory_peak_mb"] is None
                assert set(h["stall"]) == {"cpu", "memory", "io"}
    # the sim daemons held the classes' limits: training got its 60 %
    info = report["workload"]["info"]
    assert info["infer"]["workload"] == "cpu-stand-in"
    saved = report.get("saved") or ""
    assert saved.startswith(str(tmp_path / "results")) and os.path.exists(saved)
    prom = Path(report["textfile"]).read_text()
    assert 'slurmiso_probe_p99_seconds{mode="mps",pool="local/' in prom
    assert not alive_under(str(tmp_path))  # runners, workloads and MPS daemons all gone
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "slurmiso.isolation.mps_sim" in " ".join(p.info["cmdline"] or [])
                and "/tmp/sip-" in " ".join(p.info["cmdline"] or [])]


def test_the_mps_daemons_give_each_class_its_share(tmp_path, capsys) -> None:
    rc, out, err = probe(tmp_path, capsys, "--modes", "mps", "--json", *QUICK, *ANY_SPEED)
    assert rc == 0, err
    work = str(tmp_path / "work")
    granted = {}
    for role in ("infer", "train"):
        for line in Path(work, f"mps-mixed-{role}.out").read_text().splitlines():
            if "mps_granted" in line:
                granted[role] = json.loads(line)["info"]["mps_granted"]
    assert granted["infer"]["active_thread_percentage"] == 100.0
    assert granted["train"]["active_thread_percentage"] == 60.0
    assert granted["train"]["pinned_device_mem_limit_mb"] == {"0": 24 * 1024}


def test_text_and_html_output(tmp_path, capsys) -> None:
    html = tmp_path / "probe.html"
    rc, out, err = probe(tmp_path, capsys, "--modes", "timeslice", "--no-save", "--html",
                         str(html), *QUICK)
    assert rc in (0, 1), err  # 1: the stand-in missed the config's SLO on this machine
    held = "recommendation: timeslice" in out
    assert "MODE" in out and "why:" in out and (held or "recommendation: none" in out)
    assert "host, alone -> beside training" in out and "CPU STALL" in out
    assert rc == (0 if held else 1)
    page = html.read_text()
    assert "<svg" in page and "SLO P99 500 ms" in page and "http" not in page.split(
        "</style>")[1].replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.parametrize("cmd, expect", [
    ("echo started; exit 3", "failed with exit status 3"),
    ("echo 'warming up'; echo done", "printed no latencies (2 other lines, e.g. 'warming up')"),
    ("true", "printed no latencies (0 other lines)"),
    ("echo 12.5; kill -9 $$", "failed with signal 9"),
], ids=["exit-3", "no-latencies", "no-output", "killed"])
def test_a_bad_infer_cmd_is_one_clear_error(tmp_path, capsys, cmd: str, expect: str) -> None:
    rc, out, err = probe(tmp_path, capsys, "--modes", "timeslice", "--infer-cmd", cmd, *QUICK)
    assert rc == 1 and out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"--infer-cmd {cmd!r}" in err and expect in err
    assert str(tmp_path / "work" / "timeslice-solo-infer.out") in err
    assert str(tmp_path / "work" / "timeslice-solo-infer.err") in err
    assert not alive_under(str(tmp_path))


@pytest.mark.parametrize("tail", ["echo 5; exec sleep 2147483647", "exec sleep 2147483647"],
                         ids=["after-a-latency", "silent"])
def test_a_hanging_infer_cmd_is_killed_and_named(tmp_path, capsys, tail: str) -> None:
    # it sleeps for ever: only --run-timeout ends it (no assertion on how long that took)
    pid_file = tmp_path / "pid"
    cmd = f"echo $$ > {pid_file}; {tail}"
    rc, out, err = probe(tmp_path, capsys, "--modes", "timeslice", "--infer-cmd", cmd,
                         "--run-timeout", "1s", *QUICK)
    assert rc == 1 and out == ""
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "did not finish within 1s and was killed (hung?)" in err
    assert f"--infer-cmd {cmd!r}" in err and "probe run timeslice-solo-infer, pid " in err
    assert str(tmp_path / "work" / "timeslice-solo-infer.out") in err
    assert str(tmp_path / "work" / "timeslice-solo-infer.err") in err
    pid = int(pid_file.read_text())  # the sleep itself (exec): ended with its group
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert not alive_under(str(tmp_path))


def test_the_run_timeout_has_a_sane_default_and_must_be_positive(tmp_path, capsys) -> None:
    from slurmiso.probe.session import Options

    assert Options().run_timeout_s == 300.0  # --run-timeout 5m
    rc, _, err = probe(tmp_path, capsys, "--modes", "timeslice", "--run-timeout", "0s")
    assert rc == 2 and "--run-timeout must be above 0" in err and "Traceback" not in err


def test_a_failure_beside_training_stops_training_and_the_mps_daemons(tmp_path,
                                                                        capsys) -> None:
    # fine alone (first run), fails in the mixed run (second): training must be ended too
    counter = tmp_path / "count"
    cmd = (f"n=$(cat {counter} 2>/dev/null || echo 0); echo $((n+1)) > {counter}; "
           f"[ $n -ge 1 ] && exit 4; echo 1.5")
    rc, out, err = probe(tmp_path, capsys, "--modes", "mps", "--infer-cmd", cmd, *QUICK)
    assert rc == 1 and "failed with exit status 4" in err and "mps-mixed-infer" in err
    started = json.loads((tmp_path / "work" / "mps-mixed-train.started.json").read_text())
    child = started["child_pgid"]
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == \
        psutil.STATUS_ZOMBIE
    assert not alive_under(str(tmp_path))
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "slurmiso.isolation.mps_sim" in " ".join(p.info["cmdline"] or [])
                and "/tmp/sip-" in " ".join(p.info["cmdline"] or [])]


def test_usage_errors(tmp_path, capsys) -> None:
    rc, _, err = probe(tmp_path, capsys, "--modes", "timeslice,warp")
    assert rc == 2 and "unknown mode warp" in err
    rc, _, err = probe(tmp_path, capsys, "--workload", "builtin", "--infer-cmd", "x")
    assert rc == 2 and "exclude each other" in err


def test_mps_v3_holds_each_class_in_its_namespace(tmp_path, capsys) -> None:
    """One -p 3 daemon, one server, a namespace per class: the stand-in speaks protocol 3,
    so the plumbing (not a GPU) is what this shows."""
    rc, out, err = probe(tmp_path, capsys, "--modes", "mps-v3", "--json", *QUICK, *ANY_SPEED)
    assert rc == 0, err
    (mode,) = json.loads(out)["modes"]
    assert mode["mode"] == "mps-v3" and mode["colocated"] is True
    granted = {}
    for role in ("infer", "train"):
        for line in Path(tmp_path, "work", f"mps-v3-mixed-{role}.out").read_text().splitlines():
            if "mps_granted" in line:
                granted[role] = json.loads(line)["info"]["mps_granted"]
    assert (granted["infer"]["namespace"], granted["train"]["namespace"]) == ("infer", "train")
    assert (granted["infer"]["client_priority"], granted["train"]["client_priority"]) == (0, 1)
    assert granted["train"]["active_thread_percentage"] == 60.0
    assert granted["train"]["pinned_device_mem_limit_mb"] == {"0": 24 * 1024}
    assert granted["train"]["server"] == granted["infer"]["server"] == "probe"
    assert not alive_under(str(tmp_path))


def test_an_mps_v3_layout_that_fails_skips_the_mode_with_its_reason(tmp_path, capsys,
                                                                    monkeypatch) -> None:
    from slurmiso.errors import NodeFault
    from slurmiso.isolation.mps_daemon import SimMpsControl

    def refuse(self: SimMpsControl, pipe_dir: str, argv: List[str]) -> str:
        raise NodeFault(f"{' '.join(argv)}: refused")

    monkeypatch.setattr(SimMpsControl, "v3", refuse)
    rc, out, err = probe(tmp_path, capsys, "--modes", "mps-v3,timeslice", "--json", *QUICK,
                         *ANY_SPEED)
    modes = {m["mode"]: m for m in json.loads(out)["modes"]}
    assert "could not be laid out: server create probe: refused" in modes["mps-v3"]["skipped"]
    assert not modes["timeslice"].get("skipped")  # the other modes are still measured
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "slurmiso.isolation.mps_sim" in " ".join(p.info["cmdline"] or [])
                and "/tmp/sip-" in " ".join(p.info["cmdline"] or [])]


def test_mps_sm_partition_puts_each_class_on_its_own_sms(tmp_path, capsys) -> None:
    """Static SM partitions (-S): the GPU's chunks split by the classes' thread percentages
    (100 and 60 of 16 chunks on an H100: 10 and 6), each client on its partition."""
    rc, out, err = probe(tmp_path, capsys, "--modes", "mps-sm-partition", "--json", *QUICK,
                         *ANY_SPEED)
    assert rc == 0, err
    (mode,) = json.loads(out)["modes"]
    assert mode["mode"] == "mps-sm-partition" and mode["colocated"] is True, mode
    granted = {}
    for role in ("infer", "train"):
        out_file = Path(tmp_path, "work", f"mps-sm-partition-mixed-{role}.out")
        for line in out_file.read_text().splitlines():
            if "mps_granted" in line:
                granted[role] = json.loads(line)["info"]["mps_granted"]
    assert (granted["infer"]["sm_count"], granted["train"]["sm_count"]) == (80, 48)
    assert granted["infer"]["sm_partition"] != granted["train"]["sm_partition"]
    assert granted["train"]["active_thread_percentage"] == round(100 * 48 / 132, 1)
    assert not alive_under(str(tmp_path))


def test_a_driver_refusing_sm_partitions_skips_the_mode_with_its_reason(
        tmp_path, capsys, monkeypatch) -> None:
    from slurmiso.errors import NodeFault
    from slurmiso.isolation.mps_daemon import SimMpsControl

    def refuse(self: SimMpsControl, pipe_dir: str, uuid: str, chunks: int) -> str:
        raise NodeFault("sm_partition add answered no partition ID: invalid command")

    monkeypatch.setattr(SimMpsControl, "sm_partition", refuse)
    rc, out, err = probe(tmp_path, capsys, "--modes", "mps-sm-partition", "--json", *QUICK,
                         *ANY_SPEED)
    (mode,) = json.loads(out)["modes"]
    assert mode["skipped"] == ("static SM partitions could not be made: sm_partition add "
                               "answered no partition ID: invalid command")


@pytest.mark.parametrize("total,infer,train,want", [
    (16, 100, 60, (10, 6)), (16, 50, 50, (8, 8)), (2, 100, 1, (1, 1)), (16, 1, 100, (1, 15)),
])
def test_partition_chunks_split_by_thread_share(total: int, infer: int, train: int,
                                                want: tuple) -> None:
    from slurmiso.probe.local import partition_chunks

    assert partition_chunks(total, infer, train) == want
