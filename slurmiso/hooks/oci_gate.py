"""``slurmiso-oci-gate``: refuse a container that would run outside its job's GPU share.

oci.conf's ``RunTimeRun`` calls it in front of the runtime (``slurmiso gen oci-conf`` writes
the line)::

    RunTimeRun="/usr/bin/slurmiso-oci-gate %n %b crun ... run --bundle %b %n.%u.%j.%s.%t"

By then slurmstepd (23.02 and later) has written the step's final config.json into ``%b``:
the bundle's mounts followed by Slurm's, and the step's environment after GRES and the
TaskProlog. The gate reads that file as the job's user and either execs the runtime
unchanged or exits 1 with one line saying why, so the program never starts:

- on a node of a slurmiso pool, the TaskProlog's verdict (``SLURMISO_CLASS`` or
  ``SLURMISO_REFUSED``) must be in the container's environment: Slurm 22.05 writes
  config.json before the TaskProlog runs, and an ``EnvExclude`` can drop it;
- an MPS client (``CUDA_MPS_PIPE_DIRECTORY`` set) must see that directory bound from the same
  host path (:func:`slurmiso.slurm.ocispec.pipe_reachable`), or CUDA would not use the job's
  daemon and its limits.

The config.json is the user's file: anything unreadable is a refusal. The gate catches a
bundle that would silently run unisolated; the device cgroup, which a container's processes
stay in, is still what a hostile job cannot undo (docs/admin-guide.md, "Containers").
"""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence

USAGE = "usage: slurmiso-oci-gate NODE BUNDLE RUNTIME [ARG...]  (oci.conf's RunTimeRun)"
FIX = "add the mounts 'slurmiso gen oci-conf --config-json' prints to the bundle's config.json"


class Unreadable(ValueError):
    """The config.json cannot be read as the runtime spec says."""


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


def refusal(config: Any, managed: bool) -> Optional[str]:
    """Why this container must not start, or None (pure: unit-tested with config.json
    fixtures)."""
    from slurmiso.slurm.ocispec import pipe_reachable

    try:
        env = container_env(config)
    except Unreadable as exc:
        return f"cannot read the container's config.json: {exc}"
    if managed and "SLURMISO_CLASS" not in env and "SLURMISO_REFUSED" not in env:
        return ("slurmiso's TaskProlog exports are not in the container's environment "
                "(Slurm 22.05 writes config.json before the TaskProlog runs; on 23.02 and "
                "later an oci.conf EnvExclude may drop them), so its GPU share would not "
                "hold inside: run it on Slurm 23.02 or later with 'slurmiso gen oci-conf'")
    pipe = env.get("CUDA_MPS_PIPE_DIRECTORY", "")
    if pipe:
        verdict = pipe_reachable(config, pipe)
        if not verdict.reachable:
            return f"{verdict.reason}; CUDA would not use the job's MPS daemon: {FIX}"
    return None


def read_config(bundle: str, limit: int = 1 << 20) -> Any:
    """The bundle's config.json, parsed; Unreadable if missing, too large or not JSON."""
    import json

    path = os.path.join(bundle, "config.json")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise Unreadable(f"cannot open {path}: {exc.strerror}") from exc
    if len(data) > limit:
        raise Unreadable(f"{path} is over {limit} bytes; not read")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise Unreadable(f"{path} is not JSON ({str(exc)[:80]})") from exc


def node_managed(node: str) -> bool:
    """Is ``node`` in a slurmiso pool? Unknown (no readable config) counts as yes: the gate
    is only installed on slurmiso's nodes, and unknown is never calm."""
    try:
        from slurmiso.config import load_config

        return load_config().pool_for_node(node) is not None
    except Exception:  # noqa: BLE001 - any config failure: judge the container strictly
        return True


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
        config = read_config(bundle)
    except Unreadable as exc:
        reason: Optional[str] = f"cannot read the container's config.json: {exc}"
    else:
        reason = refusal(config, node_managed(node))
    if reason:
        print(f"slurmiso: container refused: {' '.join(reason.split())}", file=sys.stderr)
        return 1
    try:
        os.execvp(runtime[0], runtime)
    except OSError as exc:
        print(f"slurmiso: cannot run the container runtime {runtime[0]!r}: {exc.strerror}",
              file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
