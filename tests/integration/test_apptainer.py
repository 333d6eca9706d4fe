"""Jobs in Apptainer containers keep their share (issue 37): Debian's apptainer (1.4.5 in the
sid root, Slurm 26.05 in CI), started by the job itself (``srun apptainer exec``), with the
binds ``slurmiso gen apptainer-binds`` writes for the node.

Apptainer needs no privilege here: it runs unprivileged in a user namespace, and its
processes stay in the step's task cgroup. The image is the sandbox's OCI rootfs skeleton with the root's ``/usr`` bound read-only (no
registry, no network); the sandbox's device stand-ins directory is bound where a real node's
``/dev`` would be bound by apptainer's defaults.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from typing import Any, Dict, List

import pytest

from slurmiso_sandbox import layout as L
from tests.integration.test_fences import POOLS, PROBE, _probe

#: Where Debian's package puts it, inside the sandbox's root.
APPTAINER = "/usr/bin/apptainer"
HOSTNAME = "sbx-apptainer"


@pytest.fixture
def image(sandbox: Any) -> str:
    """The image directory; skipped where the sandbox's root has no apptainer."""
    rootfs = sandbox.path("oci", "bundle", "rootfs")
    root = _root(sandbox)
    if not root or not os.path.exists(os.path.join(root, APPTAINER.lstrip("/"))) \
            or not os.path.isdir(rootfs):
        pytest.skip("apptainer runs in the sandbox's Debian sid root (make integration "
                    "SLURM=26.05 CGROUP=v2, as CI does): Debian 12, the host, has no "
                    "apptainer package")
    return rootfs


def _root(sandbox: Any) -> str:
    """The sandbox's Debian root ("" for the host's Slurm)."""
    from slurmiso_sandbox import roots

    version = sandbox.slurm_version() if sandbox.in_root else None
    release = f"{version[0]}.{version[1]:02d}" if version else ""
    return roots.root_path(release) if release in roots.SUITES else ""


def generated_binds(node: str) -> str:
    """What ``slurmiso gen apptainer-binds`` asks a job to export on ``node``. Apptainer
    refuses a bind whose source is missing (measured: "mount source ... doesn't exist"): the
    prolog makes the MPS root on every node of a config with an MPS pool."""
    cp = subprocess.run([sys.executable, "-m", "slurmiso", "gen", "apptainer-binds",
                         "--node", node], capture_output=True, text=True, timeout=60,
                        check=True)
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("# export APPTAINER_BIND=")]
    assert len(lines) == 1, cp.stdout
    return lines[0].split("=", 1)[1]


def _apptainer(sandbox: Any, image: str, node: str, binds: str) -> str:
    """The ``srun`` prefix of a job's containerised step."""
    extra = f"/usr:/usr:ro,{sandbox.path('dev')}"
    both = f"{binds},{extra}" if binds else extra
    return (f"APPTAINER_BIND={both} srun {APPTAINER} exec --uts --hostname {HOSTNAME} "
            f"{image} ")


LOOK = ("import json, os; e = os.environ; p = e.get('CUDA_MPS_PIPE_DIRECTORY', ''); "
        "print('LOOK ' + json.dumps({'env': {k: v for k, v in e.items() if k.startswith("
        "('CUDA_', 'SLURMISO_'))}, 'host': os.uname().nodename, "
        "'pipe_seen': bool(p) and os.path.isdir(p)}))")


def _looks(out: str) -> List[Dict[str, Any]]:
    return [json.loads(ln[5:]) for ln in out.splitlines() if ln.startswith("LOOK ")]


@pytest.mark.parametrize("partition,node,gres,qos", POOLS, ids=[p[0] for p in POOLS])
def test_an_apptainer_step_gets_exactly_the_bare_steps_share_environment(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any, image: str,
    partition: str, node: str, gres: str, qos: str,
) -> None:
    """The same job runs the same look bare and through apptainer: the TaskProlog's exports
    (the GPU, the MPS daemon and limits, the class) reach the program inside unchanged, and
    an MPS client sees its daemon's pipe directory through the generated bind.

    The device fence probe of test_fences.py cannot be run through apptainer here: it mounts
    user binds ``nodev``, and the sandbox's device stand-ins live under the sandbox dir, not
    under ``/dev`` (which apptainer's ``mount dev`` binds on a real node). Its processes
    stay in the step's task cgroup, where the fence is."""
    binds = generated_binds(node)  # on every node: the prolog made the MPS root there
    script = (f'#!/bin/bash\nsrun /usr/bin/python3 -c "{LOOK}"\n'
              f'{_apptainer(sandbox, image, node, binds)}/usr/bin/python3 -c "{LOOK}"\n')
    job = submit(script, "-p", partition, gres, f"--qos={qos}", user=L.TEST_USER)
    wait_for(job, timeout=90)
    looks = _looks(job_output(job))
    assert len(looks) == 2, job_output(job)
    bare, inside = looks
    assert inside["host"] == HOSTNAME and bare["host"] != HOSTNAME, looks
    assert "SLURMISO_CLASS" in bare["env"] and inside["env"] == bare["env"], looks
    if partition == "mps":
        assert bare["pipe_seen"] and inside["pipe_seen"], looks


def test_without_the_generated_bind_an_mps_client_cannot_reach_its_daemon(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any, image: str,
) -> None:
    """What the generated line is for: an image run without it has the job's
    CUDA_MPS_PIPE_DIRECTORY (apptainer passes the environment on) but no such directory,
    so CUDA would not use the job's daemon. The device fence still holds (test above)."""
    tag = os.path.join(sandbox.jobs_dir, f"appt-nobind-{uuid.uuid4().hex[:8]}")
    script = PROBE.format(tag=tag, python="/usr/bin/python3", dev=sandbox.path("dev", "n2"),
                          srun=_apptainer(sandbox, image, "n2", "")).replace("-ge 2", "-ge 1")
    job = submit(script, "-p", "mps", "--gres=mps:50", "--qos=infer", user=L.TEST_USER)
    wait_for(job, timeout=90)
    probe = _probe(sandbox, job_output, job)
    assert probe["host"] == HOSTNAME and probe["pipe"], probe
    assert probe["pipe_seen"] is False, probe
