"""A shared MPS v3 server per GPU (``mps_server: shared``, issue 35 item 1) on a simulated
node: one ``-p 3 -m`` daemon, a namespace per job with its class's terms, doors closed to
everyone else, exact teardown and reconcile. Clients run as other uids, as jobs do."""

from __future__ import annotations

import os
import stat
from typing import Any, Dict, List

import pytest
import yaml

from slurmiso.config import load_config
from slurmiso.config.model import MpsPriority, MpsServer
from slurmiso.errors import ConfigError, NodeFault
from slurmiso.isolation import mps_shared, mps_sim
from slurmiso.isolation.base import Context, ReconcileContext
from slurmiso.isolation.mps import HANDLER, MpsIsolation
from slurmiso.isolation.mps_daemon import SimMpsControl
from slurmiso.isolation.mps_protocol import MpsProtocol
from slurmiso.state import Journal
from slurmiso.values import replace
from tests.hookctx import make_context, write_config
from tests.unit.test_mps_enforcement import JOB_UID, STRANGER_UID, as_uid, needs_root, node

__all__ = ["node"]  # the fixture, used by name


def start(where: str, job_id: str, cls: str, uid: int = JOB_UID,
          handler: MpsIsolation = HANDLER) -> Context:
    ctx = make_context(where, "mps", job_id=job_id, cls=cls, uid=uid)
    ctx.pool = replace(ctx.pool, mps_server=MpsServer.SHARED)
    ctx.record.job_class = cls  # the prolog's doing
    ctx.save()
    handler.setup(ctx)
    return ctx


def pipe(where: str, gpu: int = 0) -> str:
    return mps_shared.shared_paths(os.path.join(where, "state"), gpu)["pipe"]


def reach(ctx: Context, uid: int, **changes: str) -> Dict[str, Any]:
    """What a client of ``uid`` with the job's environment, changed, gets from MPS."""
    env = dict(ctx.record.env, **changes)
    return as_uid(uid, lambda: mps_sim.connect(env))


def events(ctx: Context, name: str) -> List[Dict[str, Any]]:
    return list(Journal(ctx.config.paths.journal).read(events={name}))


def namespace(ctx: Context) -> str:
    (entry,) = [r for r in ctx.record.resources if r.kind == "mps"]
    name = mps_shared.namespace_of(entry.extra)
    assert name
    return name


@needs_root
def test_two_users_classes_share_one_server_each_in_its_namespace(node: str) -> None:
    infer = start(node, "11", "infer", uid=JOB_UID)
    train = start(node, "12", "train", uid=STRANGER_UID)
    control = SimMpsControl()
    assert control.running(pipe(node)) is not None
    assert len(events(infer, "mps-daemon-started")) == 1  # one daemon for both
    got_i, got_t = reach(infer, JOB_UID)["ok"], reach(train, STRANGER_UID)["ok"]
    assert (got_i["server"], got_i["namespace"], got_i["client_priority"]) == (
        mps_shared.SERVER, namespace(infer), 0)
    assert (got_t["server"], got_t["namespace"], got_t["client_priority"],
            got_t["active_thread_percentage"], got_t["pinned_device_mem_limit_mb"]) == (
        mps_shared.SERVER, namespace(train), 1, 60.0, {"0": 30720})
    rows = {r["name"]: r for r in mps_shared.namespaces(control, pipe(node))}
    assert rows[namespace(train)]["client-priority"] == "1"
    assert rows[namespace(infer)]["client-priority"] == "0"


@needs_root
def test_a_training_job_cannot_leave_its_namespace_or_raise_its_threads(node: str) -> None:
    infer = start(node, "21", "infer", uid=JOB_UID)
    train = start(node, "22", "train", uid=STRANGER_UID)
    top = pipe(node)
    for door in (infer.record.env["CUDA_MPS_PIPE_DIRECTORY"], top,
                 os.path.join(top, mps_shared.SERVER)):
        got = reach(train, STRANGER_UID, CUDA_MPS_PIPE_DIRECTORY=door)
        assert got.get("error") == "PermissionError", (door, got)
    raised = reach(train, STRANGER_UID, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="100")["ok"]
    assert raised["active_thread_percentage"] == 60.0  # the namespace's overrides the job's
    # NVIDIA: the client's own priority wins over its namespace's; docs/mps-v3.md says so
    assert reach(train, STRANGER_UID, CUDA_MPS_CLIENT_PRIORITY="0")["ok"]["client_priority"] == 0


