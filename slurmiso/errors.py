"""slurmiso's one exception tree.

Every error a user or admin can meet is a :class:`SlurmisoError` whose message says what is
wrong and how to fix it. Low-level errors (``pynvml.NVMLError``, ``CalledProcessError``,
``OSError``) are translated into this tree at exactly one place per adapter; the CLI maps the
tree to exit codes in one table (:data:`EXIT_CODES`), and the hooks map it to Slurm policy
(node fault -> non-zero exit drains the node; job problem -> the job alone is refused).

    SlurmisoError
    +-- ConfigError                 bad or missing configuration (exit 2)
    +-- UsageError                  bad command-line input (exit 2)
    +-- StateError                  node-local state dir unreadable/corrupt/locked (exit 3)
    +-- GpuError                    anything from a GPU backend (exit 4)
    |   +-- GpuUnavailable          backend cannot be reached (no driver, NVML init fails)
    |   +-- GpuNotFound             device/instance does not exist (NVML_ERROR_NOT_FOUND)
    |   +-- GpuInsufficientResources  profile/placement does not fit (INSUFFICIENT_RESOURCES)
    |   +-- GpuInUse                instance busy, mode change refused (NVML_ERROR_IN_USE)
    |   +-- GpuNotSupported         operation unsupported on this GPU (NVML_ERROR_NOT_SUPPORTED)
    |   +-- GpuLost                 GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)
    |   +-- CheckpointRefused       cuda-checkpoint refused or failed an action on a process
    +-- SlurmError                  Slurm command failed or returned unexpected output (exit 5)
    |   +-- SlurmUnavailable        slurmctld/slurmdbd not reachable
    +-- SandboxError                the local test cluster could not be set up (exit 6)
    +-- ProbeError                  a probe workload failed, hung or printed nothing usable
    +-- JobProblem                  hooks: this job cannot get its GPU share; refuse the job
    +-- NodeFault                   hooks: the node's GPUs are not trustworthy; drain the node
    +-- HostLimitError              a host rate-limit write to a job's cgroup failed
        +-- HostLimitRefused        refused before writing: outside the job's cgroup, a symlink
"""

from __future__ import annotations

from typing import Dict, Type


class SlurmisoError(Exception):
    """Root of slurmiso's errors; ``str(err)`` is a complete user-facing message."""

    #: Short, stable name used in JSON output and journal records.
    kind = "error"

    def __init__(self, message: str, *, hint: str = "") -> None:
        self.message = message
        self.hint = hint
        super().__init__(message)

    def __str__(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class ConfigError(SlurmisoError):
    """A configuration file is missing, malformed or inconsistent.

    ``problems`` holds one line per problem so ``check-config`` can show them all at once.
    """

    kind = "config"

    def __init__(
        self, message: str, *, problems: list[str] | None = None, hint: str = ""
    ) -> None:
        self.problems = list(problems or [])
        super().__init__(message, hint=hint)

    def __str__(self) -> str:
        if not self.problems:
            return super().__str__()
        return "\n".join([self.message] + ["  " + p for p in self.problems])


class UsageError(SlurmisoError):
    kind = "usage"


class StateError(SlurmisoError):
    kind = "state"


class GpuError(SlurmisoError):
    kind = "gpu"


class GpuUnavailable(GpuError):
    kind = "gpu-unavailable"


class GpuNotFound(GpuError):
    kind = "gpu-not-found"


class GpuInsufficientResources(GpuError):
    kind = "gpu-insufficient-resources"


class GpuInUse(GpuError):
    kind = "gpu-in-use"


class GpuNotSupported(GpuError):
    kind = "gpu-not-supported"


class GpuLost(GpuError):
    kind = "gpu-lost"


class CheckpointRefused(GpuError):
    """cuda-checkpoint refused or failed an action on one process; the message says why."""

    kind = "checkpoint-refused"


class SlurmError(SlurmisoError):
    kind = "slurm"


class SlurmUnavailable(SlurmError):
    kind = "slurm-unavailable"


class SandboxError(SlurmisoError):
    kind = "sandbox"


class ProbeError(SlurmisoError):
    """A probe workload (the site's command or the built-in one) failed, hung or printed
    nothing the output contract reads; the message names the command and its output files."""

    kind = "probe"


class JobProblem(SlurmisoError):
    """The job cannot get its GPU share; refuse the job, keep the node."""

    kind = "job-problem"


class NodeFault(SlurmisoError):
    """The node's GPUs are not in a state slurmiso can vouch for; drain the node."""

    kind = "node-fault"


class HostLimitError(SlurmisoError):
    """A host rate-limit write failed; the message names the file and the cause."""

    kind = "host-limit"


class HostLimitRefused(HostLimitError):
    """A write was refused before touching anything: outside the roots, a symlink, a file
    the rung must not write."""

    kind = "host-limit-refused"


#: CLI exit code per error class; the most specific class in the MRO wins.
EXIT_CODES: Dict[Type[SlurmisoError], int] = {
    SlurmisoError: 1,
    ConfigError: 2,
    UsageError: 2,
    StateError: 3,
    GpuError: 4,
    SlurmError: 5,
    SandboxError: 6,
}


def exit_code_for(err: SlurmisoError) -> int:
    """Exit code for ``err``: the entry of its nearest class in :data:`EXIT_CODES`."""
    for cls in type(err).__mro__:
        if cls in EXIT_CODES:
            return EXIT_CODES[cls]
    return 1
