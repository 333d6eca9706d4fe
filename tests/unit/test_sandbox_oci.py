"""The sandbox's OCI bundle: crun's own default spec, made to show the sandbox's paths.

The input is a real ``crun spec --rootless`` output (tests/fixtures/oci/README.md). What the
bundle must hold is what slurmiso-oci-gate demands of any bundle, so the test asks the gate.
"""

from __future__ import annotations

import json
import os

from slurmiso.hooks.oci_gate import refusal
from slurmiso_sandbox import oci
from tests.unit.test_sandbox_cgroup_v2 import V2

SPEC = os.path.join(os.path.dirname(__file__), "..", "fixtures", "oci",
                    "crun-1.28-spec-rootless.json")


def _bundle() -> dict:
    with open(SPEC, encoding="utf-8") as fh:
        return oci.bundle_config(V2, json.load(fh))


def test_bundle_passes_the_gate_for_an_mps_job_of_the_sandbox() -> None:
    cfg = _bundle()
    pipe = os.path.join(V2.path("state", "n2"), "mps", "gpu0", "u1001-t50-m0", "pipe")
    exports = {"CUDA_MPS_PIPE_DIRECTORY": pipe, "SLURMISO_CLASS": "infer"}
    cfg["process"]["env"] += [f"{k}={v}" for k, v in exports.items()]
    assert refusal(cfg, True, exports) is None


def test_bundle_keeps_the_step_cgroup_and_the_nodes_network() -> None:
    cfg = _bundle()
    kinds = [n["type"] for n in cfg["linux"]["namespaces"]]
    assert "user" in kinds and "mount" in kinds and "network" not in kinds
    assert "resources" not in cfg["linux"]  # the step's cgroup holds the limits
    assert all(m["destination"] != "/sys/fs/cgroup" for m in cfg["mounts"])
    assert cfg["root"]["path"] == os.path.join(V2.path("oci", "bundle"), "rootfs")


def test_device_stand_ins_stay_usable_and_system_dirs_read_only() -> None:
    binds = {m["destination"]: m["options"] for m in _bundle()["mounts"] if m["type"] == "bind"}
    assert "nodev" not in binds[V2.root]  # the GPU stand-ins: the device cgroup fences them
    assert {"ro", "nodev"} <= set(binds["/usr"]) and {"ro", "nodev"} <= set(binds["/etc"])


def test_oci_conf_keeps_only_the_keys_the_sites_slurmstepd_parses() -> None:
    """22.05 fails its parse on a key it does not know: the host's oci.conf has the gate
    (which then refuses every container there) and none of 23.02's keys."""
    gate = f'RunTimeRun="exec {V2.path("bin", "slurmiso-oci-gate")} %n %b crun'
    new = oci.render_oci_conf(V2, (26, 5, 5))
    old = oci.render_oci_conf(V2, (22, 5, 8))
    assert gate in new and gate in old
    assert "\nEnvExclude=" in new and "\nIgnoreFileConfigJson=" in new
    assert "\nEnvExclude=" not in old and "\nIgnoreFileConfigJson=" not in old
    assert "RunTimeQuery=" in old and "RunTimeDelete=" in old
    assert "/oci/run/%U/" in new and "%U" not in old  # 22.05 dies on %U: the user's name