@needs_root
def test_doors_and_namespace_directories_are_closed(node: str) -> None:
    train = start(node, "31", "train", uid=STRANGER_UID)
    top = pipe(node)
    assert stat.S_IMODE(os.stat(top).st_mode) == 0o711
    for sock in (os.path.join(top, "control"),
                 os.path.join(top, mps_shared.SERVER, "control")):
        st = os.stat(sock)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o600), sock
    folder = train.record.env["CUDA_MPS_PIPE_DIRECTORY"]
    st = os.stat(folder)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (STRANGER_UID, 0o700)
    assert mps_shared.NAMESPACE_RE.fullmatch(os.path.basename(folder))
    # a second job of the same id never reuses a name
    assert mps_shared.new_namespace("31") != mps_shared.new_namespace("31")


@needs_root
def test_teardown_closes_the_namespace_and_the_last_stops_the_daemon(node: str) -> None:
    a = start(node, "41", "infer")
    b = start(node, "42", "train", uid=STRANGER_UID)
    control = SimMpsControl()
    HANDLER.teardown(a)
    names = [r["name"] for r in mps_shared.namespaces(control, pipe(node))]
    assert namespace(a) not in names and namespace(b) in names
    assert not os.path.exists(a.record.env["CUDA_MPS_PIPE_DIRECTORY"])
    pid = control.running(pipe(node))
    assert pid is not None
    HANDLER.teardown(b)
    assert control.running(pipe(node)) is None
    assert not os.path.exists(os.path.dirname(pipe(node)))
    assert [e["reason"] for e in events(b, "mps-daemon-stopped")] == ["last client job 42 ended"]


@needs_root
def test_a_dead_daemon_comes_back_with_the_live_jobs_namespaces(node: str) -> None:
    a = start(node, "51", "train", uid=STRANGER_UID)
    control = SimMpsControl()
    old = control.running(pipe(node))
    assert old is not None
    os.kill(old, 9)
    b = start(node, "52", "infer")
    assert control.running(pipe(node)) not in (None, old)
    names = [r["name"] for r in mps_shared.namespaces(control, pipe(node))]
    assert namespace(a) in names and namespace(b) in names
    assert reach(a, STRANGER_UID)["ok"]["client_priority"] == 1
    assert any("had died" in w for w in (a.state.read_job("51") or a.record).warnings)


@needs_root
def test_reconcile_closes_namespaces_of_dead_jobs_and_stops_an_idle_daemon(node: str) -> None:
    a = start(node, "61", "train", uid=STRANGER_UID)
    b = start(node, "62", "infer")
    control = SimMpsControl()
    a.state.delete_job("61")
    ctx = ReconcileContext(config=a.config, pool=a.pool, state=a.state, journal=a.journal,
                           backend=a.backend)
    fixes = HANDLER.reconcile(ctx)
    assert any(namespace(a) in f for f in fixes), fixes
    names = [r["name"] for r in mps_shared.namespaces(control, pipe(node))]
    assert names == ["default", namespace(b)]
    b.state.delete_job("62")
    HANDLER.reconcile(ctx)
    assert control.running(pipe(node)) is None
    assert not os.path.exists(os.path.dirname(pipe(node)))


class _NoV3(SimMpsControl):
    def protocol(self) -> MpsProtocol:
        return MpsProtocol(False, "the MPS control binary's -p 3 -h failed (exit 1)")


def test_without_mps_v3_the_pool_falls_back_to_per_class_daemons_and_says_so(
        node: str) -> None:
    handler = MpsIsolation(control_factory=lambda backend: _NoV3())
    ctx = start(node, "71", "train", uid=os.getuid(), handler=handler)
    assert not os.path.exists(pipe(node))
    (entry,) = [r for r in ctx.record.resources if r.kind == "mps"]
    assert mps_shared.namespace_of(entry.extra) is None
    assert [e["arrangement"] for e in events(ctx, "mps-arrangement")] == ["per-class"]
    assert any("no MPS v3" in w for w in ctx.record.warnings)
    handler.teardown(ctx)


@pytest.mark.parametrize("name", ["job_1_0123456789abcdef", "job_12_3_fedcba9876543210"])
def test_namespace_names_are_valid_v3_names(name: str) -> None:
    assert mps_shared.NAMESPACE_RE.fullmatch(name)
    assert len(name) <= 64


@pytest.mark.parametrize("name", ["default", "job_1", "../x", "job_1_0123456789ABCDEF", ""])
def test_names_slurmiso_did_not_make_are_never_deleted(name: str) -> None:
    assert mps_shared.namespace_of({"namespace": name}) is None


# -- the config ------------------------------------------------------------------------------


def _config(tmp: str, mode: str = "mps", pool: Any = None, infer: Any = None) -> str:
    path = write_config(tmp, mode)
    with open(path) as fh:
        data = yaml.safe_load(fh)
    data["pools"][0].update(pool or {})
    data["classes"][0].setdefault("mps", {}).update(infer or {})
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    return path


