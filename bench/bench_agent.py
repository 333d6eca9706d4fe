"""The agent's answer time under its users' attacks, as a ratio to the same agent idle.

Issue 33 (item 8): one job could silence the agent (a thousand idle connections exhausted its
descriptors) or starve it (heavy answers parsed under the lock a scrape needs, many hanging
endpoints). Here a real ``slurmiso agent`` (simulated node, its own process, a service's
default limit of 1024 descriptors) is scraped the way the monitor does (``scrape.get``),
first idle (105 honest inference jobs), then with as many jobs under everything at once:
1,000 idle connections held on its port, 8 connections trickling a request a byte at a time,
4 jobs answering 12,000 latency series each (under the 1 MiB size cap) and 100 jobs whose
endpoints hang, with the refresh at 1 s. Reported: the median and 90th percentile answer
times and their ratio to the idle agent's, and how many answers called the jobs' signals
stale (the refresher fell behind). Targets: the median under attack within 3x idle's, no
scrape unanswered, no stale.
``SLURMISO_BENCH_SCRAPES`` (40) changes the scrapes per phase.

Before that, issue 36's host figures: the CPU time and memory one scrape of the host collector
costs at 16 jobs (a recorded cgroup v2 tree, every figure present), against a bare read of the
same files in the same run (the system calls alone, nothing parsed): what parsing, checking
and rendering add. ``python3 bench/bench_agent.py host`` runs that part alone.

And the agent's whole scrape, as issue 36 asks: 8 GPUs and 16 jobs (two MPS jobs of each
GPU, each with a registered process holding memory, the host figures of the same 16 jobs'
recorded cgroups): the CPU time and peak allocation of one ``/metrics`` render of the agent's
own registry (GPU series, per-job GPU memory, host figures, restraints) against a bare read of
the same 8 GPUs through the GPU backend (device, telemetry, processes) in the same run. The
GPUs are the simulated backend's here (no GPU on the build box): on a node the bare read is
NVML's, whose calls cost more than the simulated node's one JSON read, so the ratio printed
is an upper bound of the agent's overhead.
"""

from __future__ import annotations

import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, List, Tuple

from common import ROOT, python_env, report

SCRAPES = int(os.environ.get("SLURMISO_BENCH_SCRAPES", "40"))
HANG = 60.0  # seconds: only guards a hang
HEAVY_JOBS, HEAVY_SERIES, HANGING_JOBS, IDLE_CONNS, TRICKLERS = 4, 12_000, 100, 1000, 8

ENDPOINTS = r'''
import http.server, sys, threading, time
B = "vllm:e2e_request_latency_seconds_bucket"
def vllm(n):
    out = [f'{B}{{le="{le}",model_name="m"}} {n * (i + 1)}\n'
           for i, le in enumerate(("0.1", "0.5", "1.0", "+Inf"))]
    out.append(f'vllm:request_success_total{{finished_reason="stop",model_name="m"}} {4 * n}\n')
    return "".join(out)
HEAVY = "".join(f'{B}{{le="{(i % 20 + 1) / 10:.1f}",model_name="m{i // 20}"}} {i}\n'
                for i in range(int(sys.argv[1]))).encode()
count = [0]
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/hang":
            time.sleep(3600)
            return
        count[0] += 1
        body = HEAVY if self.path == "/heavy" else vllm(count[0]).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer.request_queue_size = 1024
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
s.daemon_threads = True
print(s.server_address[1], flush=True)
s.serve_forever()
'''


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait(what: str, cond: Callable[[], bool]) -> None:
    end = time.monotonic() + HANG
    while not cond():
        if time.monotonic() > end:
            raise SystemExit(f"bench_agent: never reached: {what}")
        time.sleep(0.02)


