"""``slurmiso-oci-gate``: refuse a container that would run outside its job's GPU share.

oci.conf's ``RunTimeRun`` calls it in front of the runtime (``slurmiso gen oci-conf`` writes
the line)::

    RunTimeRun="/usr/bin/slurmiso-oci-gate %n %b crun ... run --bundle %b %n.%u.%j.%s.%t"

By then slurmstepd (23.02 and later) has written the step's final config.json into ``%b``:
the bundle's mounts followed by Slurm's, and the step's environment after GRES and the
TaskProlog. The gate reads that file as the job's user and either execs the runtime
unchanged or exits 1 with one line saying why, so the program never starts:

- on a node of a slurmiso pool, everything the TaskProlog exported for the job (read from
  the job's record, ready or refused) must be in the container's environment unchanged,
  whatever that environment claims; where the record cannot be read, only a container
  that says it was refused (no GPU) runs. Slurm 22.05 writes config.json before the
  TaskProlog runs, and an ``EnvExclude`` can drop its exports;
- an MPS client (``CUDA_MPS_PIPE_DIRECTORY`` set) must see that directory bound from the same
  host path (:func:`slurmiso.slurm.ocispec.pipe_reachable`), or CUDA would not use the job's
  daemon and its limits.

Slurm signals the step's task, the runtime, which forwards them to the program inside
(crun: measured for SIGTERM, SIGUSR2, SIGURG) but not SIGWINCH, the ladder's unthrottle. For
a class the ladder throttles the gate therefore stays as the runtime's parent and relays
(:mod:`slurmiso.hooks.oci_relay`); for the others it execs the runtime in its place.

A requeued job runs again under the same container name (``%n.%u.%j.%s.%t`` holds no
restart count), and a runtime killed with SIGKILL (a preemption whose grace ran out) leaves
its state behind: the next attempt would fail with "container already exists". The gate
deletes such a stopped container of the same name first, and says so.

The config.json is the user's file: anything unreadable is a refusal. The gate catches a
bundle that would silently run unisolated; the device cgroup, which a container's processes
stay in, is still what a hostile job cannot undo (docs/admin-guide.md, "Containers").
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from slurmiso.errors import SlurmisoError

USAGE = "usage: slurmiso-oci-gate NODE BUNDLE RUNTIME [ARG...]  (oci.conf's RunTimeRun)"
FIX = "add the mounts 'slurmiso gen oci-conf --config-json' prints to the bundle's config.json"


class Unreadable(ValueError):
    """The config.json cannot be read as the runtime spec says."""


class Refused(SlurmisoError):
    """The container must not start; the message says why."""


def container_env(config: Any) -> Dict[str, str]:
    """``process.env`` of a parsed config.json as a dict (the last entry of a name wins)."""
    process = config.get("process") if isinstance(config, Mapping) else None
    env = process.get("env", []) if isinstance(process, Mapping) else None
    if not isinstance(env, list) or not all(isinstance(e, str) for e in env):
        raise Unreadable("its process.env is not a list of strings")
    out: Dict[str, str] = {}
    for entry in env:
        name, sep, value = entry.partition("=")
        if sep:
            out[name] = value
    return out


def refusal(config: Any, managed: bool,
            expected: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """Why this container must not start, or None (pure: unit-tested with config.json
    fixtures). ``expected``: what the TaskProlog exported for the job, every name of which
    the container must carry unchanged, whatever its environment claims; None when the
    record could not be read, where only a container that says it was refused may run."""
    from slurmiso.slurm.ocispec import pipe_reachable

    try:
        env = container_env(config)
    except Unreadable as exc:
        return f"cannot read the container's config.json: {exc}"
    if managed:
        reason = _lost_exports(env, expected)
        if reason:
            return reason
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "")
    if pipe:
        verdict = pipe_reachable(config, pipe)
        if not verdict.reachable:
            return f"{verdict.reason}; CUDA would not use the job's MPS daemon: {FIX}"
    return None


def _lost_exports(env: Mapping[str, str], expected: Optional[Mapping[str, str]]) -> str:
    """Why the container's environment is not the one the TaskProlog gave the job ("")."""
    if expected is not None:
        lost = sorted(k for k, v in expected.items() if env.get(k) != v)
        if not lost:
            return ""
        return (f"the container's environment lacks or changes {', '.join(lost)} as the "
                "TaskProlog set them (Slurm 22.05 writes config.json before the TaskProlog "
                "runs; on 23.02 and later an oci.conf EnvExclude may drop them), so its GPU "
                "share would not hold inside: 'slurmiso doctor' checks oci.conf")
    if "SLURMISO_REFUSED" in env and "SLURMISO_CLASS" not in env:
        return ""  # refused: its device cgroup holds no GPU, nothing inside to protect
    if "SLURMISO_CLASS" in env:
        return "cannot read this job's isolation record to check the container against it"
    return ("slurmiso's TaskProlog exports are not in the container's environment (Slurm "
            "22.05 writes config.json before the TaskProlog runs; on 23.02 and later an "
            "oci.conf EnvExclude may drop them), so its GPU share would not hold inside: run "
            "it on Slurm 23.02 or later with 'slurmiso gen oci-conf'")


