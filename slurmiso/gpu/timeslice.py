"""The GPU's compute time slice on time-slice pools (issue 35, item 4): set by the hooks from
the config, checked by ``doctor``.

    >>> Timeslice.parse("short").code, Timeslice.SHORT.value
    (1, 'short')

On a GPU shared by time slicing, the driver runs one process's work for a slice before it
switches: a shorter slice gives an inference request its turn sooner, at some cost to the
throughput of the work beside it. NVIDIA sets it with ``nvidia-smi compute-policy -i <GPU>
--set-timeslice N`` (CUDA 11.1 / driver R455 on; 0 default, 1 short, 2 medium, 3 long; the
same call NVIDIA's Kubernetes DRA driver makes). NVML has no public call to read or set it,
and the driver forgets it when it is reloaded or the node reboots.

So the prolog sets it on a job's GPUs where this boot's record (``timeslice.json`` in the node's
state dir, root's) does not already show the configured value, and ``doctor`` compares that
record with the config. A driver reloaded without a reboot is not seen (the record is per boot:
docs/admin-guide.md says so).
"""

from __future__ import annotations

import enum
import json
import logging
import os
import shutil
import subprocess
from typing import Callable, Dict, Iterable, List, Optional, Protocol

from slurmiso.errors import GpuError

log = logging.getLogger(__name__)

RECORD = "timeslice.json"
BOOT_ID = "/proc/sys/kernel/random/boot_id"
#: nvidia-smi answers in well under a second; a hung driver must not hold a prolog.
SMI_TIMEOUT_S = 30
#: A GPU index -> its UUID.
UuidOf = Callable[[int], str]


class Timeslice(str, enum.Enum):
    """The driver's four time-slice settings, by the names nvidia-smi's help gives them."""

    DEFAULT = "default"
    SHORT = "short"
    MEDIUM = "medium"
    LONG = "long"

    @property
    def code(self) -> int:
        """The number ``--set-timeslice`` takes."""
        return list(Timeslice).index(self)

    @classmethod
    def parse(cls, text: str) -> Timeslice:
        try:
            return cls(text.strip().lower())
        except ValueError:
            raise ValueError(f"unknown time slice {text!r}: one of "
                             f"{', '.join(t.value for t in cls)}") from None


class TimesliceSetter(Protocol):
    """Sets one GPU's time slice (part of every GPU backend), or raises
    :class:`~slurmiso.errors.GpuError`."""

    def set_compute_timeslice(self, index: int, value: Timeslice) -> None: ...


class SmiTimeslice:
    """The real setter: ``nvidia-smi compute-policy`` on the GPU's UUID (an index may name
    another GPU once a device is excluded; a UUID never does)."""

    def __init__(self, uuid_of: UuidOf, smi: str = "") -> None:
        self.uuid_of = uuid_of
        self.smi = smi

    def set_compute_timeslice(self, index: int, value: Timeslice) -> None:
        smi = self.smi or shutil.which("nvidia-smi") or ""
        if not smi:
            raise GpuError("cannot set the GPU time slice: nvidia-smi is not on PATH",
                           hint="install the NVIDIA driver's utilities on the node")
        argv = [smi, "compute-policy", "-i", self.uuid_of(index), "--set-timeslice",
                str(value.code)]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=SMI_TIMEOUT_S,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise GpuError(f"GPU {index}: nvidia-smi compute-policy failed: {exc}") from exc
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise GpuError(f"GPU {index}: nvidia-smi compute-policy --set-timeslice "
                           f"{value.code} exited {done.returncode}: "
                           f"{said[-1] if said else 'no message'}")


def boot_id(path: str = BOOT_ID) -> str:
    """This boot's id ("" when the kernel gives none: then nothing counts as already set)."""
    try:
        with open(path, encoding="ascii") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return ""


def read_record(state_dir: str) -> Dict[str, Dict[str, str]]:
    """GPU UUID -> {"value", "boot"} as the hooks last set it; {} when absent or unreadable
    (then every GPU is set again: a setting is idempotent)."""
    try:
        with open(os.path.join(state_dir, RECORD), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): {"value": str(v.get("value", "")), "boot": str(v.get("boot", ""))}
            for k, v in data.items() if isinstance(v, dict)}


def _write_record(state_dir: str, record: Dict[str, Dict[str, str]]) -> None:
    from slurmiso.atomic import write_atomic

    write_atomic(os.path.join(state_dir, RECORD),
                 json.dumps(record, indent=1, sort_keys=True) + "\n", mode=0o644)


def ensure(setter: TimesliceSetter, state_dir: str, gpus: Iterable[int],
           uuid_of: UuidOf, want: Timeslice, boot: str) -> List[int]:
    """Set ``want`` on each GPU whose record for this boot says otherwise; the GPUs set.
    Raises :class:`GpuError` on the first that fails (those before it stay recorded)."""
    record = read_record(state_dir)
    done: List[int] = []
    try:
        for index in gpus:
            uuid = uuid_of(index)
            if boot and record.get(uuid) == {"value": want.value, "boot": boot}:
                continue
            setter.set_compute_timeslice(index, want)
            record[uuid] = {"value": want.value, "boot": boot}
            done.append(index)
    finally:
        if done:
            _write_record(state_dir, record)
    return done


def stale(record: Dict[str, Dict[str, str]], uuids: Dict[int, str], want: Timeslice,
          boot: str) -> Dict[int, str]:
    """GPU index -> what its record says instead of ``want`` this boot (doctor's check)."""
    out: Dict[int, str] = {}
    for index, uuid in sorted(uuids.items()):
        got: Optional[Dict[str, str]] = record.get(uuid)
        if got is None:
            out[index] = "never set by slurmiso"
        elif got["boot"] != boot:
            out[index] = f"set to {got['value']} before the last reboot"
        elif got["value"] != want.value:
            out[index] = f"set to {got['value']}"
    return out
