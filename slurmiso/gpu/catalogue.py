"""The GPU models slurmiso knows: MIG profile tables, each with its source, and common GPUs
without MIG (so their memory is known before a node reports it).

Sources. The MIG tables follow NVIDIA's *Multi-Instance GPU User Guide*: its "Supported GPUs"
table (which products have MIG, with their memory) and its "Supported MIG Profiles" tables
(profile names, fractions of memory and SMs, instance counts per GPU); each model below names
the table it copies. Where the guide lists a GPU but prints no table of its own (H20, GH200
144 GB, GB200), the profile names and counts are NVIDIA's own mig-parted defaults, which the
GPU operator installs. Placements (start slices) are the guide's ``nvidia-smi mig -lgipp``
listing of a 7-slice part, ``{0..6}:1 {0..6}:1 {0,2,4,6}:2 {0,2,4}:2 {0,4}:4 {0}:4 {0}:8``,
which its placement diagrams show for every 7-slice GPU; 4- and 2-slice parts place each
profile at multiples of its size, as the A30 and RTX PRO diagrams show. Profile ids are
nvidia-smi's "ID" column on 7-slice parts; -1 where NVIDIA publishes none (the NVML backend
then names the profile as the driver does).

Memory sizes are what ``nvidia-smi --query-gpu=memory.total`` reports (MiB); per-profile sizes
of the newer tables are an even share of it. Checks on a node use the memory NVML reports.
A GPU missing here still works in exclusive, mps and timeslice pools; a MIG pool needs its
table (``slurmiso mig show --profiles`` on a node prints what the driver reports, ready to add).
"""

from __future__ import annotations

from typing import Dict, Tuple

from slurmiso.gpu.profiles import GpuModel, MigProfile

GUIDE = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html"
GUIDE_GPUS = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html"
MIG_PARTED = ("NVIDIA mig-parted deployments/systemd/config-default.yaml "
              "(https://github.com/NVIDIA/mig-parted)")
GPU_OPERATOR = ("NVIDIA gpu-operator assets/state-mig-manager/0400_configmap.yaml "
                "(https://github.com/NVIDIA/gpu-operator)")


def _p(name: str, pid: int, c: int, m: int, mem_mb: int, n: int, pl: Tuple[int, ...]) -> MigProfile:
    return MigProfile(name, pid, c, m, mem_mb, n, pl, media_engines="+me" in name)


# 7 compute / 8 memory slices. kind: (profile id, compute, memory slices, max, placements)
_SEVEN = {
    "1g": (19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6)),
    "1g+me": (20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g2": (15, 1, 2, 4, (0, 2, 4, 6)),  # the double-memory 1g ("1g.20gb" on H100-80GB)
    "2g": (14, 2, 2, 3, (0, 2, 4)),
    "3g": (9, 3, 4, 2, (0, 4)),
    "4g": (5, 4, 4, 1, (0,)),
    "7g": (0, 7, 8, 1, (0,)),
}