def _records(state_dir: str, port: int, attack: bool) -> None:
    from slurmiso.state import NodeState
    from slurmiso.state.record import JobRecord, RecordStatus

    def rec(job: str, path: str) -> JobRecord:
        return JobRecord(job, RecordStatus.READY, uid=os.getuid(), job_class="infer",
                         metrics=f"{port}{path}")

    st = NodeState(state_dir)  # as many jobs either way: the answers are the same size
    st.write_job("41", rec("41", "/ok"))
    for j in range(HEAVY_JOBS):
        st.write_job(str(100 + j), rec(str(100 + j), "/heavy" if attack else "/ok"))
    for j in range(HANGING_JOBS):
        st.write_job(str(200 + j), rec(str(200 + j), "/hang" if attack else "/ok"))


def _agent(cfg: str, port: int) -> subprocess.Popen[bytes]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    p = subprocess.Popen([sys.executable, "-m", "slurmiso", "--config", cfg, "agent", "--node",
                          "node1", "--port", str(port), "--addr", "127.0.0.1"],
                         env=python_env(), preexec_fn=limit, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    from slurmiso.agent import port_owners as ports

    _wait("the agent listens", lambda: p.poll() is not None or port in (
        ports.loopback_listeners() or {}))
    if p.poll() is not None:
        raise SystemExit("bench_agent: the agent did not start")
    return p


def _attack(port: int, stop: threading.Event) -> List[socket.socket]:
    """Idle connections held as an attacker holds them (each waits for its handshake), and
    tricklers that send a byte of a request every 0.2 s, reconnecting when closed."""
    held: List[socket.socket] = []
    failed = 0
    while len(held) < IDLE_CONNS and failed < 3:  # three in a row: the port is full
        try:
            held.append(socket.create_connection(("127.0.0.1", port), timeout=2.0))
            failed = 0
        except OSError:
            failed += 1

    def trickle() -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2.0) as c:
                    while not stop.wait(0.2):
                        c.send(b"G")
            except OSError:
                continue

    for _ in range(TRICKLERS):
        threading.Thread(target=trickle, daemon=True).start()
    return held


def _scrapes(port: int) -> Tuple[List[float], int, int]:
    """(answer times of the answered scrapes, unanswered, answers with stale signals)."""
    from slurmiso.exposition import scrape

    times: List[float] = []
    missed = stale = 0
    for _ in range(SCRAPES):
        t0 = time.perf_counter()
        try:
            body = scrape.get(f"http://127.0.0.1:{port}/metrics", 10.0)
        except OSError:
            missed += 1
            continue
        times.append(time.perf_counter() - t0)
        stale += 'reason="stale"' in body
        time.sleep(0.25)  # the monitor scrapes now and then, not in a loop
    return times, missed, stale


def _phase(tmp: str, endpoints_port: int, attack: bool) -> Tuple[List[float], int, int]:
    from tests.hookctx import write_config

    cfg = write_config(tmp, "timeslice", monitor={"signals": {"refresh": "1s"}})
    state_dir = os.path.join(tmp, "state", "node1")
    _records(state_dir, endpoints_port, attack)
    port = _free_port()
    agent = _agent(cfg, port)
    stop = threading.Event()
    held: List[socket.socket] = []
    try:
        if attack:
            held = _attack(port, stop)
        time.sleep(3.0)  # three refreshes: the heavy answers parsed, backoffs begun
        return _scrapes(port)
    finally:
        stop.set()
        for s in held:
            s.close()
        agent.terminate()
        agent.wait(timeout=HANG)


HOST_JOBS, HOST_ROUNDS = 16, 200


def _host_tree(tmp: str) -> Tuple[str, List[str]]:
    """A v2 root with HOST_JOBS copies of the recorded job_4242 in n1's stepd scope."""
    import shutil

    fixtures = os.path.join(ROOT, "tests", "fixtures", "host")
    root = os.path.join(tmp, "cgroup")
    scope = os.path.join(root, "system.slice", "n1_slurmstepd.scope")
    os.makedirs(scope)
    with open(os.path.join(root, "cgroup.controllers"), "w") as fh:
        fh.write("cpu io memory\n")
    files: List[str] = []
    for j in range(HOST_JOBS):
        job = os.path.join(scope, f"job_{1000 + j}")
        shutil.copytree(os.path.join(fixtures, "v2", "job_4242"), job)
        files += [os.path.join(job, n) for n in (
            "cpu.stat", "memory.current", "memory.peak", "memory.events", "io.stat",
            "cpu.pressure", "memory.pressure", "io.pressure")]
    proc = os.path.join(fixtures, "proc")
    files += [os.path.join(proc, "pressure", n) for n in ("cpu", "memory", "io")]
    files += [os.path.join(proc, "net", "dev"), os.path.join(fixtures, "sys", "class", "net",
                                                             "eth0", "speed")]
    return root, files


