"""Per mode: its three runs measured into the report's figures, and every mode in turn with
nothing left running after it.

A mode's figures come from the session's :class:`~slurmiso.probe.session.Outcome` of inference
alone, training alone and the pair; a mode that cannot be measured here is ``skipped`` (why),
one whose runs were interrupted from outside is ``invalid`` (the evidence); both keep the
report's shape with None figures, so the recommendation and the renderers read every mode alike.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from slurmiso.errors import ProbeError
from slurmiso.probe import gpumem, stats
from slurmiso.probe.session import Outcome, Placement, Placer, RunInvalid, Session

log = logging.getLogger(__name__)


def _gpu_of(started: Dict[str, Any]) -> str:
    env = started.get("env") or {}
    gpus = env.get("SLURM_JOB_GPUS") or env.get("SLURM_STEP_GPUS")
    if gpus:
        return f"{started.get('node', '?')}:gpu{gpus}"
    if env.get("CUDA_MPS_PIPE_DIRECTORY"):
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        marker = next((part for part in pipe.split("/") if part.startswith("gpu")), "")
        return f"{started.get('node', '?')}:{marker or pipe}"
    return f"{started.get('node', '?')}:{env.get('CUDA_VISIBLE_DEVICES', '?')}"


def _colocated(mode: str, infer: Outcome, train: Outcome, where: str) -> Optional[bool]:
    """Whether the mixed pair shared one GPU (exclusive: whether it used two); None unknown."""
    if infer.started.get("node") != train.started.get("node"):
        return False
    if where == "local":
        return mode != "exclusive"
    a = (infer.started.get("env") or {}).get("SLURM_JOB_GPUS")
    b = (train.started.get("env") or {}).get("SLURM_JOB_GPUS")
    if mode == "mig-static" or not a or not b:
        return None  # MIG GRES indices are not GPU indices; no index: cannot tell
    return a == b if mode != "exclusive" else a != b


def measure_mode(session: Session, mode: str, pool: str, places: Dict[str, Placement],
                 limit_mb: Optional[int]) -> Dict[str, Any]:
    """The three runs of one mode and its figures (the JSON's ``modes[]`` entry)."""
    t0 = time.monotonic()
    opts = session.opts
    solo_i = session.solo(mode, "infer", places["infer"])
    solo_t = session.solo(mode, "train", places["train"])
    mix_i, mix_t = session.mixed(mode, places)
    since = float(mix_i.result.get("started_at") or 0.0)
    until = float(mix_i.result.get("ended_at") or 0.0)
    steps_beside = session.parse(mix_t, since, until).steps or mix_t.parsed.steps
    train_solo = stats.train_figures(solo_t.parsed.steps, opts.warmup_steps)
    train_mixed = stats.train_figures(steps_beside, 0)
    train_mixed["throughput_vs_solo"] = stats.throughput_vs_solo(train_mixed["step_s"],
                                                                 train_solo["step_s"])
    infer_solo = stats.infer_figures(solo_i.parsed.infer, opts.request_timeout_ms)
    infer_mixed = stats.infer_figures(mix_i.parsed.infer, opts.request_timeout_ms)
    p99_solo, p99_mixed = infer_solo["p99_ms"], infer_mixed["p99_ms"]
    infer_mixed["p99_vs_solo"] = (round(p99_mixed / p99_solo, 3) if p99_solo and p99_mixed
                                  else None)
    memory = gpumem.figures(
        {r: [o.parsed.gpu_mem_peak_mb for o in runs] for r, runs in (
            ("infer", (solo_i, mix_i)), ("train", (solo_t, mix_t)))},
        {r: [o.result.get("gpu_mem") for o in runs] for r, runs in (
            ("infer", (solo_i, mix_i)), ("train", (solo_t, mix_t)))},
        limit_mb)
    return {
        "mode": mode, "pool": pool, "node": mix_t.started.get("node"),
        "colocated": _colocated(mode, mix_i, mix_t, session.launcher.where),
        "gpus": {"infer": _gpu_of(mix_i.started), "train": _gpu_of(mix_t.started)},
        "infer": infer_mixed, "infer_solo": infer_solo,
        "train": train_mixed, "train_solo": train_solo,
        "memory": memory,
        "host": {r: {"solo": solo.result.get("host"), "mixed": mixed.result.get("host")}
                 for r, solo, mixed in (("infer", solo_i, mix_i), ("train", solo_t, mix_t))},
        "cdf": {"mixed": stats.cdf_points([x.latency_ms for x in mix_i.parsed.infer
                                           if x.latency_ms is not None]),
                "solo": stats.cdf_points([x.latency_ms for x in solo_i.parsed.infer
                                          if x.latency_ms is not None])},
        "seconds": round(time.monotonic() - t0, 2),
    }


def skipped(mode: str, pool: str, why: str) -> Dict[str, Any]:
    """A mode this probe could not measure, in the same shape (figures None)."""
    blank_i = {k: None for k in ("p50_ms", "p95_ms", "p99_ms", "error_rate", "requests")}
    blank_t = {"step_s": None, "throughput_vs_solo": None}
    return {"mode": mode, "pool": pool, "skipped": why, "infer": blank_i, "train": blank_t}


def invalid(mode: str, pool: str, why: str) -> Dict[str, Any]:
    """A mode whose runs were interrupted from outside: not measured, with the reason."""
    return dict(skipped(mode, pool, why), error=why, invalid=True)


def run_modes(session: Session, modes: List[Tuple[str, str]], placer: Placer,
              limits: Callable[[str], Optional[int]]) -> List[Dict[str, Any]]:
    """Every (mode, pool) in order; the session is closed (nothing left running) at the end,
    whatever happened."""
    out: List[Dict[str, Any]] = []
    try:
        for mode, pool in modes:
            with contextlib.ExitStack() as cleanup:  # the mode's daemons end with the mode
                places, why = placer(mode, cleanup)
                if places is None:
                    log.warning("mode %s skipped: %s", mode, why)
                    out.append(skipped(mode, pool, why))
                    continue
                try:
                    out.append(measure_mode(session, mode, pool, places, limits(mode)))
                except RunInvalid as err:
                    log.warning("mode %s not measured: %s", mode, err)
                    out.append(invalid(mode, pool, str(err)))
                finally:
                    session.close()  # before its daemons stop: no client outlives them
    finally:
        left = session.close()
        if left:
            raise ProbeError("probe runs still alive after cancelling them: " + ", ".join(
                session.launcher.describe(h) for h in left),
                hint="cancel them by hand (scancel / kill) and check the node")
    fastest = min((m["train_solo"]["step_s"] for m in out
                   if not m.get("skipped") and m["train_solo"]["step_s"]), default=None)
    for m in out:
        if not m.get("skipped"):
            m["train"]["throughput_vs_gpu"] = stats.throughput_vs_solo(m["train"]["step_s"],
                                                                       fastest)
    return out


def host() -> str:
    return socket.gethostname()
