"""Which jobs have a process in another network namespace, through Slurm's cgroup for them.

The trees are laid out as Slurm's cgroup/v2 plugin makes them (slurmiso/host/job_cgroups.py:
``<slice>/<node>_slurmstepd.scope/job_<id>/step_*/user/task_*``), and ``/proc`` is a stand-in
whose ``<pid>/ns/net`` files differ by inode as namespaces do. The live test reads this
process's own namespace from the real ``/proc``.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

from slurmiso.agent import netns


def _tree(tmp_path: Any, jobs: Dict[str, List[str]]) -> str:
    root = tmp_path / "cg"
    (root).mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    scope = root / "system.slice" / "n1_slurmstepd.scope"
    for job, pids in jobs.items():
        task = scope / f"job_{job}" / "step_0" / "user" / "task_0"
        task.mkdir(parents=True)
        (scope / f"job_{job}" / "cgroup.procs").write_text("")
        (task / "cgroup.procs").write_text("".join(f"{p}\n" for p in pids))
    return str(root)


def _proc(tmp_path: Any, spaces: Dict[str, str]) -> str:
    """pid -> namespace name; equal names share one file (one inode)."""
    proc = tmp_path / "proc"
    files: Dict[str, Any] = {}
    for pid, space in spaces.items():
        (proc / pid / "ns").mkdir(parents=True)
        if space not in files:
            files[space] = proc / f"ns-{space}"
            files[space].write_text(space)
        os.link(files[space], proc / pid / "ns" / "net")
    return str(proc)


def test_a_job_with_a_process_in_its_own_namespace_is_named(tmp_path: Any) -> None:
    root = _tree(tmp_path, {"41": ["100", "101"], "42": ["200"], "43": ["300"]})
    proc = _proc(tmp_path, {"self": "node", "100": "node", "101": "box", "200": "node"})
    # 43's process is gone (no /proc entry): not a namespace of its own
    assert netns.elsewhere(["41", "42", "43", "44"], {}, "n1", root, proc) == {"41"}


def test_only_the_jobs_asked_about_are_read(tmp_path: Any) -> None:
    root = _tree(tmp_path, {"41": ["101"], "42": ["201"]})
    proc = _proc(tmp_path, {"self": "node", "101": "box", "201": "box2"})
    assert netns.elsewhere(["42"], {}, "n1", root, proc) == {"42"}
    assert netns.elsewhere([], {}, "n1", root, proc) == set()


def test_an_unreadable_own_namespace_names_nobody(tmp_path: Any) -> None:
    root = _tree(tmp_path, {"41": ["101"]})
    proc = _proc(tmp_path, {"101": "box"})  # no "self"
    assert netns.elsewhere(["41"], {}, "n1", root, proc) == set()


def test_the_live_proc_gives_this_process_a_namespace() -> None:
    assert netns.netns_of("self") == netns.netns_of(str(os.getpid())) is not None