def cpu_and_peak(fns: Dict[str, Callable[[], None]], rounds: int,
                 traced: str) -> Tuple[Dict[str, float], int]:
    """Each function's CPU seconds a call (interleaved, best of three runs of ``rounds``) and
    the peak bytes one call of ``traced`` allocates."""
    import tracemalloc

    best: Dict[str, float] = {}
    for name, fn in list(fns.items()) * 3:
        t0 = time.process_time()
        for _ in range(rounds):
            fn()
        cpu = (time.process_time() - t0) / rounds
        best[name] = min(best.get(name, cpu), cpu)
    tracemalloc.start()
    fns[traced]()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return best, peak


def host_cost() -> bool:
    """One host-collector scrape at HOST_JOBS jobs against a bare read of its files."""
    from prometheus_client import CollectorRegistry, generate_latest

    from slurmiso.agent.host_figures import HostCollector, gather_host

    fixtures = os.path.join(ROOT, "tests", "fixtures", "host")
    with tempfile.TemporaryDirectory() as tmp:
        root, files = _host_tree(tmp)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(HostCollector(lambda: gather_host(
            {}, "n1", root, os.path.join(fixtures, "proc"), os.path.join(fixtures, "sys")),
            "n1"))
        text = generate_latest(registry).decode()
        assert text.count("slurmiso_job_cpu_seconds_total{") == HOST_JOBS, "the premise"
        assert "slurmiso_job_host_figure_unknown{" not in text, "every figure present"

        def bare() -> None:
            for path in files:
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.read(fd, 65536)
                finally:
                    os.close(fd)

        def host() -> None:
            generate_latest(registry)

        best, peak = cpu_and_peak({"bare": bare, "host": host}, HOST_ROUNDS, "host")
    print(f"bare read of the same {len(files)} files: {1e6 * best['bare']:.0f} us CPU a scrape")
    report(f"host figures, {HOST_JOBS} jobs (CPU a scrape)", f"{1e3 * best['host']:.2f} ms",
           best["host"] / best["bare"], "of a bare read")
    print(f"host figures, {HOST_JOBS} jobs: {peak / 1024:.0f} KiB allocated at peak a scrape")
    return True


AGENT_GPUS = 8


