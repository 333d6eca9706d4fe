"""``slurmiso sim``: create and drive a simulated GPU node.

The simulated node is what the hooks, the wrapper and the monitor see when
``SLURMISO_GPU_BACKEND=sim`` (or ``auto`` without a driver): this command plays the hardware
(MIG mode, a GPU falling off the bus) and the workload (memory, utilization, processes).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Dict, List

from slurmiso.errors import GpuNotFound, UsageError

_EPILOG = """\
examples:
  slurmiso sim init --model H100-80GB --gpus 8 --mig --state /tmp/sim/%n.json
  export SLURMISO_SIM_STATE=/tmp/sim/%n.json     # %n = node name ($SLURMD_NODENAME)
  slurmiso sim show
  slurmiso sim create --gpu 0 --profile 3g.40gb --placement 4
  slurmiso sim destroy --gpu 0 --gi 1
  slurmiso sim load --gpu 0 --util 90 --sm 85 --mem 20G    # in a job: the job's shell holds it
  slurmiso sim load --clear
  slurmiso sim mig-mode --gpu all on
  slurmiso sim fault --gpu 1 lost                          # then: slurmiso sim fault --gpu 1 ok

The state file is shared by separate processes (prolog, epilog, job, monitor): every change
holds STATE.lock and is written atomically. A process entry disappears once its pid exits,
as NVML stops reporting a killed job.
"""


def _size(text: str) -> int:
    from slurmiso.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid percentage {text!r}") from exc
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"percentage must be 0-100, not {text}")
    return value


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="create and drive a simulated GPU node (tests, sandbox)",
        description=__doc__.splitlines()[0].split(": ", 1)[1],
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--state",
        metavar="PATH",
        default="",
        help="state file; %%n = node name (default: $SLURMISO_SIM_STATE)",
    )
    sub = parser.add_subparsers(dest="sim_command", metavar="ACTION", required=True)
    for name, adder in _ACTIONS.items():
        adder(sub, common, name)


def _add_init(sub: Any, common: argparse.ArgumentParser, name: str) -> None:
    from slurmiso.gpu.profiles import MODELS

    p = sub.add_parser(
        name,
        parents=[common],
        help="create a fresh simulated node",
        description="Create a fresh simulated node: GPUs idle, no MIG instances.",
    )
    p.add_argument("--model", required=True,
                   help=f"GPU model: {', '.join(MODELS)}; any other name with --memory")
    p.add_argument("--memory", type=_size, metavar="SIZE", default=0,
                   help="memory of a GPU the catalogue lacks, e.g. 24G (no MIG)")
    p.add_argument("--gpus", type=int, default=8, help="number of GPUs (default 8)")
    p.add_argument("--mig", action="store_true", help="start with MIG mode enabled")
    p.add_argument("--node", default="", help="node name (default: $SLURMD_NODENAME or host)")
    p.add_argument("--force", action="store_true", help="replace an existing state file")
    p.set_defaults(func=_cmd_init)


def _add_show(sub: Any, common: argparse.ArgumentParser, name: str) -> None:
    p = sub.add_parser(name, parents=[common], help="show GPUs, MIG instances and processes")
    p.add_argument("--json", action="store_true", help="print the raw state as JSON")
    p.set_defaults(func=_cmd_show)


def _add_load(sub: Any, common: argparse.ArgumentParser, name: str) -> None:
    p = sub.add_parser(
        name,
        parents=[common],
        help="inject utilization, memory and GPU processes",
        description=(
            "Inject activity on a GPU. --util/--sm set the GPU's figures; --mem (or --pid, "
            "--mig-uuid, --name) registers a process entry, by default for the PARENT of this "
            "command (a job's shell), so it vanishes when the job ends."
        ),
    )
    p.add_argument("--gpu", type=int, help="GPU index")
    p.add_argument("--util", type=_percent, metavar="PCT", help="GPU utilization %%")
    p.add_argument("--sm", type=_percent, metavar="PCT", help="SM activity %%")
    p.add_argument("--mem", type=_size, metavar="SIZE", help="process memory, e.g. 20G, 512M")
    p.add_argument("--pid", type=int, help="process id (default: parent of this command)")
    p.add_argument("--mig-uuid", default="", help="MIG device the process runs on")
    p.add_argument("--name", default="", help="process name shown in listings")
    p.add_argument("--process-sm", type=_percent, metavar="PCT",
                   help="the process's SM (3D/compute) utilization %%, as NVML samples it "
                   "per process on a whole GPU")
    p.add_argument(
        "--clear",
        action="store_true",
        help="reset load and forget processes (of --gpu, or of all GPUs)",
    )
    p.set_defaults(func=_cmd_load)


def _add_mig_mode(sub: Any, common: argparse.ArgumentParser, name: str) -> None:
    p = sub.add_parser(name, parents=[common], help="switch MIG mode (refused while busy)")
    p.add_argument("--gpu", required=True, help="GPU index or 'all'")
    p.add_argument("mode", choices=["on", "off"], metavar="on|off")
    p.set_defaults(func=_cmd_mig_mode)


def _add_fault(sub: Any, common: argparse.ArgumentParser, name: str) -> None:
    p = sub.add_parser(name, parents=[common], help="make a GPU fall off the bus, or recover")
    p.add_argument("--gpu", type=int, required=True, help="GPU index")
    p.add_argument("condition", choices=["lost", "ok"], metavar="lost|ok")
    p.set_defaults(func=_cmd_fault)


def _add_create(sub: Any, common: argparse.ArgumentParser, name: str) -> None:
    p = sub.add_parser(
        name, parents=[common], help="create a MIG device (GPU instance + compute instance)"
    )
    p.add_argument("--gpu", type=int, required=True, help="GPU index")
    p.add_argument("--profile", required=True, help="MIG profile, e.g. 3g.40gb")
    p.add_argument(
        "--placement",
        type=int,
        metavar="START",
        help="start memory slice (default: the lowest free one)",
    )
    p.set_defaults(func=_cmd_create)


def _add_destroy(sub: Any, common: argparse.ArgumentParser, name: str) -> None:
    p = sub.add_parser(name, parents=[common], help="destroy a MIG device by GPU instance id")
    p.add_argument("--gpu", type=int, required=True, help="GPU index")
    p.add_argument("--gi", type=int, required=True, help="GPU instance id")
    p.set_defaults(func=_cmd_destroy)


_ACTIONS: Dict[str, Callable[[Any, argparse.ArgumentParser, str], None]] = {
    "init": _add_init,
    "show": _add_show,
    "load": _add_load,
    "mig-mode": _add_mig_mode,
    "fault": _add_fault,
    "create": _add_create,
    "destroy": _add_destroy,
}


# ------------------------------------------------------------------------- actions
def _state_path(args: argparse.Namespace, node: str = "") -> str:
    from slurmiso.gpu import ENV_SIM_STATE
    from slurmiso.hostlist import expand_node

    path = args.state or os.environ.get(ENV_SIM_STATE, "")
    if not path:
        raise UsageError(
            "no simulated GPU state file given",
            hint=f"pass --state PATH or set ${ENV_SIM_STATE}",
        )
    return expand_node(path, node)


def _backend(args: argparse.Namespace) -> Any:
    from slurmiso.gpu.sim import SimBackend

    return SimBackend(_state_path(args))


def _cmd_init(args: argparse.Namespace) -> int:
    from slurmiso.gpu.sim import init_state
    from slurmiso.hostlist import node_name

    node = node_name(args.node)
    path = _state_path(args, node)
    init_state(path, args.model, args.gpus, mig=args.mig, node=node, force=args.force,
               memory_mb=args.memory)
    mig = "MIG on" if args.mig else "MIG off"
    print(f"simulated node {node}: {args.gpus} x {args.model} ({mig}) at {path}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    from slurmiso.cli.output import print_json

    state = _backend(args).state()
    if args.json:
        print_json(state)
        return 0
    print(render_state(state))
    return 0


def render_state(state: Dict[str, Any]) -> str:
    """Text view of a simulated node: GPUs, then MIG instances, then processes."""
    from slurmiso.cli.output import table
    from slurmiso.gpu.sim import state_model

    model = state_model(state)
    total = model.memory_mb if model else 0
    procs = state["processes"]
    gpu_rows, inst_rows = [], []
    for gpu in state["gpus"]:
        used = gpu["load"]["memory_mb"] + sum(
            p["used_memory_mb"] for p in procs if p["gpu_index"] == gpu["index"]
        )
        gpu_rows.append(
            [
                gpu["index"],
                state["model"],
                "LOST" if gpu["lost"] else "ok",
                "on" if gpu["mig_enabled"] else "off",
                f"{used}/{total}",
                f"{gpu['load']['util']:g}",
                f"{gpu['load']['sm']:g}",
                gpu["uuid"],
            ]
        )
        for inst in gpu["instances"]:
            inst_rows.append(
                [
                    gpu["index"],
                    inst["gi_id"],
                    "-" if inst["ci_id"] is None else inst["ci_id"],
                    inst["profile"],
                    f"{inst['start']}:{inst['size']}",
                    inst["uuid"] or "-",
                ]
            )
    parts = [
        f"node {state['node']}",
        table(gpu_rows, ["GPU", "MODEL", "STATE", "MIG", "MEM_MIB", "UTIL%", "SM%", "UUID"]),
        "",
        table(inst_rows, ["GPU", "GI", "CI", "PROFILE", "PLACEMENT", "MIG_UUID"])
        if inst_rows
        else "no MIG instances",
        "",
        table(
            [
                [
                    p["pid"],
                    p["gpu_index"],
                    p["used_memory_mb"],
                    p["mig_uuid"] or "-",
                    p["name"] or "-",
                ]
                for p in procs
            ],
            ["PID", "GPU", "MEM_MIB", "MIG_UUID", "NAME"],
        )
        if procs
        else "no GPU processes",
    ]
    return "\n".join(parts)


def _cmd_load(args: argparse.Namespace) -> int:
    backend = _backend(args)
    if args.clear:
        backend.clear_load(args.gpu)
        print("cleared load" + (f" of GPU {args.gpu}" if args.gpu is not None else ""))
        return 0
    if args.gpu is None:
        raise UsageError("sim load needs --gpu N (or --clear)")
    wants_process = (args.mem is not None or args.pid is not None or args.mig_uuid or args.name
                     or args.process_sm is not None)
    if args.util is None and args.sm is None and not wants_process:
        raise UsageError("nothing to load", hint="give --util, --sm, --mem or --pid")
    if args.util is not None or args.sm is not None:
        backend.set_load(args.gpu, util=args.util, sm_active=args.sm)
    if wants_process:
        pid = args.pid if args.pid is not None else os.getppid()
        proc = backend.add_process(args.gpu, pid, args.mem or 0, args.mig_uuid, args.name,
                                   sm_util=args.process_sm)
        print(
            f"GPU {args.gpu}: pid {proc.pid} holds {proc.used_memory_mb} MiB"
            + (f" on {proc.mig_uuid}" if proc.mig_uuid else "")
        )
    return 0


def _gpu_indices(backend: Any, spec: str) -> List[int]:
    count = len(backend.state()["gpus"])
    if spec == "all":
        return list(range(count))
    try:
        return [int(spec)]
    except ValueError as exc:
        raise UsageError(f"--gpu takes an index or 'all', not {spec!r}") from exc


def _cmd_mig_mode(args: argparse.Namespace) -> int:
    backend = _backend(args)
    for index in _gpu_indices(backend, args.gpu):
        backend.set_mig_mode(index, args.mode == "on")
        print(f"GPU {index}: MIG {args.mode}")
    return 0


def _cmd_fault(args: argparse.Namespace) -> int:
    lost = args.condition == "lost"
    _backend(args).set_lost(args.gpu, lost)
    print(f"GPU {args.gpu}: {'lost (fallen off the bus)' if lost else 'ok'}")
    return 0


def _cmd_create(args: argparse.Namespace) -> int:
    from slurmiso.gpu.backend import create_mig_device

    inst = create_mig_device(_backend(args), args.gpu, args.profile, args.placement)
    print(
        f"GPU {inst.gpu_index}: created {inst.profile} GI {inst.gi_id} CI {inst.ci_id} "
        f"at {inst.placement_start}:{inst.placement_size} {inst.uuid}"
    )
    return 0


def _cmd_destroy(args: argparse.Namespace) -> int:
    from slurmiso.gpu.backend import destroy_mig_device

    backend = _backend(args)
    inst = next((i for i in backend.instances(args.gpu) if i.gi_id == args.gi), None)
    if inst is None:
        raise GpuNotFound(f"no GPU instance {args.gi} on GPU {args.gpu}")
    destroy_mig_device(backend, inst)
    print(f"GPU {args.gpu}: destroyed {inst.profile} GI {inst.gi_id}")
    return 0
