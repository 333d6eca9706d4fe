"""``slurmiso agent``: serve this node's GPU and job metrics for the monitor (Prometheus)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "agent",
        help="serve this node's GPU/MIG/job metrics in Prometheus format",
        description=(
            "Every scrape reads the GPU backend and this node's slurmiso records afresh: per "
            "GPU and per MIG instance, memory used/total, SM and engine activity, processes, "
            "with the class as a label (job ids only with monitor.telemetry.job_labels), under "
            "slurmiso's names and the DCGM exporter's; and per job (slurmiso_job_*): the GPUs "
            "and MIG instances it holds, the latency of its --iso-metrics endpoint and its "
            "training step times, read in the background (monitor.signals); its GPU memory per "
            "GPU (its own processes'); its cgroup's CPU, memory, IO and pressure figures, and "
            "the node's pressure and NIC bytes (docs/host-contention.md). The monitor "
            "(telemetry source 'agents') or a Prometheus server scrapes it."
        ),
        epilog="examples:\n  slurmiso agent                 # port from monitor.telemetry."
        "agent_port\n  slurmiso agent --once --node n3  # print one scrape and exit",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--port", type=int, default=0, help="port (default: the config's agent_port)")
    p.add_argument("--addr", default="",
                   help="address to listen on (default: monitor.telemetry.agent_addr, "
                   "127.0.0.1)")
    p.add_argument("--node", default="", help="node name (default: $SLURMD_NODENAME or host)")
    p.add_argument("--once", action="store_true", help="print one scrape to stdout and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slurmiso.agent import serve as agent
    from slurmiso.config import load_config
    from slurmiso.hostlist import node_name

    cfg = load_config(args.config)
    node = node_name(args.node)
    if args.once:
        refresher = agent.signals_for(cfg, node)
        refresher.once()  # one reading: latency needs a second one for its window
        print(agent.render(agent.registry_for(cfg, node, refresher.state)), end="")
        return 0
    agent.serve(cfg, node, args.port or cfg.monitor.telemetry.agent_port, args.addr)
    return 0
