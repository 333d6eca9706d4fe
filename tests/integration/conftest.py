"""Integration tests run against the real local Slurm sandbox (``slurmiso sandbox up``).

Every test in this folder is marked ``sandbox``. The session fixture ``sandbox`` brings the
cluster up once (idempotent: fast when it already runs) and exports ``SLURM_CONF`` and
``SLURMISO_CONFIG`` for the session; the ``submit``, ``wait_for`` and ``job_output`` fixtures
are the helpers tests use::

    def test_gpu_job(submit, wait_for, job_output):
        job = submit("#!/bin/bash\\necho $CUDA_VISIBLE_DEVICES\\n", "-p", "gpu", "--gres=gpu:1")
        wait_for(job)                      # COMPLETED within 60 s, else fails with details
        assert job_output(job).strip() == "0"

After each test the queue is emptied (jobs cancelled, epilogs finished) so tests do not see
each other's jobs. The cluster is left running at the end; ``slurmiso sandbox down`` stops it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, Iterator, List

import pytest

from slurmiso_sandbox.client import TERMINAL, SandboxClient, session_lock  # noqa: F401

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SANDBOX_DIR = os.environ.get("SLURMISO_SANDBOX_DIR", "/var/lib/slurmiso-sandbox")

Sandbox = SandboxClient  # the tests' name for it


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    for item in items:
        if str(item.fspath).startswith(HERE + os.sep):
            item.add_marker(pytest.mark.sandbox)


def _bring_up(root: str) -> None:
    env = dict(os.environ, PYTHONPATH=REPO)
    release = os.environ.get("SLURMISO_SANDBOX_SLURM")  # make test SLURM=24.11
    argv = [sys.executable, "-m", "slurmiso", "sandbox", "up", "--dir", root]
    cgroup = os.environ.get("SLURMISO_SANDBOX_CGROUP")  # make test CGROUP=v2
    argv += ["--cgroup", cgroup] if cgroup else []
    cp = subprocess.run(argv + (["--slurm", release] if release else []),
                        env=env, text=True, capture_output=True, timeout=900, cwd=REPO)
    if cp.returncode != 0:
        pytest.fail(f"slurmiso sandbox up failed ({cp.returncode}):\n{cp.stdout}\n{cp.stderr}",
                    pytrace=False)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    """The local Slurm sandbox, up (started once per session, held by this session alone)."""
    if os.geteuid() != 0:
        pytest.skip("sandbox tests need root: they start slurmctld/slurmd/slurmdbd/MariaDB "
                    "and create device nodes (run: sudo pytest -m sandbox)")
    with session_lock(SANDBOX_DIR):
        yield from _sandbox_session()


def _sandbox_session() -> Iterator[Sandbox]:
    _bring_up(SANDBOX_DIR)
    jobs_dir = tempfile.mkdtemp(prefix="slurmiso-sbx-jobs-")
    os.chmod(jobs_dir, 0o1777)  # jobs of the non-root test user write their output here too
    sbx = Sandbox(SANDBOX_DIR, jobs_dir)
    sbx.clear_queue()  # jobs a crashed earlier session left behind
    sbx.idle_gpus()  # ... and the simulated load it injected
    # PATH and SLURMISO_SLURM_BIN change only for a sandbox of another Slurm release.
    keys = ("SLURM_CONF", "SLURMISO_CONFIG", "PATH", "SLURMISO_SLURM_BIN")
    saved = {k: os.environ.get(k) for k in keys}
    os.environ.update({k: sbx.env[k] for k in keys if k in sbx.env})
    yield sbx
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    shutil.rmtree(jobs_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _empty_queue(request: pytest.FixtureRequest) -> Iterator[None]:
    """Leave no job behind for the next test (only where the test used the sandbox)."""
    yield
    if "sandbox" in request.fixturenames:
        sbx: Sandbox = request.getfixturevalue("sandbox")
        if os.path.exists(sbx.slurm_conf):
            sbx.clear_queue()


@pytest.fixture
def submit(sandbox: Sandbox) -> Callable[..., str]:
    return sandbox.submit


@pytest.fixture
def wait_for(sandbox: Sandbox) -> Callable[..., str]:
    return sandbox.wait_for


@pytest.fixture
def job_output(sandbox: Sandbox) -> Callable[[str], str]:
    return sandbox.job_output


@pytest.fixture
def sim_state(sandbox: Sandbox) -> Callable[[str], str]:
    """Path of a node's simulated GPU state file."""
    return lambda node: sandbox.path("sim", f"{node}.json")

