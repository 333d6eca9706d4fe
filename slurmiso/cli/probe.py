"""``slurmiso probe``: measure inference alone and beside training per pool mode, and pick the
softest isolation that holds the inference SLO."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from typing import Any

from slurmiso.cli.output import print_json

_EPILOG = """\
what it runs, per mode (--modes, default: every pool mode the config has):
  inference alone, training alone, then both on one GPU as the mode shares it: timeslice
  (shards), mps (each class's thread percentage and memory limit), mig-static/mig-dynamic
  (each class's MIG profile), exclusive (two GPUs: the reference). Through Slurm: sbatch jobs
  with the pool's partition, the class's QoS and the mode's --gres, every job cancelled at the
  end (also on an error or Ctrl-C). --local: the same on this node without Slurm, MPS daemons
  started and stopped by slurmiso's own daemon code (mps-priority: one shared MPS server,
  training at CUDA_MPS_CLIENT_PRIORITY=1; mps-v3, where the driver has MPS v3: one server, a
  namespace per class with its limits and priority; mps-sm-partition, where the daemon makes
  static SM partitions (-d -S, CUDA 13.1+): the GPU's SMs split by the classes' thread
  percentages); MIG is never changed.

output contract of your commands (run with /bin/sh -c):
  --infer-cmd   one line per request: a latency in ms ("12.7"), or JSON
                {"latency_ms": 12.7, "ok": true}; slower than --request-timeout-ms = error
  --train-cmd   one line per step: seconds ("0.213") or {"step_s": 0.213}; runs until it
                exits or gets SIGTERM
  either may print {"gpu_mem_peak_mb": N} and {"info": {...}}; other lines are ignored.
  They get SLURMISO_PROBE_ROLE, _REQUESTS, _RATE, _REQUEST_TIMEOUT_MS, _STOP_FILE.
  Without them (--workload builtin): a PyTorch request loop and training loop where torch
  sees a GPU, a CPU stand-in otherwise (the output says which).

recommendation: the softest mode (timeslice < mps < mig-dynamic/mig-static < exclusive:
  rate-limit first, then quotas, then partition or dedicate) whose P99 beside training meets
  monitor.slo p99_latency_ms of the inference class (and max_error_rate, if set), keeping the
  most training throughput; "none" when no mode does. Exit 0 when a mode holds the SLO, 1 when
  none does, 2 on bad options, 5 when Slurm fails; a failing workload is one error naming the
  command and its output files.

examples:
  slurmiso probe --local --workload builtin --modes timeslice,mps --json
  slurmiso probe --infer-cmd './bench-serve.sh' --train-cmd 'python step.py' --html probe.html
  slurmiso probe --modes mps,mig-dynamic --work-dir /shared/probe --p99-ms 120
"""


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "probe", help="measure inference beside training per pool mode; recommend a mode",
        description=(
            "Before choosing an isolation method: measure the same inference workload alone "
            "and beside training in every pool mode, compare P50/P95/P99 latency, error rate "
            "and training step time with the SLO, and recommend the softest mode that holds "
            "it. Run it as root or a Slurm admin account, first on a new cluster "
            "(docs/probe.md)."),
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--local", action="store_true",
                   help="run the pairs on this node without Slurm (a GPU box, a test machine)")
    p.add_argument("--modes", default="", metavar="M,M",
                   help="modes to probe: timeslice, mps, mig-dynamic, mig-static, exclusive "
                        "(--local also mps-priority, mps-v3, mps-sm-partition); default every "
                        "one available")
    p.add_argument("--pools", default="", metavar="P,P",
                   help="pools to probe (default: the config's first pool of each mode)")
    p.add_argument("--workload", choices=("builtin",), default=None,
                   help="the built-in workloads for both roles (the default without commands)")
    p.add_argument("--infer-cmd", default="", metavar="CMD",
                   help="your inference benchmark (see the output contract below)")
    p.add_argument("--train-cmd", default="", metavar="CMD",
                   help="your training step loop (see the output contract below)")
    p.add_argument("--requests", type=int, default=200, help="inference requests per run")
    p.add_argument("--rate", type=float, default=20.0,
                   help="inference requests per second (0 = back to back; default 20)")
    p.add_argument("--request-timeout-ms", type=float, default=1000.0,
                   help="a request slower than this counts as an error (default 1000)")
    p.add_argument("--train-seconds", type=float, default=10.0,
                   help="how long training runs alone (default 10)")
    p.add_argument("--run-timeout", default="5m", metavar="DURATION",
                   help="a run taking longer is killed and reported as hung (default 5m)")
    p.add_argument("--queue-timeout", default="10m", metavar="DURATION",
                   help="a job pending longer is an error (default 10m)")
    p.add_argument("--ready-timeout", default="2m", metavar="DURATION",
                   help="training must print its first step within this (default 2m)")
    p.add_argument("--infer-class", default="infer", help="the inference class (default infer)")
    p.add_argument("--train-class", default="train", help="the training class (default train)")
    p.add_argument("--p99-ms", type=float, default=None,
                   help="P99 target instead of monitor.slo's p99_latency_ms")
    p.add_argument("--max-error-pct", type=float, default=None,
                   help="highest error rate in %% (monitor.slo's max_error_rate is a fraction)")
    p.add_argument("--gpu", type=int, default=0, help="--local: the GPU index to share")
    p.add_argument("--work-dir", default="", metavar="DIR",
                   help="where runs write their files (Slurm: a directory the nodes see; "
                        "default ./slurmiso-probe-TIME, or a temp dir with --local)")
    p.add_argument("--results-dir", default="", metavar="DIR",
                   help="where the result is saved (default paths.probe_dir)")
    p.add_argument("--no-save", action="store_true", help="do not save the result")
    p.add_argument("--textfile", default="", metavar="FILE",
                   help="Prometheus textfile of the baselines (default "
                        "RESULTS_DIR/slurmiso_probe.prom)")
    p.add_argument("--json", action="store_true", help="the report as JSON on stdout")
    p.add_argument("--html", default="", metavar="FILE",
                   help="also write the HTML report (latency CDF per mode) to FILE")
    p.add_argument("--job-python", default=sys.executable, metavar="PATH",
                   help="the Python that runs slurmiso on the nodes (default this one)")
    p.set_defaults(func=run)


def _duration(text: str, what: str) -> float:
    from slurmiso.errors import UsageError
    from slurmiso.units import parse_duration

    try:
        return float(parse_duration(text))
    except (ValueError, UsageError):
        raise UsageError(f"{what} {text!r} is not a duration (90s, 5m, 1h)") from None


def run(args: argparse.Namespace) -> int:
    import os
    import tempfile

    from slurmiso.config import load_config
    from slurmiso.errors import SlurmisoError, UsageError
    from slurmiso.probe import store
    from slurmiso.probe.plan import parse_modes
    from slurmiso.probe.render import render_html, render_text
    from slurmiso.probe.run import Request, run_probe
    from slurmiso.probe.session import Options

    if args.workload and (args.infer_cmd or args.train_cmd):
        raise UsageError("--workload builtin and --infer-cmd/--train-cmd exclude each other",
                         hint="give the commands, or --workload builtin for both roles")
    if args.requests < 1 or args.rate < 0 or args.request_timeout_ms <= 0:
        raise UsageError("--requests must be at least 1, --rate at least 0 and "
                         "--request-timeout-ms above 0")
    cfg = load_config(args.config)
    opts = Options(
        infer_cmd=args.infer_cmd, train_cmd=args.train_cmd, requests=args.requests,
        rate=args.rate, request_timeout_ms=args.request_timeout_ms,
        train_seconds=args.train_seconds,
        run_timeout_s=_duration(args.run_timeout, "--run-timeout"),
        queue_timeout_s=_duration(args.queue_timeout, "--queue-timeout"),
        ready_timeout_s=_duration(args.ready_timeout, "--ready-timeout"),
        python=args.job_python)
    work_dir = args.work_dir or (tempfile.mkdtemp(prefix="slurmiso-probe-") if args.local else
                                 os.path.abspath(time.strftime("slurmiso-probe-%Y%m%dT%H%M%S")))
    slurm = None
    if not args.local:
        from slurmiso.slurm.client import SlurmCli

        slurm = SlurmCli(timeout=60)
    req = Request(options=opts, local=args.local,
                  modes=tuple(parse_modes(args.modes, args.local)) if args.modes else (),
                  pools=tuple(p for p in args.pools.split(",") if p.strip()),
                  infer_class=args.infer_class, train_class=args.train_class,
                  p99_ms=args.p99_ms, max_error_pct=args.max_error_pct, gpu=args.gpu,
                  work_dir=work_dir, slurm=slurm)
    # SIGTERM (a cancelled cron or session) ends the probe the way Ctrl-C does: every run it
    # started is cancelled before it exits.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        report = run_probe(cfg, req)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if not args.no_save:
        results_dir = args.results_dir or cfg.paths.probe_dir
        try:
            report["saved"] = store.save(report, results_dir)
            report["textfile"] = args.textfile or os.path.join(results_dir, store.TEXTFILE)
            store.write_textfile(report, report["textfile"])
        except SlurmisoError as exc:  # the measurement stands even where it cannot be kept
            print(f"slurmiso: warning: {exc}", file=sys.stderr)
    if args.html:
        from slurmiso.cli.audit import write

        write(render_html(report), args.html)
    if args.json:
        print_json(report)
    else:
        sys.stdout.write(render_text(report))
    return 0 if report["recommendation"]["mode"] != "none" else 1


def _interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt
