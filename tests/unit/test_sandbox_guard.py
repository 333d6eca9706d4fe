"""The sandbox's host guard: ``sandbox up`` refuses a host with a Slurm or munge setup it did
not create, unless forced. Every case runs on a fake root with a fake process list."""

from __future__ import annotations

import json
import os
from typing import List

import pytest

from slurmiso.errors import SandboxError
from slurmiso_sandbox import guard as G

KEY = "/etc/munge/munge.key"
SBX = "/var/lib/slurmiso-sandbox"


def write(root, path: str, data: bytes = b"k" * 128) -> None:
    full = os.path.join(str(root), path.lstrip("/"))
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as fh:
        fh.write(data)


def host(root, procs: List[G.Proc] = ()) -> G.Host:
    return G.Host(str(root), lambda: list(procs))


def sandbox_dir(root, d: str = SBX) -> str:
    write(root, f"{d}/run/sandbox.json", b"{}\n")
    return d


def refusal(h: G.Host) -> str:
    with pytest.raises(SandboxError) as err:
        G.check_host(h)
    return str(err.value)


def test_clean_host_passes_and_writes_nothing(tmp_path):
    assert G.check_host(host(tmp_path)) == {}
    assert not os.path.exists(os.path.join(tmp_path, G.HOST_MARKER.lstrip("/")))


@pytest.mark.parametrize("path", [KEY, "/etc/slurm/slurm.conf", "/etc/slurm/slurmdbd.conf",
                                  "/etc/slurm-llnl/slurm.conf"])
def test_a_config_the_sandbox_did_not_create_is_refused_by_name(tmp_path, path):
    write(tmp_path, path)
    msg = refusal(host(tmp_path))
    assert path in msg and "--force" in msg and "did not create" in msg


def test_a_key_made_before_the_marker_existed_is_foreign(tmp_path):
    """This machine's case: earlier sandboxes made the key, nothing recorded it."""
    write(tmp_path, KEY)
    write(tmp_path, G.HOST_MARKER, json.dumps({"files": {}, "procs": {}}).encode())
    assert KEY in refusal(host(tmp_path))


def test_the_sandboxs_own_key_is_recognised_by_its_digest(tmp_path):
    h = host(tmp_path)
    before = G.check_host(h)
    write(tmp_path, KEY)  # what apt's munge postinst (or mungekey) does during 'up'
    assert G.record_created(h, before) == [KEY]
    marker = G.read_marker(h)
    assert marker["files"][KEY]["how"] == "created"
    assert KEY in G.check_host(h)  # the next 'up' passes
    assert G.record_created(h, G.check_host(h)) == []  # nothing new to record
    write(tmp_path, KEY, b"x" * 128)  # someone replaced it with a site's key
    assert KEY in refusal(h)


def test_a_file_present_before_up_is_never_recorded_as_created(tmp_path):
    h = host(tmp_path)
    write(tmp_path, KEY)
    with pytest.raises(SandboxError):
        G.check_host(h)
    assert G.record_created(h, G.present(h)) == []
    assert KEY in refusal(h)


def test_force_adopts_what_it_found_and_later_runs_pass(tmp_path):
    write(tmp_path, KEY)
    h = host(tmp_path)
    G.check_host(h, force=True)
    assert G.read_marker(h)["files"][KEY]["how"] == "adopted"
    assert KEY in G.check_host(h)
    mode = os.stat(os.path.join(tmp_path, G.HOST_MARKER.lstrip("/"))).st_mode & 0o777
    assert mode == 0o600


def test_a_corrupt_marker_records_nothing(tmp_path):
    write(tmp_path, KEY)
    write(tmp_path, G.HOST_MARKER, b"[not a marker")
    assert KEY in refusal(host(tmp_path))


# --- daemons ---------------------------------------------------------------------------


def ctld(pid: int, *argv: str, conf: str = "", ppid: int = 1, started: float = 10.0,
         name: str = "slurmctld", host_root: bool = True) -> G.Proc:
    return G.Proc(pid, ppid, name, (f"/usr/sbin/{name}",) + argv, conf, host_root, started)


def test_the_sites_slurmctld_is_refused(tmp_path):
    msg = refusal(host(tmp_path, [ctld(812, "-D")]))
    assert "slurmctld pid 812" in msg and "/etc/slurm/slurm.conf" in msg


def test_sandbox_daemons_are_recognised_by_their_config(tmp_path):
    d = sandbox_dir(tmp_path)
    procs = [
        ctld(100, "-D", "-f", f"{d}/etc/slurm.conf"),
        ctld(101, conf=f"{d}/etc/slurm.conf", ppid=100, started=11.0),  # slurmscriptd
        ctld(102, "-D", "-f", f"{d}/etc/slurm.conf", "-N", "n1", name="slurmd"),
        ctld(103, "-D", conf=f"{d}/etc/slurm.conf", name="slurmdbd"),
    ]
    assert G.scan(host(tmp_path, procs)) == []


def test_a_helper_is_the_sandboxs_when_its_parent_is(tmp_path):
    d = sandbox_dir(tmp_path)
    parent = ctld(100, "-D", "-f", f"{d}/etc/slurm.conf", started=10.0)
    helper = G.Proc(101, 100, "slurmctld", ("slurmctld: slurmscriptd",), "", True, 11.0)
    assert G.scan(host(tmp_path, [helper, parent])) == []
    stray = G.Proc(101, 1, "slurmctld", ("slurmctld: slurmscriptd",), "", True, 11.0)
    assert [f.what for f in G.scan(host(tmp_path, [parent, stray]))] == ["slurmctld pid 101"]


