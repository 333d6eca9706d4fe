"""Containers: does the live oci.conf carry the lines slurmiso's isolation needs inside them?

    slurmiso doctor --snapshot snap.json     # snap["oci_conf"] = {"path": ..., "text": ...}

The table is :func:`slurmiso.slurm.ociconf.required_lines`, the one ``slurmiso gen oci-conf``
prints, so the check and the generator cannot disagree. oci.conf lives beside slurm.conf
(oci.conf(5), 24.11); without it Slurm's ``--container`` is advisory only.
"""

from __future__ import annotations

from typing import List

from slurmiso.config.model import Config
from slurmiso.doctor import Check, Finding, Snapshot

GEN = "'slurmiso gen oci-conf'"


def check_oci_conf(snap: Snapshot, cfg: Config) -> List[Finding]:
    """One finding per missing or contradicting line; an info line when all is well."""
    oci = snap.get("oci_conf")
    if oci is None or not cfg.pools:
        return []  # a snapshot from before this check, or no GPU pools to protect
    path = str(oci.get("path") or "oci.conf")
    text = oci.get("text")
    if text is None:
        return [Finding("info", "oci-conf", f"{path} does not exist on this host: Slurm ignores "
                        "--container on nodes without it (run doctor on a GPU node to check "
                        "its oci.conf; pyxis and Apptainer setups are not checked)",
                        f"none needed; for Slurm's containers: 'slurmiso gen oci-conf -o {path}'")]
    from slurmiso.slurm import ociconf
    from slurmiso.slurm.client import parse_version
    from slurmiso.slurm.containers import mps_root, uses_mps

    version = parse_version(str(snap.get("slurm_version") or ""))
    if not ociconf.env_after_task_prolog(version):
        if ociconf.gated(ociconf.parse_oci_conf(str(text)).get("RunTimeRun")):
            return [Finding("info", "oci-conf-slurm",
                            f"{path} enables --container on Slurm {snap.get('slurm_version')}, "
                            "which writes a container's config.json before GRES and the "
                            "TaskProlog: a container keeps its share only where srun passed "
                            "the job's exports on (a batch script's plain srun); "
                            "slurmiso-oci-gate refuses the others",
                            "upgrade Slurm to 23.02 or later for containers that always get "
                            "their share")]
        return [Finding("error", "oci-conf-slurm",
                        f"{path} enables --container on Slurm {snap.get('slurm_version')}, which "
                        "writes a container's config.json before GRES and the TaskProlog set the "
                        "job's environment: CUDA_VISIBLE_DEVICES and slurmiso's MPS variables "
                        "never reach a containerised job",
                        f"remove {path} on GPU nodes, or upgrade Slurm to 23.02 or later")]
    found = ociconf.problems(ociconf.parse_oci_conf(str(text)), version, uses_mps(cfg))
    out = [Finding("error", p.code, f"{path}: {_verb(p.code)} {p.line}: {p.why}",
                   _fix(p.code, p.line, path)) for p in found]
    if not out and uses_mps(cfg):
        out.append(Finding("info", "oci-conf-mounts",
                           f"{path} has slurmiso's lines; oci.conf cannot bind a path, so every "
                           f"bundle's config.json must bind {mps_root(cfg)} at the same path",
                           f"{GEN} --config-json prints the mounts to add"))
    return out


def _verb(code: str) -> str:
    return {"oci-conf-malformed": "cannot parse", "oci-conf-unknown-key": "unknown key in"
            }.get(code, "needs")


def _fix(code: str, line: str, path: str) -> str:
    if code == "oci-conf-malformed":
        return f"write that line as Key=Value or remove it ({GEN} prints a whole file)"
    if code == "oci-conf-unknown-key":
        return f"remove that line from {path}"
    return f"set {line} in {path} ({GEN}), then restart slurmd"


CHECKS: List[Check] = [check_oci_conf]