def _agent_node(tmp: str, cgroup_root: str) -> Tuple[object, object, str]:
    """A config, 8 simulated H100s with two MPS jobs each (their records, their processes)
    and the job ids of the recorded cgroups: (config, backend, node)."""
    import yaml

    from slurmiso.config import load_config
    from slurmiso.gpu.sim import SimBackend, init_state
    from slurmiso.state import NodeState
    from slurmiso.state.record import JobRecord

    node, sim = "n1", os.path.join(tmp, "sim.json")
    init_state(sim, "H100-80GB", AGENT_GPUS, node=node, force=True)
    data = {"version": 1,
            "paths": {"state_dir": f"{tmp}/state", "journal": f"{tmp}/journal.jsonl"},
            "gpu": {"backend": "sim", "sim_state": sim},
            "classes": [{"name": "infer", "match": {"qos": ["infer"]}, "isolation": "mps"},
                        {"name": "train", "match": {"qos": ["train"]}, "isolation": "mps",
                         "preemptible": True}],
            "pools": [{"name": "p", "nodes": node, "partition": "part",
                       "gpu_model": "H100-80GB", "gpus_per_node": AGENT_GPUS,
                       "mode": "mps"}]}
    path = os.path.join(tmp, "slurmiso.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    cfg = load_config(path)
    state = NodeState(cfg.paths.state_dir)
    state.ensure()
    backend = SimBackend(sim)
    for j in range(HOST_JOBS):
        job, gpu = str(1000 + j), j // 2
        state.write_job(job, JobRecord.from_dict({
            "job_id": job, "uid": 1001, "user": "u", "node": node, "pool": "p", "mode": "mps",
            "class": "infer" if j % 2 == 0 else "train", "status": "ready",
            "resources": [{"kind": "mps", "state": "ready", "gpu": gpu}]}))
        backend.add_process(gpu, 400_000 + j, 8_000 + j, name="python")
    return cfg, backend, node


def agent_cost() -> bool:
    """One whole ``/metrics`` render at 8 GPUs and 16 jobs against a bare GPU read."""
    from prometheus_client import generate_latest

    from slurmiso.agent.serve import registry_for

    with tempfile.TemporaryDirectory() as tmp:
        root, _ = _host_tree(tmp)
        cfg, backend, node = _agent_node(tmp, root)
        registry = registry_for(cfg, node, cgroup_root=root)  # type: ignore[arg-type]
        text = generate_latest(registry).decode()
        assert text.count("slurmiso_job_cpu_seconds_total{") == HOST_JOBS, "host premise"
        assert text.count("slurmiso_gpu_memory_used_bytes{") >= AGENT_GPUS, "GPU premise"

        def bare() -> None:
            for i in range(AGENT_GPUS):
                backend.device(i)  # type: ignore[attr-defined]
                backend.telemetry(i)  # type: ignore[attr-defined]
            backend.processes()  # type: ignore[attr-defined]

        def scrape() -> None:
            generate_latest(registry)

        best, peak = cpu_and_peak({"bare": bare, "agent": scrape}, 50, "agent")
    print(f"bare read of the same {AGENT_GPUS} GPUs (simulated backend): "
          f"{1e3 * best['bare']:.2f} ms CPU")
    report(f"agent scrape, {AGENT_GPUS} GPUs + {HOST_JOBS} jobs (CPU a scrape)",
           f"{1e3 * best['agent']:.2f} ms", best["agent"] / best["bare"],
           "of a bare GPU read")
    print(f"agent scrape, {AGENT_GPUS} GPUs + {HOST_JOBS} jobs: {peak / 1024:.0f} KiB "
          "allocated at peak")
    return True


def main() -> bool:
    sys.path.insert(0, ROOT)
    host_cost()
    if sys.argv[1:] == ["host"]:
        return True
    agent_cost()
    if sys.argv[1:] == ["scrape"]:
        return True
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < 4 * IDLE_CONNS:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(4 * IDLE_CONNS, hard), hard))
    endpoints = subprocess.Popen([sys.executable, "-c", ENDPOINTS, str(HEAVY_SERIES)],
                                 stdout=subprocess.PIPE)
    try:
        assert endpoints.stdout is not None
        eport = int(endpoints.stdout.readline())
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            idle, idle_missed, _ = _phase(a, eport, attack=False)
            hit, missed, stale = _phase(b, eport, attack=True)
    finally:
        endpoints.kill()
        endpoints.wait()
    if not idle or not hit:
        print(f"agent answered no scrape: idle {len(idle)}, attacked {len(hit)}")
        return False
    i50, h50 = statistics.median(idle), statistics.median(hit)
    i90 = statistics.quantiles(idle, n=10)[-1] if len(idle) > 1 else idle[0]
    h90 = statistics.quantiles(hit, n=10)[-1] if len(hit) > 1 else hit[0]
    print(f"idle agent: median {1000 * i50:.1f} ms, p90 {1000 * i90:.1f} ms over {len(idle)}")
    ok = report("agent answer under attack (median)", f"{1000 * h50:.1f} ms", h50 / i50,
                "of the idle agent's", 3.0)
    report("agent answer under attack (p90)", f"{1000 * h90:.1f} ms", h90 / i90,
           "of the idle agent's")
    print(f"unanswered scrapes: idle {idle_missed}, attacked {missed} of {SCRAPES} each; "
          f"answers with stale signals: {stale} of {len(hit)}")
    return ok and missed == 0 and idle_missed == 0 and stale == 0


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
