"""The guardian between the wrapper and the program (wrapper/guardian.py), in its parts: what
the program inherits through it, its reports, its start-up races, and the wrapper without it
(no prctl). The whole-run cases (the wrapper SIGKILLed and so on) are in
test_wrapper_teardown.py."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict

import pytest

from slurmiso.pids import pid_alive
from slurmiso.wrapper import guardian, procctl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SLURMISO_"))}
ENV["PYTHONPATH"] = ROOT

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc and relies on prctl (Linux)"
)


def _mask(status: str, field: str) -> int:
    (line,) = [x for x in status.splitlines() if x.startswith(field + ":")]
    return int(line.split()[1], 16)


def _bits(*sigs: int) -> int:
    return sum(1 << (int(s) - 1) for s in sigs)


@linux_only
def test_program_starts_with_nothing_blocked_and_only_term_and_warn_ignored(
    tmp_path: Path,
) -> None:
    """The guardian blocks every signal; the program must not inherit that, nor any of the
    wrapper's handlers: SIGTERM and the time-limit signal ignored, the rest as exec leaves
    them."""
    out = tmp_path / "status"
    code = f"import shutil; shutil.copy('/proc/self/status', {str(out)!r})"
    argv = [sys.executable, "-m", "slurmiso", "run", "--ckpt-dir", str(tmp_path / "c"), "--",
            sys.executable, "-c", code]
    assert subprocess.run(argv, env=ENV, cwd=str(tmp_path), timeout=60).returncode == 0
    status = out.read_text()
    assert _mask(status, "SigBlk") == 0
    ignored = _mask(status, "SigIgn")
    assert ignored & _bits(signal.SIGTERM, signal.SIGUSR1) == _bits(signal.SIGTERM, signal.SIGUSR1)
    for sig in (signal.SIGUSR2, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD, signal.SIGQUIT):
        assert not ignored & _bits(sig), f"{sig.name} ignored in the program"


@linux_only
def test_the_guardian_sits_between_wrapper_and_program_in_a_session_of_its_own(
    tmp_path: Path,
) -> None:
    out = tmp_path / "ids"
    code = f"import os; open({str(out)!r}, 'w').write(f'{{os.getpid()}} {{os.getppid()}}')"
    argv = [sys.executable, "-m", "slurmiso", "run", "--ckpt-dir", str(tmp_path / "c"), "--",
            "sh", "-c", f"{sys.executable} -c \"{code}\"; sleep 60"]
    proc = subprocess.Popen(argv, env=ENV, cwd=str(tmp_path))
    try:
        deadline = time.monotonic() + 10
        while not (out.exists() and out.read_text()) and time.monotonic() < deadline:
            time.sleep(0.01)
        inner, sh = (int(x) for x in out.read_text().split())
        sh_stat = procctl.read_stat(sh)
        assert sh_stat is not None
        guard = sh_stat[1]  # the program (sh) is the guardian's child ...
        guard_stat = procctl.read_stat(guard)
        assert guard_stat is not None and guard_stat[1] == proc.pid  # ... the wrapper's
        assert Path(f"/proc/{guard}/comm").read_text().strip() == guardian.NAME
        assert guard_stat[2] == guard  # leads its own group (and session)
        assert os.getsid(guard) == guard and os.getsid(sh) == sh != guard
        assert guard_stat[2] != os.getpgid(proc.pid)
        blocked = _mask(Path(f"/proc/{guard}/status").read_text(), "SigBlk")
        assert blocked & _bits(signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(15) == 128 + int(signal.SIGINT)


@linux_only
def test_a_guardian_whose_wrapper_died_before_it_watched_starts_nothing(tmp_path: Path) -> None:
    """The race of a wrapper SIGKILLed between its fork and the guardian's prctl: the
    guardian sees it is no longer the wrapper's child once armed, and starts nothing."""
    ran = tmp_path / "ran"
    r, w = os.pipe()
    middle = os.fork()
    if middle == 0:  # stands for the wrapper: forks the guardian, then is gone at once
        try:
            wrapper = os.getpid()
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals())
            procctl.unavailable()  # loads libc, as Child.start does before its fork
            pid = os.fork()
            if pid == 0:
                while os.getppid() == wrapper:  # wait until the "wrapper" has died
                    time.sleep(0.001)
                guardian.guard(["touch", str(ran)], ENV, (), wrapper, w, close_fds=(r,))
            os.write(w, f"{pid}\n".encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(middle, 0)
    with os.fdopen(r) as fh:
        guard = int(fh.readline())
    deadline = time.monotonic() + 10
    while pid_alive(guard) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not pid_alive(guard), "the guardian of a dead wrapper kept running"
    assert not ran.exists(), "the guardian of a dead wrapper started the program"


@linux_only
def test_kill_tree_ends_descendants_that_keep_forking(tmp_path: Path) -> None:
    """What the guardian does when the wrapper is gone, in a process of its own: a fork
    bomb in miniature (each process forks again as fast as it can) is ended all the same."""
    r, w = os.pipe()
    keeper = os.fork()
    if keeper == 0:
        try:
            procctl.set_subreaper()
            child = os.fork()
            if child == 0:  # keeps forking, each generation orphaning the next
                os.setsid()
                for _ in range(2000):
                    if os.fork() != 0:
                        os._exit(0)
                    time.sleep(0.001)
                os._exit(0)
            while not procctl.descendants(os.getpid()):
                time.sleep(0.001)
            guardian.kill_tree(child)
            left = procctl.descendants(os.getpid())
            os.write(w, f"{len(left)}\n".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        left = fh.readline().strip()
    os.waitpid(keeper, 0)
    assert left == "0"


def test_descendants_are_read_from_one_scan_of_proc(tmp_path: Path) -> None:
    tree: Dict[int, int] = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20}
    for pid, ppid in tree.items():
        (tmp_path / str(pid)).mkdir()
        state = "Z" if pid == 13 else "S"
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (x) {state} {ppid} {pid} 0\n")
    assert sorted(procctl.descendants(10, str(tmp_path))) == [11, 12]  # 13 is a zombie
    assert sorted(procctl.descendants(1, str(tmp_path))) == [10, 11, 12, 20, 21]
    assert procctl.descendants(99, str(tmp_path)) == []


def test_report_lines_parse_or_are_refused() -> None:
    assert guardian.parse_report("started 42\n") == (guardian.STARTED, 42)
    assert guardian.parse_report("exited 9") == (guardian.EXITED, 9)
    for bad in ("", "exited", "exited x", "hello 3", "started 4 5"):
        assert guardian.parse_report(bad) is None


# -- start failures and platforms without prctl -------------------------------------------


@linux_only
def test_a_program_that_cannot_be_run_is_a_usage_error_through_the_guardian(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from slurmiso.cli.main import main

    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    for cmd, says in (("/no/such/program", "no such file"), (str(script), "permission denied")):
        rc = main(["run", "--ckpt-dir", str(tmp_path / "c"), "--", cmd])
        assert rc == 2 and says in capsys.readouterr().err
    assert procctl.children(os.getpid()) == []  # each guardian was reaped


def test_without_prctl_the_program_runs_directly_and_the_wrapper_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from slurmiso.cli.main import main

    why = "plan9 has no prctl(): a SIGKILLed wrapper does not take its program with it"
    monkeypatch.setattr(procctl, "unavailable", lambda: why)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    out = tmp_path / "ppid"
    code = f"import os, sys; open({str(out)!r}, 'w').write(str(os.getppid())); sys.exit(5)"
    with caplog.at_level(logging.WARNING, logger="slurmiso.wrapper"):
        rc = main(["run", "--ckpt-dir", str(tmp_path / "c"), "--", sys.executable, "-c", code])
    assert rc == 5
    assert int(out.read_text()) == os.getpid()  # no guardian between them
    assert any(r.levelno == logging.WARNING and why in r.getMessage() for r in caplog.records)
