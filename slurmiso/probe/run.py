"""A whole probe, from the config to the report: which modes, placed how, measured, judged.

The CLI gives it a :class:`Request`; tests give it a fake Slurm (anything with
``run(cmd, args, timeout=None)``) or ``local=True``. The report is plain JSON data
(see docs/probe.md for every key).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from datetime import datetime, timezone
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.config.model import Config
from slurmiso.errors import UsageError
from slurmiso.probe import plan
from slurmiso.probe.modes import run_modes
from slurmiso.probe.recommend import MODE_ORDER, Target, recommend
from slurmiso.probe.session import Options, Placement, Placer, Session
from slurmiso.values import Value, field, replace

log = logging.getLogger(__name__)

VERSION = 1
#: --local probes these when --modes is not given (mig-dynamic needs Slurm's hooks).
LOCAL_DEFAULT = ("timeslice", "mps", "mps-priority", "mps-v3", "mps-sm-partition",
                 "exclusive")


class Request(Value):
    """What to probe."""

    options: Options
    local: bool = False
    modes: Tuple[str, ...] = ()  # () = every mode the cluster (or node) has
    pools: Tuple[str, ...] = ()
    infer_class: str = "infer"
    train_class: str = "train"
    p99_ms: Optional[float] = None  # overrides monitor.slo
    max_error_pct: Optional[float] = None
    gpu: int = 0  # --local: the GPU to share
    work_dir: str = ""
    slurm: Any = None  # Slurm runner (SlurmCli or a fake) for the Slurm path
    notes: List[str] = field(default_factory=list)


def target_for(cfg: Config, req: Request) -> Target:
    """The infer class's SLO: the options' values, else ``monitor.slo`` of the class."""
    slo = next((s for s in cfg.monitor.slo if s.class_name == req.infer_class), None)
    p99 = req.p99_ms if req.p99_ms is not None else (slo.p99_latency_ms if slo else None)
    err = req.max_error_pct if req.max_error_pct is not None else (
        slo.max_error_rate * 100.0 if slo and slo.max_error_rate is not None else None)
    source = ("--p99-ms" if req.p99_ms is not None
              else f"monitor.slo of {req.infer_class} in {cfg.source}" if slo else "none")
    return Target(req.infer_class, None if p99 is None else float(p99),
                  None if err is None else float(err) / 100.0, source)


def _local_placer(cfg: Config, pair: plan.Pair, req: Request,
                  work_dir: str) -> Tuple[Placer, str, Any]:
    from slurmiso.probe import local

    gpus = local.open_gpus(cfg, work_dir)

    def placer(mode: str, cleanup: contextlib.ExitStack
               ) -> Tuple[Optional[Dict[str, Placement]], str]:
        envs, why = local.mode_envs(mode, gpus, pair, req.gpu, cleanup)
        if envs is None:
            return None, why
        return {role: Placement(env=env) for role, env in envs.items()}, ""

    return placer, gpus.note, gpus


def _slurm_placer(cfg: Config, pair: plan.Pair) -> Placer:
    pools = {p.mode: p for p in cfg.pools}

    def placer(mode: str, cleanup: contextlib.ExitStack
               ) -> Tuple[Optional[Dict[str, Placement]], str]:
        pool = pools[mode]
        try:
            return {role: Placement(sbatch=plan.sbatch_args(pool, pair, role))
                    for role in ("infer", "train")}, ""
        except UsageError as err:
            return None, str(err)

    return placer


def run_probe(cfg: Config, req: Request) -> Dict[str, Any]:
    """Measure, recommend, and return the report (nothing is left running afterwards)."""
    opts = req.options
    for name, value in (("--run-timeout", opts.run_timeout_s),
                        ("--ready-timeout", opts.ready_timeout_s),
                        ("--queue-timeout", opts.queue_timeout_s)):
        if not value > 0:  # 0 would wait for ever on a hung command
            raise UsageError(f"{name} must be above 0, not {value:g}s",
                             hint="a duration like 90s, 5m")
    pair = plan.classes(cfg, req.infer_class, req.train_class)
    target = target_for(cfg, req)
    work_dir = os.path.abspath(req.work_dir)
    os.makedirs(work_dir, exist_ok=True)
    started = time.time()
    notes = list(req.notes)
    if req.local:
        from slurmiso.probe.local import LocalLauncher

        modes = list(req.modes or LOCAL_DEFAULT)
        placer, gpus_note, gpus = _local_placer(cfg, pair, req, work_dir)
        host = socket.gethostname()
        pairs = [(m, f"local/{host}") for m in modes]
        launcher: Any = LocalLauncher(req.options.python)
        total = {d.index: d.memory_total_mb for d in gpus.devices}.get(req.gpu)
        model = next((d.model for d in gpus.devices), "")
    else:
        from slurmiso.probe.slurm_run import SlurmLauncher

        pools = plan.pools_to_probe(cfg, req.modes, req.pools)
        if not pools:
            raise UsageError(
                "no pool to probe: " + (f"none of mode {', '.join(req.modes)} with a partition"
                                        if req.modes else "the config has no pool with a "
                                        "partition"), hint="check --modes/--pools and pools[]")
        by_mode = {p.mode: p for p in pools}
        cfg_view = _with_pools(cfg, pools)
        placer = _slurm_placer(cfg_view, pair)
        pairs = [(p.mode, p.name) for p in pools]
        gpus_note = ", ".join(f"{p.name}: {p.mode} on {p.gpu_model} (partition {p.partition})"
                              for p in pools)
        launcher = SlurmLauncher(req.slurm, work_dir, req.options.python,
                                 poll_s=max(req.options.poll_s, 0.5))
        total, model = None, ""
        # each node samples through its own configured backend (%n expanded there)
        sample = {"backend": "config", "kind": cfg.gpu.backend, "sim_state": cfg.gpu.sim_state}
    if req.local:
        sample = ({"backend": "sim", "sim_state": gpus.sim_state}
                  if gpus.simulated else {"backend": "nvml"})
    options = req.options if req.options.gpu_mem else replace(req.options, gpu_mem=sample)
    session = Session(launcher, work_dir, options)

    def limit(mode: str) -> Optional[int]:
        pool_model = model if req.local else by_mode[mode].gpu_model
        return plan.memory_limit_mb(mode, pool_model, pair.train, total)

    results = run_modes(session, pairs, placer, limit)
    rec = recommend(results, target)
    info = session.workload_info
    kind = (info.get("infer") or info.get("train") or {}).get("workload", "custom")
    if req.options.infer_cmd or req.options.train_cmd:
        kind = "site commands" if req.options.infer_cmd and req.options.train_cmd else (
            f"{'--infer-cmd' if req.options.infer_cmd else 'built-in inference'} and "
            f"{'--train-cmd' if req.options.train_cmd else 'built-in training'}")
    workload = {"kind": kind, "infer": req.options.infer_cmd or "builtin",
                "train": req.options.train_cmd or "builtin", "info": info}
    if kind == "cpu-stand-in":
        workload["note"] = ("torch with a CUDA device is not importable where the workloads "
                            "ran: CPU stand-ins measured the probe itself, not GPU sharing")
        notes.append(workload["note"])
    for m in results:
        if m.get("invalid"):
            notes.append(f"{m['mode']}: not measured, a run was interrupted from outside the "
                         f"probe: {m['error']}")
        if m.get("colocated") is False and m["mode"] != "exclusive":
            notes.append(f"{m['mode']}: Slurm placed the pair on different GPUs "
                         f"({m['gpus']['infer']} and {m['gpus']['train']}); its mixed figures "
                         "are not a co-location and the recommendation leaves it out")
        mem = m.get("memory") or {}
        if mem.get("headroom_ok") is False:
            notes.append(f"{m['mode']}: training peaked at {mem['train_peak_mb']:.0f} MiB "
                         f"({mem.get('train_peak_source')}) of {mem['train_limit_mb']} MiB: "
                         f"{mem['train_headroom_pct']:g}% free, under 20% headroom for its peaks")
    now = time.time()
    return {
        "version": VERSION,
        "generated": datetime.fromtimestamp(now, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "generated_ts": now,
        "where": "local" if req.local else "slurm",
        "host": socket.gethostname(),
        "config": cfg.source,
        "classes": {"infer": pair.infer.name, "train": pair.train.name},
        "gpus": gpus_note,
        "workload": workload,
        "slo": {"class": target.infer_class, "p99_ms": target.p99_ms,
                "max_error_rate": target.max_error_rate, "source": target.source},
        "options": {"requests": req.options.requests, "rate": req.options.rate,
                    "request_timeout_ms": req.options.request_timeout_ms,
                    "train_seconds": req.options.train_seconds,
                    "run_timeout_s": req.options.run_timeout_s},
        "modes": results,
        "recommendation": rec,
        "runs": session.runs,
        "notes": notes,
        "seconds": round(now - started, 2),
        "work_dir": work_dir,
    }


def _with_pools(cfg: Config, pools: Sequence[Any]) -> Config:
    """The config with only the pools being probed (one per mode), for the placer's lookup."""
    fields = {name: getattr(cfg, name) for name in cfg._fields}
    fields["pools"] = tuple(pools)
    return Config(**fields)


def default_modes(local: bool) -> Sequence[str]:
    return LOCAL_DEFAULT if local else MODE_ORDER
