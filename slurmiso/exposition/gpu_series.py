"""The GPU series' names: slurmiso's own, which ``slurmiso agent`` writes and the monitor's
telemetry reads back, and the DCGM exporter's, which the agent also writes (so dashboards
built for DCGM work) and the monitor reads from a Prometheus server."""

from __future__ import annotations

M_MEM_USED = "slurmiso_gpu_memory_used_bytes"
M_MEM_TOTAL = "slurmiso_gpu_memory_total_bytes"
M_SM = "slurmiso_gpu_sm_active_ratio"
M_GR = "slurmiso_gpu_gr_engine_active_ratio"
M_PROCS = "slurmiso_gpu_processes"
M_COLLECTED = "slurmiso_agent_collected_timestamp_seconds"
M_UP = "slurmiso_agent_up"
DCGM_USED, DCGM_FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
DCGM_SM, DCGM_GR = "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
#: Graphics-engine busy time in percent (not SM activity; not reported on MIG).
DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"
MIB = 1024 * 1024