def test_a_config_outside_a_sandbox_dir_is_foreign(tmp_path):
    write(tmp_path, "/srv/cluster/etc/slurm.conf")  # looks like <dir>/etc/, no sandbox state
    msg = refusal(host(tmp_path, [ctld(7, "-D", "-f", "/srv/cluster/etc/slurm.conf")]))
    assert "slurmctld pid 7" in msg and "/srv/cluster/etc/slurm.conf" in msg


def test_daemons_in_another_root_are_not_the_hosts(tmp_path):
    """A sandbox of another Slurm release runs its own slurmctld and munged in a chroot."""
    procs = [ctld(5, "-D", "-f", "/x/etc/slurm.conf", host_root=False),
             ctld(6, name="munged", host_root=False)]
    assert G.scan(host(tmp_path, procs)) == []


def test_munged_is_the_sandboxs_when_its_key_is(tmp_path):
    h = host(tmp_path, [ctld(9, name="munged")])
    assert [f.what for f in G.scan(h)] == ["munged pid 9"]  # no key at all: not ours
    before = G.present(h)
    write(tmp_path, KEY)
    G.record_created(h, before)
    assert G.scan(h) == []
    other = host(tmp_path, [ctld(9, "--key-file=/etc/site.key", name="munged")])
    write(tmp_path, "/etc/site.key")
    msg = refusal(other)
    assert "munged pid 9" in msg and "/etc/site.key" in msg


def test_force_adopts_a_daemon_until_it_restarts(tmp_path):
    running = ctld(812, "-D", started=50.0)
    G.check_host(host(tmp_path, [running]), force=True)
    assert G.scan(host(tmp_path, [running])) == []
    restarted = ctld(812, "-D", started=99.0)  # same pid, another process
    assert "slurmctld pid 812" in refusal(host(tmp_path, [restarted]))


# --- up() runs the guard before it touches anything -------------------------------------


def test_up_refuses_before_taking_the_lock_or_running_a_step(tmp_path, monkeypatch):
    from slurmiso_sandbox import cluster, roots

    fake = tmp_path / "host"
    write(fake, KEY)
    root = tmp_path / "sbx"
    monkeypatch.setattr(cluster.os, "geteuid", lambda: 0)
    monkeypatch.setattr(cluster, "_up", lambda *a: pytest.fail("a step ran"))
    monkeypatch.setattr(roots, "slurm_version", lambda root: "22.05.8")
    with pytest.raises(SandboxError, match="munge.key"):
        cluster.up(str(root), host=G.Host(str(fake), lambda: []))
    assert not os.path.exists(f"{root}.lock") and not root.exists()
    ran: List[str] = []
    monkeypatch.setattr(cluster, "_up", lambda site, record: ran.append(site.root) or "done")
    assert cluster.up(str(root), force=True, host=G.Host(str(fake), lambda: [])) == "done"
    assert ran == [str(root)]


# --- the CLI when the sandbox is not installed -----------------------------------------


def test_cli_says_how_to_get_the_sandbox_when_it_is_absent(tmp_path, capsys, monkeypatch):
    import sys

    from slurmiso.cli import sandbox as cli_sandbox
    from slurmiso.cli.main import main

    # as on a wheel install: no sandbox imported yet, none on the path
    for name in [m for m in sys.modules if m.split(".")[0] == "slurmiso_sandbox"]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not os.path.isdir(
        os.path.join(p or ".", "slurmiso_sandbox"))])
    monkeypatch.setattr(cli_sandbox, "checkout_root", lambda package_file: "")
    assert main(["sandbox", "status", "--dir", str(tmp_path)]) == 6
    err = capsys.readouterr().err
    assert "development tool" in err and "slurmiso-sandbox" in err and "Traceback" not in err


def test_checkout_root_finds_the_sandbox_beside_the_package(tmp_path):
    from slurmiso.cli.sandbox import checkout_root

    write(tmp_path, "/slurmiso/__init__.py", b"")
    assert checkout_root(str(tmp_path / "slurmiso" / "__init__.py")) == ""  # a wheel install
    write(tmp_path, "/slurmiso_sandbox/__init__.py", b"")
    assert checkout_root(str(tmp_path / "slurmiso" / "__init__.py")) == str(tmp_path)


def test_cli_finds_the_sandbox_in_the_checkout_slurmiso_runs_from(tmp_path):
    """An editable install maps only the runtime package: 'slurmiso sandbox' run from anywhere
    still finds slurmiso_sandbox beside the slurmiso it imported."""
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    (tmp_path / "pkg").mkdir()
    os.symlink(os.path.join(repo, "slurmiso"), tmp_path / "pkg" / "slurmiso")
    code = ("import importlib.util\n"
            "assert importlib.util.find_spec('slurmiso_sandbox') is None, 'already on the path'\n"
            "from slurmiso.cli.sandbox import sandbox_module\n"
            "print(sandbox_module('layout').__file__)\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "pkg"))
    cp = subprocess.run([sys.executable, "-s", "-c", code], cwd=str(tmp_path), env=env,
                        capture_output=True, text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.strip() == os.path.join(repo, "slurmiso_sandbox", "layout.py")
