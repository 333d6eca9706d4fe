"""slurmiso audit over 1,000,000 sacct records: time and peak memory, vs parsing alone.

Writes a synthetic ``sacct -P`` file (1,000,000 job allocations plus their ``.batch`` steps
for a third of them, with arrays, het jobs, typed GPU TRES, MPS/shard jobs, preempted and
requeued attempts) to a temp dir, then runs in fresh processes: the full audit (``slurmiso
audit --sacct-file F --format json``), and the baseline that only reads and parses the same
file into records. Peak memory is each child's ``ru_maxrss``, read by a tiny wrapper process
so one measurement never includes another's. Targets: <= 60 s and <= 500 MB for the audit.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import time
from typing import List, Tuple

from common import ROOT, python_env, report

RECORDS = int(os.environ.get("SLURMISO_BENCH_AUDIT_RECORDS", "1000000"))
TARGET_S = 60.0
TARGET_MB = 500.0

_WRAPPER = (
    "import resource, subprocess, sys, time\n"
    "t0 = time.perf_counter()\n"
    "rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode\n"
    "dt = time.perf_counter() - t0\n"
    "print(rc, dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
)
_PARSE_ONLY = (
    "import sys\n"
    "from slurmiso.audit.collect import read_sacct_file\n"
    "from slurmiso.audit.sacct import ParseStats\n"
    "stats = ParseStats()\n"
    "n = sum(1 for _ in read_sacct_file(sys.argv[1], stats))\n"
    "assert n == stats.records and n > 0, n\n"
)
HEADER = ("JobID|JobName|User|Account|Partition|QOS|State|Submit|Eligible|Start|End|ElapsedRaw|"
          "TimelimitRaw|AllocTRES|NodeList|TRESUsageInAve\n")
_KINDS = [  # partition, qos, node prefix, tres, weight
    ("infer", "infer", "gpu0", "billing=4,cpu=4,gres/mps=50,mem=16G,node=1", 30),
    ("mixed", "infer", "gpu02", "billing=4,cpu=4,gres/gpu:3g.40gb=1,gres/gpu=1,mem=16G,node=1",
     10),
    ("train", "train", "gpu04", "billing=32,cpu=32,gres/gpu:a100=8,gres/gpu=8,mem=512G,node=1",
     35),
    ("elastic", "train", "gpu05", "billing=8,cpu=8,gres/shard=3,mem=64G,node=1", 15),
    ("train", "debug", "gpu06", "billing=8,cpu=8,gres/gpu=1,mem=64G,node=1", 10),
]


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(ts))


def write_sacct(path: str, records: int, seed: int = 7) -> int:
    """The synthetic file; returns the number of lines written."""
    rnd = random.Random(seed)
    kinds = [k for k in _KINDS for _ in range(k[4])]
    t0 = time.time() - 30 * 86400
    lines = 0
    job = 1000
    with open(path, "w") as fh:
        fh.write(HEADER)
        out: List[str] = []
        for i in range(records):
            part, qos, pfx, tres, _ = kinds[rnd.randrange(len(kinds))]
            job += 1
            jid = str(job)
            r = rnd.random()
            if r < 0.05:
                jid = f"{job - rnd.randrange(1, 50)}_{rnd.randrange(100)}"
            elif r < 0.06:
                jid = f"{job}+{rnd.randrange(2)}"
            submit = t0 + i * 2.5
            start = submit + int(rnd.expovariate(1 / 300))
            run = int(rnd.expovariate(1 / 3600)) + 1
            s = rnd.random()
            state = ("COMPLETED" if s < 0.8 else "FAILED" if s < 0.88 else "PREEMPTED"
                     if s < 0.95 and qos == "train" else "CANCELLED by 1001" if s < 0.97
                     else "TIMEOUT" if s < 0.99 else "OUT_OF_MEMORY")
            node = f"{pfx}{rnd.randrange(10, 99)}"
            out.append(f"{jid}|run-{i % 977}|user{i % 313}|acct{i % 17}|{part}|{qos}|{state}|"
                       f"{_stamp(submit)}|{_stamp(submit)}|{_stamp(start)}|"
                       f"{_stamp(start + run)}|{run}|1440|{tres}|{node}|\n")
            if i % 3 == 0:
                out.append(f"{jid}.batch|batch||acct{i % 17}|||{state.split()[0]}|"
                           f"{_stamp(start)}|{_stamp(start)}|{_stamp(start)}|"
                           f"{_stamp(start + run)}|{run}||cpu=4,mem=16G,node=1|{node}|"
                           f"cpu=00:00:05,energy=0,fs/disk=1234,mem=1G\n")
            if len(out) >= 20000:
                lines += len(out)
                fh.writelines(out)
                out.clear()
        lines += len(out)
        fh.writelines(out)
    return lines


def measure(argv: List[str], env: dict) -> Tuple[int, float, float]:
    """(exit code, wall seconds, peak RSS in MB) of ``argv`` run in a fresh process."""
    out = subprocess.run([sys.executable, "-c", _WRAPPER, *argv], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    return int(out[0]), float(out[1]), int(out[2]) / 1024.0


def main() -> bool:
    env = python_env()
    config = os.path.join(ROOT, "etc", "slurmiso.yaml")
    with tempfile.TemporaryDirectory(prefix="slurmiso-bench-audit-") as tmp:
        path = os.path.join(tmp, "sacct.txt")
        journal = os.path.join(tmp, "journal.jsonl")
        open(journal, "w").close()
        t = time.perf_counter()
        lines = write_sacct(path, RECORDS)
        size = os.path.getsize(path) / 1e6
        print(f"  wrote {RECORDS:,} records ({lines:,} lines, {size:.0f} MB) in "
              f"{time.perf_counter() - t:.1f}s")
        parse = [sys.executable, "-c", _PARSE_ONLY, path]
        audit = [sys.executable, "-m", "slurmiso", "-c", config, "audit", "--sacct-file", path,
                 "--journal", journal, "--format", "json", "-o", os.path.join(tmp, "r.json")]
        prc, parse_s, parse_mb = measure(parse, env)
        arc, audit_s, audit_mb = measure(audit, env)
        if prc != 0 or arc not in (0, 1):
            raise SystemExit(f"benchmark command failed: parse rc={prc}, audit rc={arc}")
    ok_t = report(f"audit {RECORDS:,} records (wall)", f"{audit_s:.1f} s", audit_s / parse_s,
                  f"of parse-only {parse_s:.1f} s")
    ok_m = report("audit peak memory (ru_maxrss)", f"{audit_mb:.0f} MB", audit_mb / parse_mb,
                  f"of parse-only {parse_mb:.0f} MB")
    met_t = audit_s <= TARGET_S * RECORDS / 1_000_000
    met_m = audit_mb <= TARGET_MB
    print(f"  targets: <= {TARGET_S:g} s: {'met' if met_t else 'MISSED'}; "
          f"<= {TARGET_MB:g} MB: {'met' if met_m else 'MISSED'}")
    return ok_t and ok_m and met_t and met_m
