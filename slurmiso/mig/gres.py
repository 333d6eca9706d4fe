"""The node's ``gres/gpu`` list as Slurm sees it, and which MIG device each entry is.

One order, used by ``slurmiso gen gres-conf``, by the ``Gres=`` of ``slurm.conf`` *and* by the
mig-static prolog: whole GPUs first, then MIG devices grouped by type (profile name), each
group by GPU index and placement start. Measured on Slurm 22.05 (tests/integration): slurmctld
numbers a node's ``gres/gpu`` records type by type, in the order the node's ``Gres=`` lists the
types, and that number is what ``SLURM_JOB_GPUS`` carries into the Prolog; with gres.conf lines
of one type not contiguous (e.g. GPU 1 = 4g + 3g between 3g lines) the indices and types no
longer agree and a job gets the wrong instance, or none. So gres.conf lists each type's lines
together and ``Gres=`` names the types in the same order (:func:`type_counts`).

Each MIG entry needs three device files: ``/dev/nvidia<gpu minor>`` plus the GPU-instance and
compute-instance access capabilities ``/dev/nvidia-caps/nvidia-cap<N>``, whose minors the
driver lists in ``/proc/driver/nvidia-caps/mig-minors`` keyed by the GPU's *minor* (as Slurm's
gpu/nvml plugin reads them).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.config.model import MigLayout, Pool
from slurmiso.errors import GpuError, StateError
from slurmiso.gpu.backend import DeviceInfo, MigInstance
from slurmiso.gpu.placement import pack
from slurmiso.gpu.profiles import GpuModel
from slurmiso.values import Value, as_dict

log = logging.getLogger(__name__)

MIG_MINORS = "driver/nvidia-caps/mig-minors"  # under /proc
RECORD_DOC = "mig-gres"  # node document (state_dir/mig-gres.json) written by 'mig apply'

# The driver's numbering when mig-minors cannot be read: "config" is 1, "monitor" 2, then per
# GPU minor 15 GPU-instance slots of 9 minors each (the GI access cap, then its CI 0..7 caps):
# gpu0/gi0/access = 3, gpu0/gi0/ci0/access = 4, gpu0/gi1/access = 12, gpu0/gi1/ci0/access = 13.
# NOT confirmed from an NVIDIA source: it matches published mig-minors excerpts but the
# driver may change it. Real nodes have the file and use it; this serves stand-in devices.
_FIRST_GPU_MINOR = 3
_GI_SLOTS = 15
_PER_GI = 9  # GI access + 8 CI slots


class GresEntry(Value, eq=True):
    """One ``Name=gpu`` record; ``index`` is its position = its ``SLURM_JOB_GPUS`` value."""

    index: int
    gpu: int
    gpu_minor: int
    profile: str  # "" = the whole GPU (MIG disabled)
    start: int = -1
    gi_id: Optional[int] = None
    ci_id: Optional[int] = None
    uuid: str = ""
    files: Tuple[str, ...] = ()

    @property
    def is_mig(self) -> bool:
        return bool(self.profile)

    def identity(self) -> Tuple[int, str, int, Optional[int]]:
        """What must not change while gres.conf stands: GPU, profile, start, GI id."""
        return (self.gpu, self.profile, self.start, self.gi_id)

    def conf_line(self, gpu_type: str) -> str:
        if self.is_mig:
            return f"Name=gpu Type={self.profile} MultipleFiles={','.join(self.files)}"
        return f"Name=gpu Type={gpu_type} File={self.files[0]}"

    def to_dict(self) -> Dict[str, Any]:
        return as_dict(self)


# ------------------------------------------------------------------------- cap minors
def parse_mig_minors(text: str) -> Dict[str, int]:
    """``gpu0/gi1/access 12`` lines -> {"gpu0/gi1/access": 12}; malformed lines skipped."""
    out: Dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            out[parts[0]] = int(parts[1])
    return out


def read_mig_minors(proc_root: str = "/proc") -> Optional[Dict[str, int]]:
    """The driver's cap table, or None where there is none (no driver, stand-in devices)."""
    path = os.path.join(proc_root, MIG_MINORS)
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return parse_mig_minors(fh.read())
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise GpuError(f"cannot read {path}: {exc.strerror}") from None


def computed_cap_minor(gpu_minor: int, gi_id: int, ci_id: Optional[int] = None) -> int:
    """The cap minor by the driver's numbering (see the note at ``_FIRST_GPU_MINOR``)."""
    base = _FIRST_GPU_MINOR + gpu_minor * _GI_SLOTS * _PER_GI + gi_id * _PER_GI
    return base if ci_id is None else base + 1 + ci_id


