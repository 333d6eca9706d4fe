"""The host series' names: what ``slurmiso agent`` exports about each job's cgroup and about the
node (issue 36), so that the agent and any reader use one spelling.

Per job (labels ``job``, ``class``, ``node``): counters are cumulative since the job's cgroup
was made (a requeued job starts again at 0); PSI averages are ratios 0..1 (the kernel's % / 100).
A figure that could not be read has **no sample**, never 0, and one
:data:`M_JOB_HOST_UNKNOWN` line per figure says why: :data:`R_NO_CGROUP` (a recorded job whose
cgroup Slurm's layout does not show), :data:`R_CGROUP_V1` (cgroup v1 has no such figure: PSI,
the ``oom`` and ``high`` memory events) or :data:`R_UNREADABLE` (missing, malformed, out of
range). Network has no per-cgroup counter: NIC bytes are per node only.
"""

from __future__ import annotations

from typing import Tuple

#: 1 if the host figures could be read this scrape (``node``).
M_HOST_UP = "slurmiso_agent_host_up"

M_JOB_CPU = "slurmiso_job_cpu_seconds_total"
M_JOB_CPU_THROTTLED = "slurmiso_job_cpu_throttled_seconds_total"
M_JOB_CPU_PERIODS = "slurmiso_job_cpu_periods_total"
M_JOB_CPU_THROTTLED_PERIODS = "slurmiso_job_cpu_throttled_periods_total"
M_JOB_MEM_CURRENT = "slurmiso_job_memory_current_bytes"
M_JOB_MEM_PEAK = "slurmiso_job_memory_peak_bytes"
#: ``event``: oom, oom_kill, high, max (memory.events; v1: oom_kill, and failcnt as max).
M_JOB_MEM_EVENTS = "slurmiso_job_memory_events_total"
#: ``direction``: read, write.
M_JOB_IO_BYTES = "slurmiso_job_io_bytes_total"
M_JOB_IO_OPS = "slurmiso_job_io_ops_total"
#: ``resource`` (cpu, memory, io), ``kind`` (some, full): the 10 s average, a ratio.
M_JOB_PSI = "slurmiso_job_pressure_avg10_ratio"
M_JOB_PSI_STALLED = "slurmiso_job_pressure_stalled_seconds_total"
#: ``figure``, ``reason``: 1 per figure of a job that has no sample.
M_JOB_HOST_UNKNOWN = "slurmiso_job_host_figure_unknown"

M_NODE_PSI = "slurmiso_node_pressure_avg10_ratio"
M_NODE_PSI_STALLED = "slurmiso_node_pressure_stalled_seconds_total"
#: ``device``, ``direction`` (receive, transmit): /proc/net/dev.
M_NODE_NET_BYTES = "slurmiso_node_network_bytes_total"
#: ``device``: link speed in bytes/s (absent where the kernel does not know it).
M_NODE_NET_SPEED = "slurmiso_node_network_speed_bytes_per_second"

L_JOB, L_CLASS, L_NODE = "job", "class", "node"
L_EVENT, L_DIRECTION, L_RESOURCE, L_KIND = "event", "direction", "resource", "kind"
L_DEVICE, L_FIGURE, L_REASON = "device", "figure", "reason"

R_NO_CGROUP = "no-cgroup"
R_CGROUP_V1 = "cgroup-v1"
R_UNREADABLE = "unreadable"

MEMORY_EVENTS: Tuple[str, ...] = ("oom", "oom_kill", "high", "max")
RESOURCES: Tuple[str, ...] = ("cpu", "memory", "io")

#: Every per-job host series, in the order the agent writes them.
JOB_SERIES: Tuple[str, ...] = (
    M_JOB_CPU, M_JOB_CPU_THROTTLED, M_JOB_CPU_PERIODS, M_JOB_CPU_THROTTLED_PERIODS,
    M_JOB_MEM_CURRENT, M_JOB_MEM_PEAK, M_JOB_MEM_EVENTS, M_JOB_IO_BYTES, M_JOB_IO_OPS,
    M_JOB_PSI, M_JOB_PSI_STALLED, M_JOB_HOST_UNKNOWN,
)
NODE_SERIES: Tuple[str, ...] = (M_NODE_PSI, M_NODE_PSI_STALLED, M_NODE_NET_BYTES,
                                M_NODE_NET_SPEED)