@dataclass(frozen=True)
class Job:
    """What the node's config and records say of the container's job."""

    managed: bool  # the node is in a slurmiso pool (or the config is unreadable)
    relay: bool  # its class may be throttled by the ladder (preemptible)
    expected: Optional[Dict[str, str]]  # what the TaskProlog exported; None: unread


def read_job(node: str, env: Mapping[str, str]) -> Job:
    """The job as root's record has it: read as the TaskProlog reads it, as the job's user,
    and only a record of this user's job (no record: what the TaskProlog then exported, a
    refusal). Unknown (no readable config) is a managed node: the gate is only installed on
    slurmiso's nodes, and unknown is never calm. ``relay`` follows the record's class."""
    from slurmiso.hooks.task_prolog import exports_of

    try:
        from slurmiso.config import load_config

        cfg = load_config()
    except Exception:  # noqa: BLE001 - any config failure: judge the container strictly
        return Job(True, False, None)
    if cfg.pool_for_node(node) is None:
        return Job(False, False, None)
    try:
        from slurmiso.slurm.jobenv import JobEnvironment
        from slurmiso.state import NodeState

        job = JobEnvironment.from_env(env)
        rec = NodeState(cfg.paths.state_dir_for(node)).read_job(job.job_id)
    except Exception:  # noqa: BLE001 - unreadable: only a refused container runs
        return Job(True, False, None)
    if rec is not None and rec.uid != os.getuid():
        return Job(True, False, None)
    expected = exports_of(rec, job.job_id)
    job_class = cfg.job_class(expected.get("SLURMISO_CLASS", ""))
    return Job(True, job_class is not None and job_class.preemptible, expected)


def clear_stale(runtime: Sequence[str], timeout: float = 10.0) -> str:
    """Delete a *stopped* container left under this run's name ("" if none): ``runtime`` is
    ``RT [GLOBAL...] run [OPTS...] NAME``; its state and delete commands take the same global
    options. A running one is left alone (the runtime then refuses the run itself)."""
    import json
    import subprocess

    from slurmiso.hooks.oci_relay import runtime_command

    try:
        cp = subprocess.run(runtime_command(runtime, "state"), capture_output=True,
                            text=True, timeout=timeout, check=False)
        if cp.returncode != 0:
            return ""  # no such container: the usual case
        status = json.loads(cp.stdout).get("status", "")
        if status != "stopped":
            return ""  # running, paused, created: the runtime refuses the run itself
        subprocess.run(runtime_command(runtime, "delete", "--force"), capture_output=True,
                       timeout=timeout, check=True)
    except (OSError, ValueError, AttributeError, subprocess.SubprocessError):
        return ""  # no "run" verb, or the run itself will say what is wrong
    return f"removed the stopped container {runtime[-1]} an earlier attempt left"


def read_config(bundle: str, limit: int = 1 << 20) -> Any:
    """The bundle's config.json, parsed; Unreadable if missing, too large or not JSON."""
    import json

    path = os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise Unreadable(f"cannot open {path}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise Unreadable(f"{path} is not a regular file")
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise Unreadable(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > limit:
        raise Unreadable(f"{path} is over {limit} bytes; not read")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Unreadable(f"{path} is not JSON ({str(exc)[:80]})") from exc


def verdict(node: str, bundle: str) -> Job:
    """Read the step's config.json and the job's record: the job, or Refused saying why."""
    try:
        config = read_config(bundle)
        env = container_env(config)
    except Unreadable as exc:
        raise Refused(f"cannot read the container's config.json: {exc}") from None
    job = read_job(node, env)
    reason = refusal(config, job.managed, job.expected)
    if reason:
        raise Refused(reason)
    return job


def main(argv: Optional[Sequence[str]] = None) -> int:
    args: List[str] = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"]):
        print(USAGE + "\n\n" + (__doc__ or "").split("\n\n", 1)[1].strip())
        return 0
    if len(args) < 3 or args[0].startswith("-"):
        print(USAGE, file=sys.stderr)
        return 2
    node, bundle, runtime = args[0], args[1], args[2:]
    try:
        job = verdict(node, bundle)
    except Refused as exc:
        print(f"slurmiso: container refused: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    cleared = clear_stale(runtime)
    if cleared:
        print(f"slurmiso: {cleared}", file=sys.stderr)
    try:
        if job.relay:
            from slurmiso.hooks import oci_relay

            return oci_relay.run(runtime)
        import signal

        for name in ("SIGPIPE", "SIGXFSZ"):  # Python ignores them; the runtime must not
            signal.signal(getattr(signal, name), signal.SIG_DFL)
        os.execvp(runtime[0], runtime)
    except OSError as exc:
        print(f"slurmiso: cannot run the container runtime {runtime[0]!r}: {exc.strerror}",
              file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