def cap_minor(
    gpu_minor: int, gi_id: int, ci_id: Optional[int], minors: Optional[Dict[str, int]]
) -> int:
    """Cap minor from the driver's table when given, else computed."""
    if minors is None:
        return computed_cap_minor(gpu_minor, gi_id, ci_id)
    key = f"gpu{gpu_minor}/gi{gi_id}" + ("" if ci_id is None else f"/ci{ci_id}") + "/access"
    if key not in minors:
        raise GpuError(
            f"{key} is missing from /proc/{MIG_MINORS}",
            hint="the driver and NVML disagree about MIG instances; reload the driver or "
            "reboot the node",
        )
    return minors[key]


def mig_files(
    gpu_minor: int, gi_id: int, ci_id: int, minors: Optional[Dict[str, int]], dev_root: str
) -> Tuple[str, ...]:
    caps = os.path.join(dev_root, "nvidia-caps")
    return (
        os.path.join(dev_root, f"nvidia{gpu_minor}"),
        os.path.join(caps, f"nvidia-cap{cap_minor(gpu_minor, gi_id, None, minors)}"),
        os.path.join(caps, f"nvidia-cap{cap_minor(gpu_minor, gi_id, ci_id, minors)}"),
    )


# ---------------------------------------------------------------- the canonical order
#: gpu, gpu minor, profile ("" = whole GPU), start, gi, ci, uuid
Row = Tuple[int, int, str, int, Optional[int], Optional[int], str]


def entries_from_rows(
    rows: Sequence[Row], minors: Optional[Dict[str, int]], dev_root: str
) -> List[GresEntry]:
    """GRES entries in THE order from (gpu, minor, profile, start, gi, ci, uuid) rows."""
    out = []
    ordered = sorted(rows, key=lambda r: (r[2], r[0], r[3]))  # THE order: type, GPU, start
    for n, (gpu, minor, prof, start, gi, ci, uuid) in enumerate(ordered):
        if prof and gi is not None and ci is not None:
            files = mig_files(minor, gi, ci, minors, dev_root)
        else:
            files = (os.path.join(dev_root, f"nvidia{minor}"),)
        out.append(GresEntry(n, gpu, minor, prof, start, gi, ci, uuid, files))
    return out


def type_counts(entries: Sequence[GresEntry], whole_type: str = "") -> List[Tuple[str, int]]:
    """``[(type, count), ...]`` in the canonical order, for the node's ``Gres=gpu:T:N,...``."""
    out: List[Tuple[str, int]] = []
    for e in entries:
        t = e.profile or whole_type
        if out and out[-1][0] == t:
            out[-1] = (t, out[-1][1] + 1)
        else:
            out.append((t, 1))
    return out


def live_entries(
    devices: Sequence[DeviceInfo],
    instances: Sequence[MigInstance],
    minors: Optional[Dict[str, int]] = None,
    dev_root: str = "/dev",
) -> List[GresEntry]:
    """The node's GRES list from its live GPUs and MIG instances, in the canonical order.

    A GPU instance without its compute instance is no usable device (Slurm's autodetect skips
    it too), so it gets no entry.
    """
    rows: List[Row] = []
    for dev in devices:
        if not dev.mig_enabled:
            rows.append((dev.index, dev.minor, "", -1, None, None, dev.uuid))
    minor_of = {d.index: d.minor for d in devices}
    for inst in instances:
        if inst.ci_id is None:
            log.warning("GPU %d: GI %d has no compute instance; not listed in gres.conf",
                        inst.gpu_index, inst.gi_id)
            continue
        rows.append((inst.gpu_index, minor_of.get(inst.gpu_index, inst.gpu_index), inst.profile,
                     inst.placement_start, inst.gi_id, inst.ci_id, inst.uuid))
    return entries_from_rows(rows, minors, dev_root)


def layout_entries(
    model: GpuModel,
    layout: MigLayout,
    gpu_count: int,
    minors: Optional[Dict[str, int]] = None,
    dev_root: str = "/dev",
) -> List[GresEntry]:
    """The GRES list a fresh ``mig apply`` of ``layout`` would give (GPU minor = index).

    GI ids are predicted as ``mig apply`` on an empty GPU makes them on the simulated backend
    (1, 2, ... in placement order). NVML picks its own GI ids, so on real GPUs generate from
    the live instances after ``mig apply``.
    """
    rows: List[Row] = []
    for gpu in range(gpu_count):
        group = layout.for_device(gpu)
        if group is None or not group.mig_enabled:
            rows.append((gpu, gpu, "", -1, None, None, ""))
            continue
        placed = pack(model, group.counts())
        if placed is None:
            raise GpuError(f"layout {layout.name!r} does not fit on GPU {gpu} ({model.name})")
        for gi, (prof, start) in enumerate(sorted(placed, key=lambda p: p[1]), start=1):
            rows.append((gpu, gpu, prof, start, gi, 0, ""))
    return entries_from_rows(rows, minors, dev_root)


