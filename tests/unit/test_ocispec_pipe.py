"""Whether a container's config.json shows the host's MPS pipe directory at the same path.

The fixtures follow the OCI runtime-spec mounts schema (config.md#mounts): a bundle like the
one ``runc spec`` writes, plus the mounts each case adds. The input is a user's, so anything
odd must come back as a refusal with its reason, never as reachable.
"""

from __future__ import annotations

import copy
from typing import Any, Dict, List

import pytest

from slurmiso.slurm.ocispec import MAX_MOUNTS, Reach, pipe_reachable

PIPE = "/run/slurmiso/mps/gpu0/u1000-t50-m20480/pipe"
MPS_ROOT = "/run/slurmiso/mps"

#: The default mounts of a minimal bundle (proc, /dev tmpfs, sysfs, ...).
BASE: Dict[str, Any] = {
    "ociVersion": "1.0.2",
    "process": {"args": ["sh"], "env": ["PATH=/usr/bin:/bin"], "cwd": "/"},
    "root": {"path": "rootfs", "readonly": True},
    "mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
         "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
        {"destination": "/sys", "type": "sysfs", "source": "sysfs",
         "options": ["nosuid", "noexec", "nodev", "ro"]},
    ],
}


def bundle(*extra: Dict[str, Any]) -> Dict[str, Any]:
    cfg = copy.deepcopy(BASE)
    cfg["mounts"].extend(extra)
    return cfg


def bind(dest: str, source: str = "", opts: List[str] = ["rbind", "rw"],  # noqa: B006
         kind: str = "bind") -> Dict[str, Any]:
    return {"destination": dest, "type": kind, "source": source or dest, "options": list(opts)}


@pytest.mark.parametrize("mount", [
    bind(MPS_ROOT),
    bind("/run/slurmiso"),
    bind(PIPE),
    bind("/run", opts=["bind"], kind="none"),  # runc's style: type none, option bind
    bind("/", opts=["rbind"]),
])
def test_a_bind_of_the_same_host_path_reaches(mount: Dict[str, Any]) -> None:
    verdict = pipe_reachable(bundle(mount), PIPE)
    assert verdict.reach is Reach.REACHABLE, verdict.reason
    assert verdict.reachable and not verdict.read_only


def test_read_only_bind_is_reachable_and_says_so() -> None:
    verdict = pipe_reachable(bundle(bind(MPS_ROOT, opts=["rbind", "ro"])), PIPE)
    assert verdict.reachable and verdict.read_only


def test_no_mount_means_the_image_own_directory() -> None:
    verdict = pipe_reachable(bundle(), PIPE)
    assert verdict.reach is Reach.NOT_MOUNTED
    assert PIPE in verdict.reason and "no mount" in verdict.reason


def test_a_bind_from_another_host_path_is_refused() -> None:
    verdict = pipe_reachable(bundle(bind(MPS_ROOT, source="/home/mallory/fake-mps")), PIPE)
    assert verdict.reach is Reach.OTHER_SOURCE
    assert "/home/mallory/fake-mps/gpu0" in verdict.reason


def test_a_tmpfs_over_the_path_is_refused() -> None:
    tmpfs = {"destination": "/run", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid"]}
    verdict = pipe_reachable(bundle(tmpfs), PIPE)
    assert verdict.reach is Reach.NOT_BIND and "tmpfs at /run" in verdict.reason


@pytest.mark.parametrize("later", [
    {"destination": "/run/slurmiso/mps/gpu0", "type": "tmpfs", "source": "tmpfs"},
    bind("/run/slurmiso", source="/tmp/elsewhere"),
])
def test_a_later_mount_hides_the_bind(later: Dict[str, Any]) -> None:
    verdict = pipe_reachable(bundle(bind(MPS_ROOT), later), PIPE)
    assert verdict.reach is Reach.HIDDEN
    assert not verdict.reachable


def test_an_earlier_mount_is_covered_by_a_later_bind() -> None:
    tmpfs = {"destination": "/run", "type": "tmpfs", "source": "tmpfs"}
    assert pipe_reachable(bundle(tmpfs, bind(MPS_ROOT)), PIPE).reachable


def test_a_deeper_unrelated_mount_does_not_matter() -> None:
    below = {"destination": PIPE + "/sub", "type": "tmpfs", "source": "tmpfs"}
    beside = bind("/run/slurmiso/mps-other", source="/tmp/x")
    assert pipe_reachable(bundle(bind(MPS_ROOT), below, beside), PIPE).reachable


@pytest.mark.parametrize("config", [
    [],
    "config",
    {"mounts": {"destination": MPS_ROOT}},
    {"mounts": ["/run/slurmiso"]},
    bundle({"destination": "run/slurmiso", "type": "bind", "source": MPS_ROOT}),
    bundle(bind("/run/slurmiso/../slurmiso")),
    bundle({"destination": MPS_ROOT, "type": "bind", "source": 7}),
    bundle({"destination": MPS_ROOT, "type": "bind", "source": MPS_ROOT, "options": "rbind"}),
    bundle({"type": "bind", "source": MPS_ROOT}),
    {"mounts": [bind(MPS_ROOT)] * (MAX_MOUNTS + 1)},
])
def test_hostile_config_is_refused_with_a_reason(config: Any) -> None:
    verdict = pipe_reachable(config, PIPE)
    assert verdict.reach is Reach.MALFORMED
    assert verdict.reason.startswith(f"MPS pipe directory {PIPE}: cannot read")


def test_a_relative_pipe_directory_is_never_reachable() -> None:
    assert pipe_reachable(bundle(bind("/")), "run/slurmiso/pipe").reach is Reach.MALFORMED


def test_no_mounts_key_at_all() -> None:
    assert pipe_reachable({"ociVersion": "1.0.2"}, PIPE).reach is Reach.NOT_MOUNTED


def test_text_form() -> None:
    import json

    from slurmiso.slurm.ocispec import MAX_CONFIG_BYTES, pipe_reachable_text

    assert pipe_reachable_text(json.dumps(bundle(bind(MPS_ROOT))), PIPE).reachable
    assert "not JSON" in pipe_reachable_text("{", PIPE).reason
    assert pipe_reachable_text("[" * 100000, PIPE).reach is Reach.MALFORMED
    huge = " " * (MAX_CONFIG_BYTES + 1)
    assert "not read" in pipe_reachable_text(huge, PIPE).reason
