"""Sandbox of another Slurm release: release names, cached roots, wrappers, moved ports."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any, List

import pytest

from slurmiso.errors import SandboxError
from slurmiso_sandbox import layout as L
from slurmiso_sandbox import roots as R


@pytest.mark.parametrize("given,short", [("24.11", "24.11"), ("24.11.5", "24.11"),
                                         ("26.05", "26.05"), ("22.05", "22.05")])
def test_release_names(given: str, short: str) -> None:
    assert R.check_version(given) == short


@pytest.mark.parametrize("bad", ["23.02", "latest", "", "24", "../24.11"])
def test_unknown_release_is_one_clear_error(bad: str) -> None:
    with pytest.raises(SandboxError) as err:
        R.check_version(bad)
    assert "22.05, 24.11, 26.05" in (err.value.hint or "")


def test_suites_are_the_debian_releases_that_ship_them() -> None:
    assert R.suite_for("24.11") == "trixie" and R.suite_for("26.05.5") == "sid"


def test_root_is_stale_when_its_recipe_changed(tmp_path: Path) -> None:
    root = tmp_path / "trixie"
    root.mkdir()
    assert not R.root_is_current(str(root), "trixie")  # no stamp: build it
    (root / R.STAMP).write_text(json.dumps({"recipe": R.recipe("trixie")}))
    assert R.root_is_current(str(root), "trixie")
    old = dict(R.recipe("trixie"), packages=["slurmd"])
    (root / R.STAMP).write_text(json.dumps({"recipe": old}))
    assert not R.root_is_current(str(root), "trixie")
    (root / R.STAMP).write_text("{broken")
    assert not R.root_is_current(str(root), "trixie")


def test_recipe_names_no_mirror_and_builds_the_spank_plugins() -> None:
    text = Path(R.__file__).read_text()
    assert "http://" not in text and "https://" not in text
    assert {"libslurm-dev", "gcc", "make", "libc6-dev", "python3-yaml"} <= set(R.PACKAGES)


def _fake_root(tmp_path: Path) -> R.Root:
    for d in ("usr/bin", "usr/sbin"):
        (tmp_path / d).mkdir(parents=True)
    for name in R.CLIENTS:
        where = "usr/sbin" if name == "runuser" else "usr/bin"
        (tmp_path / where / name).write_text("")
    return R.Root(str(tmp_path), "24.11")


def test_wrapper_enters_the_root_from_outside_and_runs_directly_inside(tmp_path: Path) -> None:
    root = _fake_root(tmp_path)
    text = R.client_wrapper(root, "sbatch")
    assert f"[ -d {tmp_path}/usr ] || exec /usr/bin/sbatch \"$@\"" in text
    assert f"exec /usr/sbin/chroot {tmp_path} /bin/sh -c" in text
    assert R.client_wrapper(root, "runuser").count("/usr/sbin/runuser") == 2
    # inside the root the root path does not exist: the wrapper runs the command itself
    script = tmp_path / "sbatch"
    script.write_text(text.replace("/usr/bin/sbatch", "/bin/echo"))
    gone = R.Root(str(tmp_path / "elsewhere"), "24.11")
    script.write_text(R.client_wrapper(root, "sbatch").replace(str(tmp_path), gone.path)
                      .replace("/usr/bin/sbatch", "/bin/echo"))
    out = subprocess.run(["/bin/sh", str(script), "a b", "c"], capture_output=True, text=True)
    assert out.stdout == "a b c\n"


def test_missing_command_in_root_says_how_to_rebuild(tmp_path: Path) -> None:
    with pytest.raises(SandboxError) as err:
        R.Root(str(tmp_path), "26.05").which("sbatch")
    assert "rebuilds" in (err.value.hint or "")


def test_mounts_under_reads_mountinfo() -> None:
    assert "/proc" in R.mounts_under("/proc")
    assert R.mounts_under("/nonexistent-slurmiso-path") == []


def test_copy_checkout_copies_sources_only_and_reports_changes(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "slurmiso" / "__pycache__").mkdir(parents=True)
    (src / "slurmiso" / "a.py").write_text("x = 1\n")
    (src / "slurmiso" / "__pycache__" / "a.pyc").write_text("")
    (src / "spank").mkdir()
    (src / "spank" / "slurmiso.so").write_text("built for another release")
    dest = tmp_path / "dest"
    assert R.copy_checkout(str(src), str(dest))
    assert (dest / "slurmiso" / "a.py").read_text() == "x = 1\n"
    assert not (dest / "slurmiso" / "__pycache__").exists()
    assert not (dest / "spank" / "slurmiso.so").exists()  # rebuilt in the root, never copied
    assert not R.copy_checkout(str(src), str(dest))


def test_moved_port_base_moves_every_port() -> None:
    base = L.Site(root="/srv/sbx", host="h", python="/usr/bin/python3")
    moved = replace(base, port_base=17800, first_job_id=2411000, ignore_systemd=True,
                    nodes=tuple(replace(n, port=n.port + 1000) for n in L.NODES))
    conf = L.render_slurm_conf(moved)
    assert "SlurmctldPort=17817" in conf and "AccountingStoragePort=17819" in conf
    assert "FirstJobId=2411000" in conf and "Port=17821" in conf
    assert "StoragePort=17806" in L.render_slurmdbd_conf(moved)
    assert "IgnoreSystemd=yes" in L.render_cgroup_conf(moved)
    # the default site renders exactly as before: no FirstJobId, no IgnoreSystemd on v1
    assert "FirstJobId" not in L.render_slurm_conf(base)
    assert "SlurmctldPort=16817" in L.render_slurm_conf(base)
    assert "IgnoreSystemd" not in L.render_cgroup_conf(base)
    assert moved.exe("/usr/bin/sinfo") == ["/usr/bin/sinfo"]
    assert replace(moved, chroot="/r").exe("/usr/bin/sinfo") == [
        "/usr/sbin/chroot", "/r", "/usr/bin/sinfo"]


def test_port_base_from_env_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmiso_sandbox import sites

    monkeypatch.setenv("SLURMISO_SANDBOX_PORT_BASE", "17800")
    assert sites.port_base() == 17800
    for bad in ("80", "x", "70000"):
        monkeypatch.setenv("SLURMISO_SANDBOX_PORT_BASE", bad)
        with pytest.raises(SandboxError):
            sites.port_base()
    monkeypatch.delenv("SLURMISO_SANDBOX_PORT_BASE")
    assert sites.port_base() == L.PORT_BASE
    assert sites.port_base(18800) == 18800


def test_a_dir_made_for_one_release_is_not_reused_for_another(tmp_path: Path) -> None:
    from slurmiso_sandbox import sites

    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "slurm.conf").write_text("ClusterName=slurmiso-sbx\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "sandbox.json").write_text(json.dumps({"slurm": "24.11"}))
    assert sites.choose_release(str(tmp_path), None) == "24.11"  # recorded
    assert sites.choose_release(str(tmp_path), "24.11.5") == "24.11"
    with pytest.raises(SandboxError) as err:
        sites.choose_release(str(tmp_path), "26.05")
    assert "--purge" in (err.value.hint or "")
    assert os.path.exists(tmp_path / "etc" / "slurm.conf")


def test_build_steps_keep_their_output_and_fail_with_the_log_named(tmp_path: Path) -> None:
    log = str(tmp_path / "trixie.log")
    R._logged(["/bin/echo", "unpacking"], log, env={"PATH": "/usr/bin:/bin"}, timeout=10)
    assert "$ /bin/echo unpacking\nunpacking\n" in Path(log).read_text()
    with pytest.raises(SandboxError) as err:
        R._logged(["/bin/sh", "-c", "echo E: no network >&2; exit 100"], log,
                  env={"PATH": "/usr/bin:/bin"}, timeout=10)
    assert log in err.value.message and "E: no network" in Path(log).read_text()


def test_stale_root_with_mounts_under_it_is_never_removed(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMISO_SLURM_ROOTS", str(tmp_path))
    (tmp_path / "trixie" / "proc").mkdir(parents=True)
    monkeypatch.setattr(R, "mounts_under", lambda p: [p + "/proc"] if p.endswith("trixie")
                        else [])
    with pytest.raises(SandboxError) as err:
        R.ensure_root("24.11")
    assert "mounts under it" in err.value.message
    assert (tmp_path / "trixie" / "proc").is_dir()


def test_a_missing_debootstrap_is_installed_first(tmp_path: Any, monkeypatch: Any) -> None:
    """A fresh machine has no debootstrap: building a root installs it (CI's 26.05 run)."""
    from slurmiso_sandbox import packages

    tool = tmp_path / "debootstrap"
    monkeypatch.setattr(R, "DEBOOTSTRAP", str(tool))
    asked: List[List[str]] = []

    def install(names: List[str]) -> str:
        asked.append(list(names))
        tool.write_text("#!/bin/sh\n")
        return "installed"

    monkeypatch.setattr(packages, "install_named", install)
    R.ensure_debootstrap(str(tmp_path / "log"))
    assert asked == [["debootstrap"]]
    R.ensure_debootstrap(str(tmp_path / "log"))  # present now: nothing asked again
    assert asked == [["debootstrap"]]


def test_debootstrap_still_missing_after_install_is_one_clear_error(tmp_path: Any,
                                                                    monkeypatch: Any) -> None:
    from slurmiso_sandbox import packages

    monkeypatch.setattr(R, "DEBOOTSTRAP", str(tmp_path / "none"))
    monkeypatch.setattr(packages, "install_named", lambda names: "installed")
    with pytest.raises(SandboxError, match="debootstrap"):
        R.ensure_debootstrap(str(tmp_path / "log"))


def test_the_test_user_keeps_no_subordinate_ids_in_a_root(tmp_path: Any) -> None:
    """Rootless crun maps subordinate ids where newuidmap exists (apptainer pulls it in):
    the sandbox's containers map the job's user alone."""
    from slurmiso_sandbox.packages import drop_subids

    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "subuid").write_text("sbxuser:100000:65536\nother:165536:65536\n")
    (etc / "subgid").write_text("other:165536:65536\n")
    assert drop_subids(str(tmp_path), "sbxuser") == "dropped sbxuser's subuid"
    assert (etc / "subuid").read_text() == "other:165536:65536\n"
    assert drop_subids(str(tmp_path), "sbxuser") == ""  # idempotent
    assert drop_subids("", "sbxuser") == drop_subids("/", "sbxuser") == ""  # never the host's