def map_gres_indices(
    indices: Sequence[int], entries: Sequence[GresEntry]
) -> Tuple[List[GresEntry], List[int]]:
    """The entries a job's ``SLURM_JOB_GPUS`` indices name, and the indices with no entry."""
    by_index = {e.index: e for e in entries}
    found = [by_index[i] for i in indices if i in by_index]
    missing = [i for i in indices if i not in by_index]
    return found, missing


# ------------------------------------------------------------------------- gres.conf
def gpu_type_name(model: str) -> str:
    """Slurm ``Type=`` of a whole GPU: the model's family, lower case ("H100-80GB" -> "h100",
    "RTX-4090" -> "rtx4090"); "" for a pool that names no model (untyped ``gpu`` GRES).

    ``gen slurm-conf`` must use the same name in ``Gres=gpu:<type>:N``.
    """
    parts = [p for p in model.strip().split("-")
             if p and not (p[:-2].isdigit() and p[-2:].upper() == "GB")]
    if not parts:
        return ""
    if any(ch.isdigit() for ch in parts[0]):
        return parts[0].lower()
    return "".join(ch for ch in "".join(parts).lower() if ch.isalnum())


def bracket(numbers: Sequence[int]) -> str:
    """Slurm's range syntax: [0,1,2,5] -> "[0-2,5]" (a single number stays bare)."""
    nums = sorted(set(numbers))
    if len(nums) == 1:
        return str(nums[0])
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return "[" + ",".join(parts) + "]"


def render_gres_conf(
    pool: Pool,
    node: str,
    entries: Optional[Sequence[GresEntry]] = None,
    dev_root: str = "/dev",
    source: str = "",
    node_prefix: bool = False,
) -> str:
    """gres.conf text for ``node`` of ``pool``; ``entries`` are needed for mig-static."""
    gtype = gpu_type_name(pool.gpu_model)
    minors = list(range(pool.gpus_per_node))
    pre = f"NodeName={node} " if node_prefix else ""
    lines = [
        f"# gres.conf for node {node} (pool {pool.name}, mode {pool.mode}), "
        "generated by 'slurmiso gen gres-conf'.",
        "# Do not edit: regenerate after changing the slurmiso config or the MIG layout.",
    ]
    if source:
        lines.append(f"# Source: {source}")
    dev = os.path.join(dev_root, "nvidia")
    typed = f" Type={gtype}" if gtype else ""
    gpu_line = f"{pre}Name=gpu{typed} File={dev}{bracket(minors)}"
    if pool.mode == "mig-static":
        counts = ",".join(f"gpu:{t}:{n}" for t, n in type_counts(entries or (), gtype))
        lines.append("# Order matters: SLURM_JOB_GPUS indexes these lines (type, GPU, slice);")
        lines.append(f"# slurm.conf must list the types in this order: Gres={counts}")
        lines.extend(pre + e.conf_line(gtype) for e in entries or ())
    elif pool.mode == "mps":
        lines.append(gpu_line)
        lines.extend(f"{pre}Name=mps Count={pool.mps_shares_per_gpu} "
                     f"File={os.path.join(dev_root, f'nvidia{m}')}" for m in minors)
    elif pool.mode in ("mig-dynamic", "timeslice"):
        lines.append(gpu_line)
        lines.extend(f"{pre}Name=shard Count={pool.shards_per_gpu} "
                     f"File={os.path.join(dev_root, f'nvidia{m}')}" for m in minors)
    else:
        lines.append(gpu_line)
    return "\n".join(lines) + "\n"


# ------------------------------------------------- what gres.conf was generated from
def save_record(state_dir: str, layout: str, entries: Sequence[GresEntry]) -> str:
    """Record the applied layout's entries, so the prolog can tell when MIG state drifted."""
    from slurmiso.state import NodeState

    data = {"layout": layout,
            "entries": [dict(zip(("gpu", "profile", "start", "gi_id"), e.identity()))
                        for e in entries]}
    return NodeState(state_dir).write_doc(RECORD_DOC, data)


def load_record(state_dir: str) -> Optional[List[Tuple[int, str, int, Optional[int]]]]:
    """The recorded entry identities, or None when ``mig apply`` never recorded any."""
    from slurmiso.state import NodeState

    state = NodeState(state_dir)
    data = state.read_doc(RECORD_DOC)
    if data is None:
        return None
    try:
        return [(int(e["gpu"]), str(e["profile"]), int(e["start"]),
                 None if e["gi_id"] is None else int(e["gi_id"])) for e in data["entries"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise StateError(
            f"MIG record {state.doc_path(RECORD_DOC)} is unreadable: {exc}",
            hint="run 'slurmiso mig apply' to rewrite it",
        ) from None