def _seven_slice(total_mb: int, gb: Tuple[int, int, int, int], per_slice_mb: int = 0
                 ) -> Tuple[MigProfile, ...]:
    """Catalogue of a 7-compute/8-memory-slice part from its profile names' GB numbers:
    (1g, double-memory 1g and 2g, 3g and 4g, 7g), e.g. (10, 20, 40, 80) on H100-80GB."""
    small, double, half, full = gb
    names = {"1g": f"1g.{small}gb", "1g+me": f"1g.{small}gb+me", "1g2": f"1g.{double}gb",
             "2g": f"2g.{double}gb", "3g": f"3g.{half}gb", "4g": f"4g.{half}gb",
             "7g": f"7g.{full}gb"}
    per = per_slice_mb or (total_mb // 8) // 128 * 128
    out = []
    for kind, (pid, c, m, n, pl) in _SEVEN.items():
        out.append(_p(names[kind], pid, c, m, total_mb if kind == "7g" else m * per, n, pl))
    return tuple(out)


def _seven(name: str, product: str, total_mb: int, sms: int, arch: str, source: str,
           gb: Tuple[int, int, int, int], per_slice_mb: int = 0) -> GpuModel:
    return GpuModel(name, product, total_mb, sms, 7, 8, _seven_slice(total_mb, gb, per_slice_mb),
                    architecture=arch, source=source)


def _sliced(slices: int, total_mb: int, rows: Tuple[Tuple[str, int, int], ...]
            ) -> Tuple[MigProfile, ...]:
    """Profiles of a part whose memory slices equal its compute slices (RTX PRO): ``rows``
    are (name, slices, max instances); placements at multiples of the size."""
    per = (total_mb // slices) // 128 * 128
    return tuple(
        _p(name, -1, k, k, total_mb if k == slices else k * per, n,
           tuple(range(0, slices - k + 1, k)))
        for name, k, n in rows
    )


def _rtx_pro(gb: int, slices: int, me: bool = True) -> Tuple[Tuple[str, int, int], ...]:
    """The guide's RTX PRO rows: per size, plain, +me (1g), +gfx, +me.all and -me variants."""
    one, two, four = gb // slices, 2 * gb // slices, gb
    rows = [(f"1g.{one}gb", 1, slices)] + ([(f"1g.{one}gb+me", 1, 1)] if me else []) + [
        (f"1g.{one}gb+gfx", 1, slices), (f"1g.{one}gb+me.all", 1, 1),
        (f"1g.{one}gb-me", 1, slices)]
    if slices == 4:
        rows += [(f"2g.{two}gb", 2, 2), (f"2g.{two}gb+gfx", 2, 2), (f"2g.{two}gb+me.all", 2, 1),
                 (f"2g.{two}gb-me", 2, 2), (f"4g.{four}gb", 4, 1), (f"4g.{four}gb+gfx", 4, 1)]
    else:
        rows += [(f"2g.{four}gb", 2, 1), (f"2g.{four}gb+gfx", 2, 1)]
    return tuple(rows)


def _plain(name: str, product: str, total_mb: int, arch: str) -> GpuModel:
    """A GPU without MIG: usable in exclusive, mps and timeslice pools."""
    return GpuModel(name, product, total_mb, 0, 0, 0, (), architecture=arch)


_MIG_MODELS = (
    # Guide, "A100 MIG Profiles": the A100-SXM4-40GB table (A100-PCIE-40GB is the same part).
    _seven("A100-40GB", "NVIDIA A100-SXM4-40GB", 40960, 108, "ampere",
           f"{GUIDE}#a100-mig-profiles (A100-SXM4-40GB table)", (5, 10, 20, 40), 4864),
    # Guide, "A100 MIG Profiles": "For A100-SXM4-80GB, the profile names will change according
    # to the memory proportion - 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb".
    _seven("A100-80GB", "NVIDIA A100-SXM4-80GB", 81920, 108, "ampere",
           f"{GUIDE}#a100-mig-profiles (A100-SXM4-80GB names)", (10, 20, 40, 80), 9856),
    # Guide, "A30 MIG Profiles": the A30-24GB table (4 compute and 4 memory slices).
    GpuModel("A30-24GB", "NVIDIA A30", 24576, 56, 4, 4, (
        _p("1g.6gb", 14, 1, 1, 5836, 4, (0, 1, 2, 3)),
        _p("1g.6gb+me", 21, 1, 1, 5836, 1, (0, 1, 2, 3)),
        _p("2g.12gb", 5, 2, 2, 11904, 2, (0, 2)),
        _p("2g.12gb+me", 6, 2, 2, 11904, 1, (0, 2)),
        _p("4g.24gb", 0, 4, 4, 24576, 1, (0,)),
    ), architecture="ampere", source=f"{GUIDE}#a30-mig-profiles (A30-24GB table)"),
    # Guide, "H100 MIG Profiles": the H100 80GB table ("PCIe and SXM5").
    _seven("H100-80GB", "NVIDIA H100 80GB HBM3", 81559, 132, "hopper",
           f"{GUIDE}#h100-mig-profiles (H100 80GB table, PCIe and SXM5)", (10, 20, 40, 80), 9856),
    # Guide, "H100 MIG Profiles": the H100 94GB table ("PCIe and SXM5"): H100 NVL.
    _seven("H100-94GB", "NVIDIA H100 NVL", 95830, 132, "hopper",
           f"{GUIDE}#h100-mig-profiles (H100 94GB table, PCIe and SXM5)", (12, 24, 47, 94)),
    # Guide, "H100 MIG Profiles": the H100 96GB table ("H100 on GH200").
    _seven("H100-96GB", "NVIDIA GH200 480GB", 97871, 132, "hopper",
           f"{GUIDE}#h100-mig-profiles (H100 96GB table, H100 on GH200)", (12, 24, 48, 96)),
    # Guide, "Supported GPUs": H20, Hopper GH100, 96GB, 7 instances; no table of its own.
    # mig-parted's all-balanced groups it with H100-96GB/GH200 (1g.12gb, 2g.24gb, 3g.48gb).
    _seven("H20-96GB", "NVIDIA H20", 97871, 78, "hopper",
           f"{GUIDE_GPUS} (H20 96GB); names: {MIG_PARTED} (H100-96GB, PG506-96GB, GH200, H20)",
           (12, 24, 48, 96)),
    # Guide, "H200 MIG Profiles": the H200 141GB table (H200-SXM5 and H200 NVL).
    _seven("H200-141GB", "NVIDIA H200", 143771, 132, "hopper",
           f"{GUIDE}#h200-mig-profiles (H200 141GB table)", (18, 35, 71, 141), 17920),
    # GH200 with 144 GB HBM3e: no table in the guide; mig-parted's "GH200 144G HBM3e" configs
    # (all-1g.18gb, all-1g.36gb, all-2g.36gb, all-3g.72gb, all-4g.72gb, all-7g.144gb).
    _seven("GH200-144GB", "NVIDIA GH200 144G HBM3e", 146831, 132, "hopper",
           f"{MIG_PARTED} (GH200 144G HBM3e)", (18, 36, 72, 144)),
    # Guide, "B200 MIG Profiles": the B200 180 GB table.
    _seven("B200-180GB", "NVIDIA B200", 183359, 148, "blackwell",
           f"{GUIDE}#b200-mig-profiles (B200 180 GB table)", (23, 45, 90, 180)),
    # Guide, "Supported GPUs": GB200, Blackwell GB100, 186GB, 7 instances; no table of its
    # own. Names and counts: mig-parted's GB200 configs (1g.24gb x7, 2g.47gb, 3g.95gb,
    # 7g.189gb; R580 drivers report 189471 MiB). R570 drivers named the same profiles
    # 1g.23gb/2g.47gb/3g.93gb/7g.186gb (gpu-operator's all-balanced); the NVML backend maps
    # them to these names by profile id.
    _seven("GB200-189GB", "NVIDIA GB200", 189471, 0, "blackwell",
           f"{GUIDE_GPUS} (GB200); names: {MIG_PARTED} and {GPU_OPERATOR} (GB200 HGX)",
           (24, 47, 95, 189)),
    # Guide, "RTX PRO 6000 Blackwell MIG Profiles": Workstation, Max-Q and Server Edition 96GB
    # (4 slices; +gfx, +me.all and -me variants).
    GpuModel("RTX-PRO-6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, 188, 4, 4,
             _sliced(4, 97887, _rtx_pro(96, 4)), architecture="blackwell",
             source=f"{GUIDE}#rtx-pro-6000-blackwell-mig-profiles"),
    # Guide, "RTX PRO 5000 Blackwell MIG Profiles": the 48GB table (2 slices).
    GpuModel("RTX-PRO-5000", "NVIDIA RTX PRO 5000 Blackwell", 48935, 0, 2, 2,
             _sliced(2, 48935, _rtx_pro(48, 2)), architecture="blackwell",
             source=f"{GUIDE}#rtx-pro-5000-blackwell-mig-profiles"),
    # Guide, "RTX PRO 4500 Blackwell MIG Profiles": the 32GB table (2 slices, no +me).
    GpuModel("RTX-PRO-4500", "NVIDIA RTX PRO 4500 Blackwell", 32623, 0, 2, 2,
             _sliced(2, 32623, _rtx_pro(32, 2, me=False)), architecture="blackwell",
             source=f"{GUIDE}#rtx-pro-4500-blackwell-mig-profiles"),
)

#: Common GPUs without MIG (memory as nvidia-smi reports it), so check-config can check MPS
#: limits against them; any other GPU works too, with its memory read on the node.
_PLAIN_MODELS = (
    _plain("L40S", "NVIDIA L40S", 46068, "ada"),
    _plain("L40", "NVIDIA L40", 46068, "ada"),
    _plain("L4", "NVIDIA L4", 23034, "ada"),
    _plain("RTX-6000-Ada", "NVIDIA RTX 6000 Ada Generation", 49140, "ada"),
    _plain("RTX-4090", "NVIDIA GeForce RTX 4090", 24564, "ada"),
    _plain("RTX-5090", "NVIDIA GeForce RTX 5090", 32607, "blackwell"),
    _plain("A40", "NVIDIA A40", 46068, "ampere"),
    _plain("A10", "NVIDIA A10", 23028, "ampere"),
    _plain("T4", "Tesla T4", 15360, "turing"),
)

MODELS: Dict[str, GpuModel] = {m.name: m for m in _MIG_MODELS + _PLAIN_MODELS}

#: Accepted spellings of model names (configs, ``sim init --model``) and the other product
#: names NVML reports for a model's variants.
ALIASES: Dict[str, str] = {
    "A100": "A100-40GB",
    "A100-SXM4-40GB": "A100-40GB",
    "NVIDIA A100-PCIE-40GB": "A100-40GB",
    "A100-SXM4-80GB": "A100-80GB",
    "NVIDIA A100 80GB PCIe": "A100-80GB",
    "A30": "A30-24GB",
    "H100": "H100-80GB",
    "NVIDIA H100 PCIe": "H100-80GB",
    "H100-NVL": "H100-94GB",
    "H100 NVL": "H100-94GB",
    "GH200": "H100-96GB",
    "GH200-96GB": "H100-96GB",
    "H20": "H20-96GB",
    "H200": "H200-141GB",
    "H200-NVL": "H200-141GB",
    "NVIDIA H200 NVL": "H200-141GB",
    "B200": "B200-180GB",
    "GB200": "GB200-189GB",
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": "RTX-PRO-6000",
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": "RTX-PRO-6000",
}
LOWER_ALIASES: Dict[str, str] = {k.lower(): v for k, v in ALIASES.items()}


def entry_text(model: GpuModel, source: str) -> str:
    """``model`` as an entry of ``_MIG_MODELS`` above: what ``mig show --profiles`` prints for
    a GPU the catalogue lacks, so its table can be added as the driver states it."""
    rows = "\n".join(
        f"        _p({p.name!r}, {p.profile_id}, {p.compute_slices}, {p.memory_slices}, "
        f"{p.memory_mb}, {p.max_instances}, {tuple(p.placements)!r}),"
        for p in model.profiles
    )
    return (f"    # {source}\n"
            f"    GpuModel({model.name!r}, {model.product_name!r}, {model.memory_mb}, "
            f"{model.sm_count}, {model.compute_slices}, {model.memory_slices}, (\n{rows}\n"
            f"    ), architecture={model.architecture!r}, source={source!r}),")
