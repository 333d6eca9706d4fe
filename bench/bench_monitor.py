"""Monitor: one decision cycle on 1,000 nodes x 8 GPUs and 20,000 pending jobs, vs parsing.

Builds a synthetic snapshot (MPS inference nodes, a MIG-static pool, exclusive training nodes;
a tenth of the shared GPUs hot; 20,000 pending and 3,000 running jobs of every class, typed
MIG requests among them) and writes it as JSON. Then, in fresh processes: the baseline only
reads and deserialises the snapshot; the cycle deserialises it and runs ``decide()`` with
every policy on (admission with an SLO, lending, MIG re-layout, reconcile). Times are medians
in-process; peak memory is each child's ``ru_maxrss``. Targets: decide <= 250 ms, the whole
cycle process <= 200 MB.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

from common import python_env, report

NODES, GPUS, PENDING, RUNNING = 1000, 8, 20_000, 3_000
TARGET_MS, TARGET_MB = 250.0, 200.0

_CHILD = r"""
import json, resource, statistics, sys, time
from slurmiso.monitor.snapshot import loads
mode, path = sys.argv[1], sys.argv[2]
text = open(path).read()
def timed(fn, runs):
    out = []
    for _ in range(runs):
        t0 = time.perf_counter(); fn(); out.append(time.perf_counter() - t0)
    return 1000 * statistics.median(out)
parse_ms = timed(lambda: loads(text), 5)
result = {"parse_ms": parse_ms}
if mode == "cycle":
    from slurmiso.monitor.decide import decide
    from slurmiso.monitor.policy import Memory, Policy, SloLimit
    pol = Policy(min_dwell_s=0, slo=(SloLimit("infer", 600, 250),),
                 lend=(("infer", "train"),), reconcile_nodes=("n0001", "n0002"),
                 reconcile_every_s=600,
                 mig_layouts={"mixed": (("half", (("3g.40gb", 8), ("4g.40gb", 4), ("1g.10gb", 12))),
                                        ("all-3g", (("3g.40gb", 16),)))})
    snap = loads(text)
    actions, _ = decide(snap, pol, Memory())
    result["decide_ms"] = timed(lambda: decide(snap, pol, Memory()), 5)
    result["cycle_ms"] = timed(lambda: decide(loads(text), pol, Memory()), 3)
    caps = Policy(**{**pol.__dict__, "admission": "qos-limit"})
    result["caps_ms"] = timed(lambda: decide(snap, caps, Memory()), 5)
    result["actions"] = len(actions)
    result["kinds"] = sorted({a.kind for a in actions})
result["rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
print(json.dumps(result))
"""


def synthetic(seed: int = 11) -> Dict[str, Any]:
    """A snapshot dict (the JSON schema of :mod:`slurmiso.monitor.snapshot`)."""
    rnd = random.Random(seed)
    nodes: List[Dict[str, Any]] = []
    parts: Dict[str, List[str]] = {"infer": [], "mixed": [], "train": []}
    for i in range(1, NODES + 1):
        name = f"n{i:04d}"
        kind = "infer" if i <= 400 else "mixed" if i <= 700 else "train"
        mode = {"infer": "mps", "mixed": "mig-static", "train": "exclusive"}[kind]
        parts[kind].append(name)
        gpus = []
        for g in range(GPUS):
            hot = rnd.random() < 0.1
            gpus.append({"index": g, "mem": rnd.randint(62000, 80000) if hot else
                         rnd.randint(0, 50000), "mem_total": 81559,
                         "sm": round(rnd.uniform(0, 100 if hot else 60), 1), "gr": 10.0,
                         "procs": rnd.randint(0, 3), "jobs": [str(100000 + i * 8 + g)],
                         "classes": [rnd.choice(["infer", "train"])]})
        nodes.append({"name": name, "state": rnd.choice(["MIXED", "ALLOCATED", "IDLE"]),
                      "partitions": [kind], "pool": kind, "mode": mode, "addr": "",
                      "gres": "gpu:3g.40gb:8,gpu:4g.40gb:4,gpu:1g.10gb:12" if kind == "mixed"
                      else "gpu:h100:8", "gpus": gpus,
                      "telemetry_age_s": 200.0 if rnd.random() < 0.01 else 4.0})
    jobs: List[Dict[str, Any]] = []
    now = 1_800_000_000.0
    for j in range(PENDING):
        cls = rnd.choices(["train", "infer", "debug"], [70, 20, 10])[0]
        part = rnd.choice(["infer", "mixed", "train"])
        jobs.append({"id": str(200000 + j), "state": "PENDING", "class": cls,
                     "partitions": [part], "qos": cls, "submit": now - rnd.uniform(0, 900),
                     "gres": rnd.choice(["gres:gpu:4g.40gb:1", "gres:gpu:1"]) if part ==
                     "mixed" else "gres:gpu:1", "held": rnd.random() < 0.02})
    for j in range(RUNNING):
        node = nodes[rnd.randrange(NODES)]
        jobs.append({"id": str(300000 + j), "state": "RUNNING",
                     "class": rnd.choice(["train", "infer"]), "partitions": node["partitions"],
                     "qos": "train", "submit": now - 5000, "nodes": [node["name"]],
                     "gres": "gres:gpu:1"})
    return {"version": 1, "ts": now, "nodes": nodes, "partitions": parts, "jobs": jobs,
            "latency_p99_ms": {"infer": 180.0}, "latency_age_s": 5.0, "slurm_ok": True,
            "errors": []}


def child(mode: str, path: str) -> Dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", _CHILD, mode, path], env=python_env(),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"bench_monitor child failed:\n{out.stderr}")
    return dict(json.loads(out.stdout))


def main() -> bool:
    with tempfile.TemporaryDirectory(prefix="slurmiso-bench-monitor-") as tmp:
        path = os.path.join(tmp, "snapshot.json")
        with open(path, "w") as fh:
            json.dump(synthetic(), fh, separators=(",", ":"))
        size = os.path.getsize(path) / 1e6
        base = child("parse", path)
        cyc = child("cycle", path)
    print(f"  snapshot: {NODES:,} nodes x {GPUS} GPUs, {PENDING:,} pending + {RUNNING:,} "
          f"running jobs, {size:.1f} MB JSON; first cycle: {cyc['actions']:,} actions "
          f"({', '.join(cyc['kinds'])})")
    parse_ms = base["parse_ms"]
    ok1 = report("monitor decide() (median)", f"{cyc['decide_ms']:.0f} ms",
                 cyc["decide_ms"] / parse_ms, f"of parse-only {parse_ms:.0f} ms")
    report("monitor decide(), admission qos-limit", f"{cyc['caps_ms']:.0f} ms",
           cyc["caps_ms"] / parse_ms, f"of parse-only {parse_ms:.0f} ms")
    ok2 = report("monitor cycle: parse + decide (median)", f"{cyc['cycle_ms']:.0f} ms",
                 cyc["cycle_ms"] / parse_ms, f"of parse-only {parse_ms:.0f} ms")
    ok3 = report("monitor cycle peak memory (ru_maxrss)", f"{cyc['rss_mb']:.0f} MB",
                 cyc["rss_mb"] / base["rss_mb"], f"of parse-only {base['rss_mb']:.0f} MB")
    met_t = cyc["decide_ms"] <= TARGET_MS
    met_m = cyc["rss_mb"] <= TARGET_MB
    print(f"  targets: decide <= {TARGET_MS:g} ms: {'met' if met_t else 'MISSED'}; "
          f"<= {TARGET_MB:g} MB: {'met' if met_m else 'MISSED'}")
    return ok1 and ok2 and ok3 and met_t and met_m
