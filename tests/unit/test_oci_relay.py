"""The relay between Slurm and a throttled class's container runtime.

The runtime here is a stand-in with crun's command shape (``RT --root=DIR run ... NAME`` and
``RT --root=DIR state NAME``). As ``run`` it starts a "container" process that logs the
signals it receives, and, like crun (measured on the sandbox), it forwards every signal to
it except SIGWINCH; as ``state`` it prints the container's pid the way crun does.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any, List

import pytest

from tests import waiting

RUNTIME = r'''
import json, os, signal, subprocess, sys, time
work = sys.argv[1].split("=", 1)[1]
if sys.argv[2] == "state":
    print(json.dumps({"id": sys.argv[3], "status": "running",
                      "pid": int(open(work + "/pid").read())}))
    sys.exit(0)
open(work + "/started", "w").close()
inner = subprocess.Popen([sys.executable, "-c", """
import os, signal, sys, time
log = open(sys.argv[1] + '/got', 'a')
def h(s, f):
    log.write(signal.Signals(s).name + chr(10)); log.flush()
    if s == signal.SIGTERM: sys.exit(7)
for s in (signal.SIGWINCH, signal.SIGUSR2, signal.SIGURG, signal.SIGTERM): signal.signal(s, h)
while not os.path.exists(sys.argv[1] + '/go'): time.sleep(0.02)
open(sys.argv[1] + '/pid.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '/pid.tmp', sys.argv[1] + '/pid')
while True: time.sleep(0.05)
""", work])
def fwd(s, f):
    if s != signal.SIGWINCH:  # crun keeps SIGWINCH for terminal resizes
        inner.send_signal(s)
for s in (signal.SIGWINCH, signal.SIGUSR2, signal.SIGURG, signal.SIGTERM): signal.signal(s, fwd)
sys.exit(inner.wait())
'''


def _start(tmp_path: Any, go: bool = True) -> subprocess.Popen:
    """The relay over the stand-in; ``go=False``: its container does not run (no pid in
    its state) until the test writes ``go``."""
    if go:
        (tmp_path / "go").touch()
    rt = tmp_path / "rt.py"
    rt.write_text(RUNTIME)
    runtime = [sys.executable, str(rt), f"--root={tmp_path}", "run", "--bundle", "/b", "n.u.1.0.0"]
    code = ("import sys; from slurmiso.hooks.oci_relay import run; "
            f"sys.exit(run({runtime!r}))")
    return subprocess.Popen([sys.executable, "-c", code])


def _got(tmp_path: Any) -> List[str]:
    path = tmp_path / "got"
    return path.read_text().split() if path.exists() else []


def test_winch_reaches_the_container_the_runtime_would_drop_it(tmp_path: Any) -> None:
    relay = _start(tmp_path)
    try:
        waiting.wait_for(lambda: (tmp_path / "pid").exists(), "the container to start",
                         timeout=30, every=0.05)
        for sig, name in ((signal.SIGWINCH, "SIGWINCH"), (signal.SIGURG, "SIGURG"),
                          (signal.SIGUSR2, "SIGUSR2")):
            relay.send_signal(sig)
            waiting.wait_for(lambda n=name: n in _got(tmp_path), f"{name} inside",
                             timeout=30, every=0.05)
        relay.send_signal(signal.SIGTERM)  # the container ends with status 7
        assert relay.wait(timeout=30) == 7
    finally:
        if relay.poll() is None:
            relay.kill()
    assert _got(tmp_path) == ["SIGWINCH", "SIGURG", "SIGUSR2", "SIGTERM"]


def test_a_winch_sent_before_the_container_runs_reaches_it_once_it_runs(
        tmp_path: Any) -> None:
    relay = _start(tmp_path, go=False)
    try:
        waiting.wait_for(lambda: (tmp_path / "started").exists(), "the runtime to start",
                         timeout=30, every=0.05)
        relay.send_signal(signal.SIGWINCH)  # the state names no process yet
        (tmp_path / "go").touch()
        waiting.wait_for(lambda: "SIGWINCH" in _got(tmp_path), "SIGWINCH inside",
                         timeout=30, every=0.05)
        relay.send_signal(signal.SIGTERM)
        assert relay.wait(timeout=30) == 7
    finally:
        if relay.poll() is None:
            relay.kill()
    assert _got(tmp_path) == ["SIGWINCH", "SIGTERM"]


def test_the_runtimes_other_verbs_keep_the_global_options() -> None:
    from slurmiso.hooks.oci_relay import runtime_command

    run = ["crun", "--root=/r", "--rootless=true", "run", "--bundle", "/b", "n1.u.2.0.0"]
    assert runtime_command(run, "state") == ["crun", "--root=/r", "--rootless=true", "state",
                                             "n1.u.2.0.0"]
    assert runtime_command(run, "delete", "--force")[3:] == ["delete", "--force", "n1.u.2.0.0"]
    with pytest.raises(ValueError):
        runtime_command(["crun", "state", "run"], "delete")  # "run" only as the name


def test_a_runtime_killed_by_a_signal_ends_the_relay_the_same_way(tmp_path: Any) -> None:
    code = ("import sys; from slurmiso.hooks.oci_relay import run; "
            "sys.exit(run(['sh', '-c', 'kill -KILL $$', 'run', 'x']))")
    cp = subprocess.run([sys.executable, "-c", code], timeout=30)
    assert cp.returncode == -signal.SIGKILL


def _state_runtime(tmp_path: Any, state: str) -> List[str]:
    """A runtime whose ``state`` prints ``state`` (the user's file: anything may be there)."""
    rt = tmp_path / "rt.sh"
    rt.write_text(f"#!/bin/sh\ncat <<'EOF'\n{state}\nEOF\n")
    rt.chmod(0o755)
    return [str(rt), "--root=/r", "run", "--bundle", "/b", "n.u.1.0.0"]


@pytest.mark.parametrize("state", [
    '{"pid": true, "status": "running"}',
    '{"pid": 1099511627776, "status": "running"}',
    '{"pid": -5, "status": "running"}',
    '{"pid": "1", "status": "running"}',
    '{"status": "running"}',
    'not json',
    '[1, 2]',
], ids=["bool", "huge", "negative", "string", "none", "not-json", "list"])
def test_an_odd_state_names_no_process(tmp_path: Any, state: str) -> None:
    from slurmiso.hooks.oci_relay import container_pid

    assert container_pid(_state_runtime(tmp_path, state), os.getpid()) == 0


def test_only_a_running_child_of_the_runtime_is_the_container(tmp_path: Any) -> None:
    """A pid the state names must be the runtime's own child, and running."""
    from slurmiso.hooks.oci_relay import container_pid

    child = subprocess.Popen(["sleep", "30"])
    try:
        running = _state_runtime(tmp_path, f'{{"pid": {child.pid}, "status": "running"}}')
        assert container_pid(running, os.getpid()) == child.pid
        assert container_pid(running, os.getpid() + 1) == 0  # not that runtime's child
        stopped = _state_runtime(tmp_path, f'{{"pid": {child.pid}, "status": "stopped"}}')
        assert container_pid(stopped, os.getpid()) == 0
    finally:
        child.kill()
        child.wait()
