"""NVIDIA_VISIBLE_DEVICES from the TaskProlog: what NVIDIA's container hooks put in a container
is the job's own devices, by UUID (NVIDIA Container Toolkit docs, "Specialized Configurations
with Docker", GPU Enumeration: UUIDs or indexes, all, none, or void for nothing at all)."""

from __future__ import annotations

from typing import List

from slurmiso.hooks.task_prolog import exports_of, lines_for, nvidia_visible
from slurmiso.state.record import JobRecord, RecordStatus, Resource, ResourceState

GPU = "GPU-12d58d57-51ed-531f-b73e-2fc74d219de6"
MIG = "MIG-4b7c2a31-90e1-5b2c-8d0f-6a1e3c9d7f20"
OLD_MIG = f"MIG-{GPU}/1/0"  # the R450 form: GPU UUID, GPU instance, compute instance


def _ready(*resources: Resource) -> JobRecord:
    return JobRecord("42", RecordStatus.READY, job_class="infer", resources=list(resources))


def test_each_mode_names_its_devices_by_uuid() -> None:
    assert nvidia_visible(_ready(Resource("gpu", ResourceState.READY, gpu=0, uuid=GPU))) == GPU
    assert nvidia_visible(_ready(Resource("mig-static", ResourceState.READY, gpu=0, uuid=MIG,
                                          gi=1, ci=0))) == MIG
    assert nvidia_visible(_ready(Resource("mig-dynamic", ResourceState.READY, gpu=0,
                                          uuid=OLD_MIG))) == OLD_MIG
    mps = Resource("mps", ResourceState.READY, gpu=0, gpu_uuid=GPU)
    assert nvidia_visible(_ready(mps, mps)) == GPU  # once, however many entries name it


def test_what_is_not_ready_or_not_a_uuid_is_never_named() -> None:
    pending = Resource("mig-dynamic", ResourceState.PENDING, gpu=0, uuid=MIG)
    hostile = Resource("gpu", ResourceState.READY, gpu=1, uuid="all,GPU-x y")
    assert nvidia_visible(_ready(pending, hostile)) == "void"
    assert nvidia_visible(_ready()) == "void"


def _exports(lines: List[str]) -> List[str]:
    return [ln for ln in lines if ln.startswith("export NVIDIA_VISIBLE_DEVICES=")]


def test_the_task_prolog_exports_it_for_ready_and_refused_jobs() -> None:
    ready = _ready(Resource("gpu", ResourceState.READY, gpu=0, uuid=GPU))
    assert _exports(lines_for(ready, "42")) == [f"export NVIDIA_VISIBLE_DEVICES={GPU}"]
    assert _exports(lines_for(None, "42")) == ["export NVIDIA_VISIBLE_DEVICES=void"]
    refused = JobRecord("42", RecordStatus.REFUSED, reason="no such class")
    assert exports_of(refused, "42")["NVIDIA_VISIBLE_DEVICES"] == "void"
