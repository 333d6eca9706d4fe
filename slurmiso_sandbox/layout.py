"""The sandbox cluster as data, and the config files rendered from it.

Everything here is pure (no I/O), so the generated ``slurm.conf``, ``gres.conf``,
``slurmdbd.conf``, hook wrappers and the sandbox's own ``slurmiso.yaml`` are checked against
golden files without Slurm. :mod:`slurmiso_sandbox.files` writes them; :mod:`.services` runs
the daemons.

Five nodes share this host: each is its own ``slurmd -N nX`` on 127.0.0.1 with its own port and
its own character-device stand-ins (slurmd rejects regular files as GRES ``File=``), and each
is one slurmiso pool, so every GPU mode has a node to be tested on.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    from slurmiso.config.model import Config

CLUSTER = "slurmiso-sbx"
DEFAULT_DIR = "/var/lib/slurmiso-sandbox"

# Ports away from Slurm's defaults (6817-6819) so a site's real daemons never collide. Each is
# PORT_BASE plus an offset, so a second sandbox (another Slurm release, env
# SLURMISO_SANDBOX_PORT_BASE) can run beside the first.
PORT_BASE = 16800
CTLD_PORT = 16817
DBD_PORT = 16819
MYSQL_PORT = 16806
TEST_USER = "sbxuser"  # a non-root user for jobs that must not run as root
DB_NAME = "slurm_acct_db"
DB_USER = "slurmsbx"
DB_PASS = "slurmsbx"  # loopback-only database of a throwaway cluster

NVIDIA_MAJOR = 195  # what the NVIDIA driver registers for /dev/nvidiaN (and nvidiactl, 255)
NVIDIACTL_MINOR = 255
# The driver registers nvidia-caps and nvidia-uvm with dynamic majors; the stand-ins take fixed
# ones no local driver uses (opening them gives ENXIO, as a GPU device with no driver does).
CAPS_MAJOR = 237
UVM_MAJOR = 238
# The modes NVIDIA's driver (nvidia-modprobe) gives the real files: anyone may open a GPU, and
# the MIG access caps are world-readable; only the device cgroup keeps a job off the others.
GPU_MODE = 0o666
CAP_MODE = 0o444
CAP_CONFIG_MODE = 0o400  # nvidia-cap1 ("config"): root only
CAP_CONFIG_MINOR = 1
CAP_MONITOR_MINOR = 2
MIG_GI_SLOTS = 15  # GPU-instance ids a GPU can have (0..14), each with CI ids 0..7
MIG_CI_SLOTS = 8

NODE_CPUS = 4  # declared, not real: SlurmdParameters=config_overrides lets 5 slurmds share 2 cores
NODE_MEMORY_MB = 2000
DEF_MEM_PER_CPU = 250  # so jobs without --mem do not claim a whole node under CR_Core_Memory


@dataclass(frozen=True)
class MigSlot:
    """One MIG device laid out statically: profile and memory-slice start on a GPU."""

    gpu: int
    profile: str
    placement: int
    gi_id: Optional[int] = None  # None: as a fresh 'mig apply' would number it
    ci_id: Optional[int] = None


@dataclass(frozen=True)
class SandboxNode:
    """One slurmd of the sandbox, which is also one slurmiso pool."""

    name: str
    port: int
    pool: str
    mode: str  # slurmiso pool mode
    partition: str
    gpu_model: str  # slurmiso model name (profiles.MODELS), or any name with gpu_memory_mb
    gres_type: str  # Slurm GRES type of whole GPUs
    gpus: int = 2
    #: Memory of a simulated GPU the catalogue lacks (0: the catalogue's figure).
    gpu_memory_mb: int = 0
    mps_per_gpu: int = 0
    shards_per_gpu: int = 0
    mig_enabled: bool = False
    mig_slots: Tuple[MigSlot, ...] = ()
    mig_layout: str = ""
    #: The pool's GPU time slice (``timeslice:``; timeslice pools only; "": none).
    timeslice: str = ""
    default_partition: bool = False
    #: The MIG devices Slurm is told about (gres.conf, ``Gres=``): the simulated GPUs' live
    #: instances once they exist, so a re-laid node is scheduled as it is; None: ``mig_slots``.
    live_slots: Optional[Tuple[MigSlot, ...]] = None

    @property
    def gres_slots(self) -> Tuple[MigSlot, ...]:
        return self.mig_slots if self.live_slots is None else self.live_slots


MIG_LAYOUT_NAME = "sandbox-migs"

NODES: Tuple[SandboxNode, ...] = (
    SandboxNode("n1", 16821, "excl", "exclusive", "gpu", "A100-80GB", "a100",
                default_partition=True),
    SandboxNode("n2", 16822, "mps", "mps", "mps", "H100-80GB", "h100", mps_per_gpu=100),
    SandboxNode(
        "n3", 16823, "migs", "mig-static", "mig", "H100-80GB", "h100",
        mig_enabled=True,
        mig_slots=(
            MigSlot(0, "3g.40gb", 0),
            MigSlot(0, "3g.40gb", 4),
            MigSlot(1, "3g.40gb", 0),
        ),
        mig_layout=MIG_LAYOUT_NAME,
    ),
    SandboxNode("n4", 16824, "migd", "mig-dynamic", "migd", "H100-80GB", "h100",
                shards_per_gpu=7, mig_enabled=True),
    SandboxNode("n5", 16825, "tslice", "timeslice", "tslice", "A100-80GB", "a100",
                shards_per_gpu=4, timeslice="short"),
)


#: Pool modes that need no MIG table: their nodes can play any GPU (``with_plain_gpu``).
PLAIN_MODES = ("exclusive", "mps", "timeslice")


def parse_plain_gpu(spec: str) -> Tuple[str, int]:
    """``MODEL`` or ``MODEL:MEMORY`` (``L40S``, ``RTX-A5000:24G``) -> (model, memory MiB; 0 =
    the catalogue's). A model slurmiso has no entry for needs its memory; MIG is not needed."""
    from slurmiso.errors import UsageError
    from slurmiso.gpu.profiles import lookup_model
    from slurmiso.units import parse_size

    name, _, memory = spec.strip().partition(":")
    name = name.strip()
    known = lookup_model(name) if name else None
    try:
        memory_mb = int(parse_size(memory)) if memory.strip() else 0
    except ValueError as exc:
        raise UsageError(f"plain GPU {spec!r}: {exc}", hint="e.g. L40S or RTX-A5000:24G") from None
    if not name or (known is None and memory_mb <= 0):
        raise UsageError(f"plain GPU {spec!r}: a model slurmiso knows, or NAME:MEMORY",
                         hint="e.g. L40S, L4, RTX-4090, or RTX-A5000:24G")
    return (known.name if known else name), memory_mb


def with_plain_gpu(nodes: Sequence[SandboxNode], spec: str) -> Tuple[SandboxNode, ...]:
    """``nodes`` with every exclusive, mps and timeslice node playing the GPU ``spec`` names
    (:func:`parse_plain_gpu`); MIG nodes keep their MIG model. "" changes nothing."""
    if not spec:
        return tuple(nodes)
    from dataclasses import replace

    from slurmiso.mig.gres import gpu_type_name

    model, memory_mb = parse_plain_gpu(spec)
    return tuple(replace(n, gpu_model=model, gres_type=gpu_type_name(model) or "gpu",
                         gpu_memory_mb=memory_mb) if n.mode in PLAIN_MODES else n
                 for n in nodes)


#: Run by the host's sh in a fresh mount namespace: make ``$1`` the namespace's root as
#: runc does (pivot_root onto itself, then detach the old root from under it).
PIVOT_SCRIPT = """set -e
mount --rbind "$1" "$1"
cd "$1"
pivot_root . .
umount -l .
cd /
shift
exec "$@"
"""


@dataclass(frozen=True)
class Site:
    """Where the sandbox lives on this machine: the inputs every rendered file depends on.

    ``prolog``/``epilog`` are the repository's hook scripts when they exist ("" otherwise);
    ``pythonpath`` is the directory holding the ``slurmiso`` package the hooks must import
    (slurmd gives hooks no environment, so the wrappers set it). ``task_python`` is for the
    TaskProlog, which runs as the job's user: "" means ``python`` (when others can run it).
    """

    root: str
    host: str
    python: str
    prolog: str = ""
    epilog: str = ""
    pythonpath: str = ""
    task_python: str = ""  # TaskProlog runs as the job's user: an interpreter they can run
    spank_plugin: str = ""  # the built SPANK plugin ("" = none: no plugstack.conf)
    cgroup: str = "v1"  # cgroup.conf's CgroupPlugin: v1 on a hybrid host, v2 on pure unified
    #: cgroup v2 on a host whose /sys/fs/cgroup is not the unified hierarchy (a hybrid host):
    #: the Slurm daemons run in a mount namespace of their own with cgroup2 there
    #: (cgroups.py; the "cgroup-ns" service in services.py).
    cgroup_ns: bool = False
    #: The controllers the cgroup2 root offers (cgroup.controllers): ConstrainCores needs
    #: cpuset, ConstrainRAMSpace memory; a hybrid host keeps them bound to v1.
    v2_controllers: Tuple[str, ...] = ()
    #: LD_PRELOAD library for the Slurm daemons of a v2 sandbox on a hybrid host, "" if none
    #: (slurmiso_sandbox/hybrid_shim.c says why and what it changes).
    hybrid_shim: str = ""
    #: The hooks are the installed packages' executables (``sandbox up --from-packages``), run
    #: as they are, not the checkout's scripts through ``python`` with ``PYTHONPATH``.
    packaged: bool = False
    nodes: Tuple[SandboxNode, ...] = field(default=NODES)
    port_base: int = PORT_BASE
    #: The Slurm release run from a Debian root ("" = the host's own Slurm).
    slurm: str = ""
    #: cgroup.conf IgnoreSystemd=yes: no systemd to ask for a scope (cgroup/v2, and cgroup/v1
    #: from 24.11 on, measured).
    ignore_systemd: bool = False
    #: FirstJobId (0: Slurm's default). Two sandboxes on one host share the v1 cgroup trees
    #: (``slurm_<node>/uid_<uid>/job_<id>``): disjoint job ids keep their jobs' cgroups apart.
    first_job_id: int = 0
    #: The Debian root the daemons and clients run in (chroot); "" = the host.
    chroot: str = ""

    def exe(self, *argv: str) -> List[str]:
        """``argv`` as this site runs it: inside its root when it has one."""
        return ["/usr/sbin/chroot", self.chroot, *argv] if self.chroot else list(argv)

    def pivoted(self, *argv: str) -> List[str]:
        """``argv`` with its root as the root of a mount namespace of its own, not a chroot.

        The kernel refuses a new user namespace to a chrooted process (user_namespaces(7),
        EPERM), so slurmstepd's rootless OCI runtime (``srun --container``) needs slurmd
        pivoted into the root; everything else keeps :meth:`exe`."""
        if not self.chroot:
            return list(argv)
        return ["/usr/bin/unshare", "--mount", "--propagation", "slave", "--", "/bin/sh",
                "-c", PIVOT_SCRIPT, "slurmiso-pivot", self.chroot, *argv]

    def port(self, default: int) -> int:
        """One of the default ports above, moved by this site's port base."""
        return default - PORT_BASE + self.port_base

    @property
    def ctld_port(self) -> int:
        return self.port(CTLD_PORT)

    @property
    def dbd_port(self) -> int:
        return self.port(DBD_PORT)

    @property
    def mysql_port(self) -> int:
        return self.port(MYSQL_PORT)

    def path(self, *parts: str) -> str:
        return "/".join((self.root.rstrip("/"),) + parts)

    @property
    def slurm_conf(self) -> str:
        return self.path("etc", "slurm.conf")

    @property
    def slurmiso_yaml(self) -> str:
        return self.path("etc", "slurmiso.yaml")

    @property
    def plugstack_conf(self) -> str:
        return self.path("etc", "plugstack.conf")

    @property
    def hooks(self) -> bool:
        return bool(self.prolog and self.epilog)


@dataclass(frozen=True)
class DeviceNode:
    """A character device to ``mknod``, with the mode the NVIDIA driver gives the real one."""

    path: str
    major: int
    minor: int
    mode: int = GPU_MODE


def dev_root(site: Site, n: SandboxNode) -> str:
    """The node's stand-in for ``/dev``: what its gres.conf names."""
    return site.path("dev", n.name)


def gpu_device(site: Site, n: SandboxNode, gpu: int) -> str:
    return site.path("dev", n.name, f"nvidia{gpu}")


def cap_device(site: Site, n: SandboxNode, minor: int) -> str:
    return site.path("dev", n.name, "nvidia-caps", f"nvidia-cap{minor}")


def all_cap_minors(n: SandboxNode) -> List[int]:
    """Every MIG access-cap minor the driver would number on the node's GPUs (GI 0..14 and
    CI 0..7 of each): a MIG-capable node has a stand-in for every instance it may ever have,
    the ones the prolog creates per job included."""
    from slurmiso.mig.gres import computed_cap_minor

    out = []
    for g in range(n.gpus):
        for gi in range(MIG_GI_SLOTS):
            out.append(computed_cap_minor(g, gi))
            out += [computed_cap_minor(g, gi, ci) for ci in range(MIG_CI_SLOTS)]
    return out


def device_nodes(site: Site) -> List[DeviceNode]:
    """Every stand-in device file of every node, with the driver's modes."""
    out: List[DeviceNode] = []
    for n in site.nodes:
        out += [DeviceNode(gpu_device(site, n, g), NVIDIA_MAJOR, g) for g in range(n.gpus)]
        root = dev_root(site, n)
        out += [
            DeviceNode(f"{root}/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR),
            DeviceNode(f"{root}/nvidia-uvm", UVM_MAJOR, 0),
            DeviceNode(f"{root}/nvidia-uvm-tools", UVM_MAJOR, 1),
        ]
        if n.mig_enabled or n.gres_slots:
            out += [
                DeviceNode(cap_device(site, n, CAP_CONFIG_MINOR), CAPS_MAJOR, CAP_CONFIG_MINOR,
                           CAP_CONFIG_MODE),
                DeviceNode(cap_device(site, n, CAP_MONITOR_MINOR), CAPS_MAJOR, CAP_MONITOR_MINOR,
                           CAP_MODE),
            ]
            out += [DeviceNode(cap_device(site, n, m), CAPS_MAJOR, m, CAP_MODE)
                    for m in all_cap_minors(n)]
    return out


def gres_entries(n: SandboxNode, dev: str = "/dev") -> List[Any]:
    """The node's MIG devices as ``slurmiso gen gres-conf`` lists them (one order for gres.conf,
    ``Gres=`` and the prolog); GI ids not read from a simulated GPU are numbered as a fresh
    ``mig apply`` numbers them (1, 2, ... per GPU in placement order)."""
    from slurmiso.mig.gres import entries_from_rows

    rows = []
    for gpu in sorted({s.gpu for s in n.gres_slots}):
        mine = sorted((s for s in n.gres_slots if s.gpu == gpu), key=lambda s: s.placement)
        for i, slot in enumerate(mine, start=1):
            gi = slot.gi_id if slot.gi_id is not None else i
            ci = slot.ci_id if slot.ci_id is not None else 0
            rows.append((gpu, gpu, slot.profile, slot.placement, gi, ci, ""))
    return entries_from_rows(rows, None, dev)


def mig_gres_counts(n: SandboxNode) -> OrderedDict[str, int]:
    """MIG profile -> count on the node, in gres.conf order (the ``Gres=`` types)."""
    from slurmiso.mig.gres import type_counts

    return OrderedDict(type_counts(gres_entries(n)))


def node_gres(n: SandboxNode) -> str:
    """The ``Gres=`` value of a node line in slurm.conf."""
    if n.gres_slots:
        parts = [f"gpu:{p}:{c}" for p, c in mig_gres_counts(n).items()]
    else:
        parts = [f"gpu:{n.gres_type}:{n.gpus}"]
    if n.mps_per_gpu:
        parts.append(f"mps:{n.mps_per_gpu * n.gpus}")
    if n.shards_per_gpu:
        parts.append(f"shard:{n.shards_per_gpu * n.gpus}")
    return ",".join(parts)


def _hook_lines(site: Site) -> List[str]:
    if not site.hooks:
        return ["# Prolog/Epilog/TaskProlog: the repository has no hook scripts yet"]
    return [
        f"Prolog={site.path('bin', 'slurmiso-prolog')}",
        f"Epilog={site.path('bin', 'slurmiso-epilog')}",
        f"TaskProlog={site.path('bin', 'slurmiso-task-prolog')}",
    ]


def _submit_lines(site: Site) -> List[str]:
    # slurmctld and the clients find job_submit.lua / cli_filter.lua next to slurm.conf.
    lines = ["JobSubmitPlugins=lua", "CliFilterPlugins=lua"]
    if site.spank_plugin:
        lines.append(f"PlugStackConfig={site.plugstack_conf}")
    return lines


def render_slurm_conf(site: Site) -> str:
    """slurm.conf of the sandbox: accounting, QoS preemption, GRES, one partition per pool."""
    p = site.path
    lines = [
        "# Generated by 'slurmiso sandbox up'; rewritten on every up.",
        f"ClusterName={CLUSTER}",
        f"SlurmctldHost={site.host}(127.0.0.1)",
        f"SlurmctldPort={site.ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # A requeued job waits cred_expire + 1 s before it may start again (Slurm's default
        # 120 s), and within cred_expire slurmd skips the Prolog of a job it just ran: never
        # release that wait by hand (the job would start with no isolation record: refused);
        # shorten it here instead (measured on 22.05: 2-attempt requeue with the Prolog rerun).
        "AuthInfo=cred_expire=10",
        "CredType=cred/munge",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "MailProg=/bin/true",
        f"StateSaveLocation={p('spool', 'ctld')}",
        f"SlurmdSpoolDir={p('spool', 'slurmd-%n')}",
        f"SlurmctldPidFile={p('run', 'slurmctld.pid')}",
        f"SlurmdPidFile={p('run', 'slurmd-%n.pid')}",
        f"SlurmctldLogFile={p('log', 'slurmctld.log')}",
        f"SlurmdLogFile={p('log', 'slurmd-%n.log')}",
        "SlurmctldDebug=info",
        "SlurmdDebug=info",
        # Several slurmds declare more CPUs than the host has: trust the config.
        "SlurmdParameters=config_overrides",
        # What production GPU nodes run: the job's processes tracked by cgroup, and the
        # device constraint (cgroup.conf) keeping each job off the GPUs it was not given.
        "ProctrackType=proctrack/cgroup",
        "TaskPlugin=task/cgroup,task/affinity",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        f"DefMemPerCPU={DEF_MEM_PER_CPU}",
        "GresTypes=gpu,mps,shard",
        "SchedulerType=sched/backfill",
        "SchedulerParameters=defer_batch_sched_interval=1",
        "SchedulerTimeSlice=10",
        "PriorityType=priority/multifactor",
        "PriorityWeightQOS=10000",
        "PriorityWeightAge=0",
        "PriorityWeightFairshare=0",
        "PreemptType=preempt/qos",
        "PreemptMode=REQUEUE",
        "JobRequeue=1",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=127.0.0.1",
        f"AccountingStoragePort={site.dbd_port}",
        "AccountingStorageEnforce=associations,limits,qos",
        "AccountingStorageTRES=gres/gpu,gres/mps,gres/shard",
        "JobAcctGatherType=jobacct_gather/linux",
        "JobAcctGatherFrequency=30",
        # slurmd must not hold NVML open, or MIG cannot be reconfigured under it.
        "JobAcctGatherParams=DisableGPUAcct",
        "JobCompType=jobcomp/none",
        "PrologFlags=Alloc,Contain",
        "PrologEpilogTimeout=60",
        *_hook_lines(site),
        *_submit_lines(site),
        "ReturnToService=2",
        "KillWait=5",
        "MinJobAge=60",
        "MessageTimeout=10",
        "SlurmctldTimeout=30",
        "SlurmdTimeout=60",
        "InactiveLimit=0",
        "Waittime=0",
        *([f"FirstJobId={site.first_job_id}"] if site.first_job_id else []),
        "",
    ]
    for n in site.nodes:
        lines.append(
            f"NodeName={n.name} NodeHostname={site.host} NodeAddr=127.0.0.1 Port={n.port} "
            f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} Gres={node_gres(n)} State=UNKNOWN"
        )
    lines.append("")
    for n in site.nodes:
        default = "YES" if n.default_partition else "NO"
        lines.append(
            f"PartitionName={n.partition} Nodes={n.name} Default={default} "
            "MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def sandbox_config(site: Site) -> Config:
    """The sandbox's slurmiso.yaml, loaded as slurmiso loads it (the one source of its classes,
    pools and QoS)."""
    import yaml

    from slurmiso.config import parse_config

    return parse_config(yaml.safe_load(render_slurmiso_yaml(site)), "slurmiso.yaml")


def render_gres_conf(site: Site) -> str:
    """gres.conf: each node's lines from the generator sites run (``slurmiso gen gres-conf``),
    naming the node's stand-in device folder, so what the sandbox proves about Slurm's device
    constraint holds for the generated file."""
    from slurmiso.mig.gres import render_gres_conf as render_node

    cfg = sandbox_config(site)
    parts = ["# Generated by 'slurmiso sandbox up'; device files are mknod stand-ins."]
    for n in site.nodes:
        pool = next(p for p in cfg.pools if p.name == n.pool)
        dev = dev_root(site, n)
        entries = gres_entries(n, dev) if n.gres_slots else None
        parts.append(render_node(pool, n.name, entries, dev, node_prefix=True).rstrip("\n"))
    return "\n".join(parts) + "\n"


#: The cgroup/v2 controller each Constrain option needs (Slurm's cgroup/v2 plugin,
#: cgroup_p_initialize: every controller but devices and the tracking one must be in the
#: root's cgroup.controllers, or slurmd fails to start; same in 24.11 and 26.05).
V2_CONSTRAIN_NEEDS = (("ConstrainCores", "cpuset"), ("ConstrainRAMSpace", "memory"))


def v2_constrain_off(site: Site) -> List[Tuple[str, str]]:
    """(option, controller) of each Constrain option a cgroup v2 sandbox leaves off because
    the host's cgroup2 root lacks its controller (none on a pure v2 host)."""
    if site.cgroup != "v2":
        return []
    return [(opt, ctl) for opt, ctl in V2_CONSTRAIN_NEEDS if ctl not in site.v2_controllers]


def cgroup_slice(site: Site) -> str:
    """The CgroupSlice of a 26.05+ cgroup v2 sandbox: its own, so two sandboxes' slurmd scopes
    (``<slice>/<node>_slurmstepd.scope``, the same node names) never meet; "" before 26.05
    (no such option: ``system.slice``)."""
    if site.cgroup != "v2" or not site.slurm or tuple(
            int(x) for x in site.slurm.split(".")[:2]) < (26, 5):
        return ""
    base = os.path.basename(site.root.rstrip("/")) or "sandbox"
    return "".join(c if c.isalnum() or c in "_" else "_" for c in base) + ".slice"


def render_cgroup_conf(site: Site) -> str:
    """cgroup.conf as production GPU nodes have it: devices, cores and memory constrained.

    ``cgroup/v1`` where the host mounts the v1 ``devices`` controller (a hybrid host such as
    this one), ``cgroup/v2`` on a pure unified hierarchy or in the sandbox's own cgroup2 mount
    namespace. Several ``slurmd -N`` share the host: each gets its own root (``slurm_<node>``
    under the v1 controllers, ``<slice>/<node>_slurmstepd.scope`` on v2). On v2 a Constrain
    option whose controller the host cannot give the cgroup2 root stays off, and says so.
    """
    lines = [
        "# Generated by 'slurmiso sandbox up'.",
        f"CgroupPlugin=cgroup/{site.cgroup}",
        "ConstrainDevices=yes",
    ]
    off = dict(v2_constrain_off(site))
    for opt, _ctl in V2_CONSTRAIN_NEEDS:
        if opt in off:
            lines.append(f"# {opt}=no: this host's cgroup2 root has no {off[opt]} controller "
                         "(bound to cgroup v1 here)")
            lines.append(f"{opt}=no")
        else:
            lines.append(f"{opt}=yes")
    if site.cgroup == "v2" or site.ignore_systemd:
        lines.append("IgnoreSystemd=yes")  # no systemd to delegate a scope from
    if cgroup_slice(site):
        lines.append(f"CgroupSlice={cgroup_slice(site)}")
    return "\n".join(lines) + "\n"


def render_slurmdbd_conf(site: Site) -> str:
    """slurmdbd.conf: the private MariaDB on a loopback port (slurmdbd has no socket option)."""
    p = site.path
    return "\n".join([
        "# Generated by 'slurmiso sandbox up'.",
        "AuthType=auth/munge",
        f"DbdHost={site.host}",
        "DbdAddr=127.0.0.1",
        f"DbdPort={site.dbd_port}",
        "SlurmUser=root",
        "DebugLevel=info",
        f"LogFile={p('log', 'slurmdbd.log')}",
        f"PidFile={p('run', 'slurmdbd.pid')}",
        "StorageType=accounting_storage/mysql",
        "StorageHost=127.0.0.1",
        f"StoragePort={site.mysql_port}",
        f"StorageUser={DB_USER}",
        f"StoragePass={DB_PASS}",
        f"StorageLoc={DB_NAME}",
        "",
    ])


def render_hook_wrapper(site: Site, argv: Sequence[str]) -> str:
    """A shell wrapper slurmd can run: slurmd passes no PATH, so everything is absolute."""
    env = [f"SLURMISO_CONFIG={site.slurmiso_yaml}", f"SLURM_CONF={site.slurm_conf}"]
    if site.pythonpath and not site.packaged:
        env.append(f"PYTHONPATH={site.pythonpath}")
    cmd = " ".join(_sh_quote(a) for a in argv)
    return "#!/bin/sh\n# Generated by 'slurmiso sandbox up'.\n" + "".join(
        f"export {_sh_quote_assign(e)}\n" for e in env
    ) + f'exec {cmd} "$@"\n'


def hook_wrappers(site: Site) -> Dict[str, str]:
    """File name under ``<dir>/bin`` -> wrapper text; empty until the repo has hooks."""
    if not site.hooks:
        return {}
    if site.packaged:
        return {
            "slurmiso-prolog": render_hook_wrapper(site, [site.prolog]),
            "slurmiso-epilog": render_hook_wrapper(site, [site.epilog]),
            "slurmiso-task-prolog": render_hook_wrapper(
                site, [os.path.join(os.path.dirname(site.prolog), "slurmiso-task-prolog")]),
            "slurmiso-oci-gate": render_hook_wrapper(
                site, [os.path.join(os.path.dirname(site.prolog), "slurmiso-oci-gate")]),
        }
    return {
        "slurmiso-prolog": render_hook_wrapper(site, [site.python, site.prolog]),
        "slurmiso-epilog": render_hook_wrapper(site, [site.python, site.epilog]),
        # the hook module itself, as the packaged console script runs it: "-m slurmiso
        # task-prolog" imported the whole CLI first, 0.1-0.3 s on every task's start
        "slurmiso-task-prolog": render_hook_wrapper(
            site, [site.task_python or site.python, "-m", "slurmiso.hooks.task_prolog"]
        ),
        # oci.conf's RunTimeRun, as the job's user in front of crun (slurmiso_sandbox/oci.py)
        "slurmiso-oci-gate": render_hook_wrapper(
            site, [site.task_python or site.python, "-m", "slurmiso.hooks.oci_gate"]),
    }


def _sh_quote(s: str) -> str:
    if s and all(c.isalnum() or c in "/._-+=:,%@" for c in s):
        return s
    return "'" + s.replace("'", "'\"'\"'") + "'"


def _sh_quote_assign(assign: str) -> str:
    key, _, value = assign.partition("=")
    return f"{key}={_sh_quote(value)}"


def sim_path(site: Site, n: SandboxNode) -> str:
    return site.path("sim", f"{n.name}.json")


def _pool_yaml(n: SandboxNode) -> List[str]:
    out = [
        f"  - name: {n.pool}",
        f"    nodes: {n.name}",
        f"    partition: {n.partition}",
        f"    gpu_model: {n.gpu_model}",
        f"    gpus_per_node: {n.gpus}",
        f"    mode: {n.mode}",
    ]
    if n.mps_per_gpu:
        out.append(f"    mps_shares_per_gpu: {n.mps_per_gpu}")
    if n.mig_layout:
        out.append(f"    mig_layout: {n.mig_layout}")
    if n.shards_per_gpu:
        out.append(f"    shards_per_gpu: {n.shards_per_gpu}")
    if n.timeslice:
        out.append(f"    timeslice: {n.timeslice}")
    return out


def _mig_layout_yaml(n: SandboxNode) -> List[str]:
    out = [f"    {n.mig_layout}:"]
    gpus: OrderedDict[int, OrderedDict[str, int]] = OrderedDict()
    for slot in n.mig_slots:
        per = gpus.setdefault(slot.gpu, OrderedDict())
        per[slot.profile] = per.get(slot.profile, 0) + 1
    for gpu, counts in gpus.items():
        out += [f"      - devices: [{gpu}]", "        mig-enabled: true", "        mig-devices:"]
        out += [f"          {p}: {c}" for p, c in counts.items()]
    return out


_YAML_HEAD = """\
# Generated by 'slurmiso sandbox up' for the local sandbox cluster ({cluster}).
# %n is the node's Slurm name: the 5 sandbox nodes share one host.
version: 1

paths:
  state_dir: {root}/state/%n
  journal: {root}/log/journal-%n.jsonl
  dcgm_job_mapping_dir: ""
  dev_root: {root}/dev/%n

gpu:
  backend: sim
  sim_state: {root}/sim/%n.json

classes:
  - name: infer
    description: Latency-sensitive serving; never preempted.
    match:
      qos: [infer]
      partitions: []
      spank_class: infer
    isolation: mps
    mig_profile: 3g.40gb
    mps:
      thread_percentage: 100
      memory_limit: {infer_mem}
    memory_headroom: 10
    preemptible: false
    qos:
      priority: 1000
      preempt: [train]
      max_wall: 1d
      max_gpus_per_job: 8

  - name: train
    description: Throughput training; preempted by infer, requeued after it checkpoints.
    match:
      qos: [train]
      spank_class: train
    isolation: timeslice                # runs in every pool, the timeslice one included
    mig_profile: 4g.40gb
    mps:
      thread_percentage: 60
      memory_limit: {train_mem}
    memory_headroom: 10
    preemptible: true
    checkpoint:
      signal: USR2
      grace: 30s
      max_requeues: 20
    qos:
      priority: 100
      max_wall: 7d

  - name: debug
    description: Short interactive work on a whole GPU.
    match:
      qos: [debug]
      spank_class: debug
    isolation: exclusive
    preemptible: false
    qos:
      priority: 500
      max_wall: 2h
      max_gpus_per_job: 1

default_class: train

pools:
"""

_YAML_TAIL = """\
monitor:
  interval: 30s
  dry_run: true
  thresholds:
    memory_used: 75
    sm_active: 85
    hysteresis: 10
  min_dwell: 5m
  stagger:
    max_starts: 4
    interval: 60s
  telemetry:
    source: agents
    agent_port: 9810
    prometheus_url: ""

audit:
  severity: warning
  long_infer_job: 4h
  repeated_preemptions: 3
"""


def mps_limits(site: Site) -> Tuple[str, str]:
    """The infer and train classes' MPS memory limits: 32G and 24G where the MPS node's GPU
    has the H100's 80 GB or more, else 40% and 30% of its memory (10% headroom stays free),
    so a sandbox of smaller GPUs (``--plain-gpu L4``) starts MPS jobs too."""
    from slurmiso.gpu.profiles import lookup_model

    memory = 0
    for n in site.nodes:
        if n.mode == "mps":
            known = lookup_model(n.gpu_model)
            memory = n.gpu_memory_mb or (known.memory_mb if known else 0)
    if not memory or memory >= 81559:
        return "32G", "24G"
    return f"{max(1, memory * 40 // 100 // 1024)}G", f"{max(1, memory * 30 // 100 // 1024)}G"


def render_slurmiso_yaml(site: Site) -> str:
    """The sandbox's slurmiso.yaml: the example config's classes, one pool per sandbox node."""
    infer_mem, train_mem = mps_limits(site)
    lines = [_YAML_HEAD.format(cluster=CLUSTER, root=site.root.rstrip("/"), infer_mem=infer_mem,
                               train_mem=train_mem).rstrip("\n")]
    for n in site.nodes:
        lines += _pool_yaml(n) + [""]
    lines += [
        "mig_layouts:",
        "  version: v1",
        "  mig-configs:",
        "    all-disabled:",
        "      - devices: all",
        "        mig-enabled: false",
    ]
    for n in site.nodes:
        if n.mig_layout:
            lines += _mig_layout_yaml(n)
    lines.append("")
    return "\n".join(lines) + "\n" + _YAML_TAIL


def render_submit_files(site: Site) -> Dict[str, str]:
    """job_submit.lua, cli_filter.lua (the same script) and plugstack.conf, from the sandbox's
    own slurmiso.yaml through the real generators, so the sandbox tests what sites install."""
    from slurmiso.submit.job_submit import render_job_submit
    from slurmiso.submit.plugstack import render_plugstack

    cfg = sandbox_config(site)
    script = render_job_submit(cfg)
    files = {"etc/job_submit.lua": script, "etc/cli_filter.lua": script}
    if site.spank_plugin:
        fence = site.spank_plugin.replace("slurmiso.so", "slurmiso_fence.so") if site.hooks else ""
        files["etc/plugstack.conf"] = render_plugstack(
            cfg, site.spank_plugin, fence, (NVIDIA_MAJOR, CAPS_MAJOR, UVM_MAJOR))
    return files


def rendered_files(site: Site) -> Dict[str, str]:
    """Relative path under the sandbox dir -> content, for every generated text file."""
    files = {
        "etc/slurm.conf": render_slurm_conf(site),
        "etc/gres.conf": render_gres_conf(site),
        "etc/cgroup.conf": render_cgroup_conf(site),
        "etc/slurmdbd.conf": render_slurmdbd_conf(site),
        "etc/slurmiso.yaml": render_slurmiso_yaml(site),
        **render_submit_files(site),
    }
    for name, text in hook_wrappers(site).items():
        files[f"bin/{name}"] = text
    return files


def find_node(name: str, nodes: Sequence[SandboxNode] = NODES) -> Optional[SandboxNode]:
    return next((n for n in nodes if n.name == name), None)