@pytest.mark.parametrize("mode,pool,infer,key,error", [
    ("timeslice", {"mps_server": "shared"}, None, "pools[0].mps_server",
     "only an MPS pool has an MPS server (pool p is timeslice): remove it, or set mode: mps"),
    ("mps", {"mps_server": "one"}, None, "pools[0].mps_server",
     "'one' is not allowed (allowed: per-class, shared)"),
    ("mps", None, {"priority": "high"}, "classes[0].mps.priority",
     "'high' is not allowed (allowed: normal, below-normal)"),
    ("mps", None, {"priority": "normal"}, "classes[0].mps.priority",
     "class 'infer' asks for MPS priority normal, but pool(s) p run a daemon per class, where "
     "no priority orders one class against another: set mps_server: shared on those pools, "
     "or remove priority"),
])
def test_check_config_refuses_what_it_cannot_honour(
        tmp_path: Any, mode: str, pool: Any, infer: Any, key: str, error: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(str(tmp_path), mode, pool, infer))
    assert error in str(err.value) and key in str(err.value)


def test_a_shared_pool_loads_with_its_priorities_and_says_what_it_shares(
        tmp_path: Any) -> None:
    cfg = load_config(_config(str(tmp_path), "mps", {"mps_server": "shared"},
                              {"priority": "below-normal"}))
    assert cfg.pools[0].mps_server is MpsServer.SHARED
    infer, train = cfg.job_class("infer"), cfg.job_class("train")
    assert infer is not None and train is not None
    assert infer.mps.priority_for(infer.preemptible) is MpsPriority.BELOW_NORMAL
    assert train.mps.priority_for(train.preemptible) is MpsPriority.BELOW_NORMAL
    assert any("multi-user mode" in w for w in cfg.warnings)
    (tmp_path / "d").mkdir()
    default = load_config(_config(str(tmp_path / "d"), "mps"))
    assert default.pools[0].mps_server is MpsServer.PER_CLASS
    t = default.job_class("train")
    assert t is not None and t.mps.priority_for(t.preemptible) is MpsPriority.BELOW_NORMAL


@needs_root
def test_status_shows_one_server_and_each_jobs_namespace_and_priority(node: str) -> None:
    from slurmiso.isolation.mps_view import arrangement, lines

    infer = start(node, "81", "infer", uid=JOB_UID)
    train = start(node, "82", "train", uid=STRANGER_UID)
    control = SimMpsControl()
    view = arrangement(train.pool, control.protocol(), train.state.state_dir, control,
                       train.state.jobs())
    assert view["arrangement"] == mps_shared.ARRANGEMENT and view["v3"] is True
    (gpu,) = view["gpus"]
    assert gpu["per_class_daemons"] == [] and gpu["shared"]["daemon_pid"] is not None
    got = {ns["job"]: (ns["class"], ns["uid"], ns["client_priority"])
           for ns in gpu["shared"]["namespaces"]}
    assert got == {"81": ("infer", JOB_UID, "0"), "82": ("train", STRANGER_UID, "1")}
    text = "\n".join(lines(view))
    assert f"{namespace(infer)}: job 81 (infer), priority 0, threads 100%" in text
    HANDLER.teardown(infer)
    HANDLER.teardown(train)
    assert arrangement(train.pool, control.protocol(), train.state.state_dir, control,
                       {})["gpus"] == []


class _Refuses(SimMpsControl):
    """A v3 daemon that refuses one verb: what NVIDIA documents did not hold here."""

    def __init__(self, verb: str) -> None:
        super().__init__()
        self.verb = verb

    def v3(self, pipe_dir: str, argv: List[str]) -> str:
        if argv[:2] == self.verb.split():
            raise NodeFault(f"{' '.join(argv[:3])}: refused")
        return super().v3(pipe_dir, argv)


@pytest.mark.parametrize("verb,why", [
    ("server create", "its MPS v3 daemon could not be laid out (server create slurmiso: refused)"),
    ("namespace set", "the job's MPS v3 namespace could not be made (namespace set job_"),
])
def test_a_daemon_that_does_not_do_what_nvidia_documents_falls_back_per_job(
        node: str, verb: str, why: str) -> None:
    """Never a drained node for a documented step that did not hold: the job gets the older
    per-class daemon, the shared daemon is gone, the reason is journaled and told."""
    control = _Refuses(verb)
    handler = MpsIsolation(control_factory=lambda backend: control)
    ctx = start(node, "91", "train", uid=os.getuid(), handler=handler)
    (entry,) = [r for r in ctx.record.resources if r.kind == "mps"]
    assert mps_shared.namespace_of(entry.extra) is None and entry.state.value == "ready"
    assert control.running(entry.pipe_dir or "") is not None  # its per-class daemon
    assert control.running(pipe(node)) is None and not os.path.exists(pipe(node))
    (said,) = events(ctx, "mps-arrangement")
    assert said["arrangement"] == "per-class" and said["reason"].startswith(why), said
    assert any(why in w for w in ctx.record.warnings)
    handler.teardown(ctx)
    assert control.running(entry.pipe_dir or "") is None
