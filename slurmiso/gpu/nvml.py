"""The NVML backend: real GPUs through ``pynvml`` (package ``nvidia-ml-py``).

``pynvml`` is imported when the backend first connects, never at module import, so hooks on
nodes without a driver start fast and fail with a clear :class:`GpuUnavailable`. Every NVML
call goes through :func:`_translate`, the one place where ``pynvml.NVMLError`` codes become
:mod:`slurmiso.errors` classes; the simulated backend raises the same classes in the same
situations.

MIG model: a GPU instance (GI) carries one full-size compute instance (CI), which is the MIG
device a job sees. Instances made by other tools with several CIs per GI are listed by their
first CI.
"""

from __future__ import annotations

import ctypes
import logging
import math
import re
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Set, Tuple, Type

from slurmiso.errors import (
    GpuError,
    GpuInsufficientResources,
    GpuInUse,
    GpuLost,
    GpuNotFound,
    GpuNotSupported,
    GpuUnavailable,
)
from slurmiso.gpu import profiles
from slurmiso.gpu.backend import Capabilities, DeviceInfo, GpuProcess, MigInstance, Telemetry
from slurmiso.gpu.profiles import GpuModel, MigProfile

if TYPE_CHECKING:
    from slurmiso.gpu.memory_limits import JobMemoryLimits
    from slurmiso.gpu.timeslice import Timeslice

log = logging.getLogger(__name__)

_MIB = 1024 * 1024
#: How far back a per-process SM reading looks (the agent scrapes about this often).
PROCESS_SM_WINDOW_S = 10.0
#: Big enough for any placement/instance list NVML returns (at most 8 memory slices today).
_ARRAY_LEN = 32

#: NVML return codes (``pynvml.NVML_ERROR_*``) -> slurmiso error class; anything else is GpuError.
_ERROR_CLASSES: Dict[str, Type[GpuError]] = {
    "NVML_ERROR_NOT_FOUND": GpuNotFound,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": GpuInsufficientResources,
    "NVML_ERROR_IN_USE": GpuInUse,
    "NVML_ERROR_NOT_SUPPORTED": GpuNotSupported,
    "NVML_ERROR_FUNCTION_NOT_FOUND": GpuNotSupported,  # a driver older than the call
    "NVML_ERROR_GPU_IS_LOST": GpuLost,
    "NVML_ERROR_LIBRARY_NOT_FOUND": GpuUnavailable,
    "NVML_ERROR_DRIVER_NOT_LOADED": GpuUnavailable,
    "NVML_ERROR_UNINITIALIZED": GpuUnavailable,
}
#: The values those names have in every nvidia-ml-py release (used when a constant is missing).
_DEFAULT_CODES: Dict[str, int] = {
    "NVML_ERROR_UNINITIALIZED": 1,
    "NVML_ERROR_INVALID_ARGUMENT": 2,
    "NVML_ERROR_NOT_SUPPORTED": 3,
    "NVML_ERROR_NO_PERMISSION": 4,
    "NVML_ERROR_NOT_FOUND": 6,
    "NVML_ERROR_DRIVER_NOT_LOADED": 9,
    "NVML_ERROR_LIBRARY_NOT_FOUND": 12,
    "NVML_ERROR_FUNCTION_NOT_FOUND": 13,
    "NVML_ERROR_GPU_IS_LOST": 15,
    "NVML_ERROR_IN_USE": 19,
    "NVML_ERROR_INSUFFICIENT_RESOURCES": 23,
}
#: ``NVML_DEVICE_ARCH_*`` values (the same in every nvidia-ml-py release) -> names.
_ARCHITECTURES: Dict[int, str] = {
    2: "kepler", 3: "maxwell", 4: "pascal", 5: "volta", 6: "turing", 7: "ampere", 8: "ada",
    9: "hopper", 10: "blackwell", 13: "rubin",
}
_HINTS: Dict[Type[GpuError], str] = {
    GpuLost: "drain the node and reset or replace the GPU (see dmesg for Xid errors)",
    GpuUnavailable: "check that the NVIDIA driver is loaded (nvidia-smi) on this node",
}


def _code_name(nvml: Any, code: int) -> str:
    """``NVML_ERROR_*`` name of ``code`` as ``nvml`` (or the default table) defines it."""
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == code:
            return name
    for name, value in _DEFAULT_CODES.items():
        if value == code:
            return name
    return f"NVML error {code}"


def translate_error(exc: BaseException, what: str, nvml: Any = None) -> GpuError:
    """The slurmiso error for an ``NVMLError`` raised while doing ``what``.

    The NVML code is kept on the result as ``nvml_code`` so callers can tell, say, a missing
    function (old driver) from other failures without importing pynvml.
    """
    nvml = nvml if nvml is not None else sys.modules.get("pynvml")
    code = int(getattr(exc, "value", -1))
    name = _code_name(nvml, code)
    cls = _ERROR_CLASSES.get(name, GpuError)
    text = str(exc) or name
    if cls is GpuLost:
        text = "the GPU has fallen off the bus"
    err = cls(f"{what}: {text} ({name})", hint=_HINTS.get(cls, ""))
    err.nvml_code = code  # type: ignore[attr-defined]
    return err


@contextmanager
def _translate(what: str) -> Iterator[None]:
    """Turn an ``NVMLError`` escaping the block into a slurmiso ``Gpu*`` error."""
    try:
        yield
    except Exception as exc:
        nvml = sys.modules.get("pynvml")
        if nvml is None or not isinstance(exc, getattr(nvml, "NVMLError", ())):
            raise
        raise translate_error(exc, what, nvml) from exc


def _nvml_code(err: GpuError) -> int:
    return int(getattr(err, "nvml_code", -1))


def _text(value: Any) -> str:
    """NVML strings are ``bytes`` in older nvidia-ml-py releases and ``str`` in newer ones."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


_NVML_PROFILE_NAME = re.compile(r"(\d+g\.\d+gb(?:[+-][a-z]+)*)")


def profile_name(model: Optional[GpuModel], info: Any, constant_name: str = "") -> str:
    """slurmiso's name for an NVML GPU-instance profile ``info``.

    Prefers the catalogue entry with the same profile id and slice count (so configs and both
    backends agree, whatever a driver release calls it), then the name NVML reports (profile
    info v2, e.g. ``"MIG 1g.10gb"``), then one derived from slice count and memory the way
    NVIDIA names them (memory rounded up to GiB).
    """
    if model is not None:
        for prof in model.profiles:
            if prof.profile_id == int(info.id) and prof.compute_slices == int(info.sliceCount):
                return prof.name
    match = _NVML_PROFILE_NAME.search(_text(getattr(info, "name", b"")))
    if match:
        return match.group(1)
    name = f"{int(info.sliceCount)}g.{math.ceil(int(info.memorySizeMB) / 1024)}gb"
    if constant_name.endswith("_REV1"):
        name += "+me"
    elif constant_name.endswith("_ALL_ME"):
        name += "+me.all"
    elif constant_name.endswith("_NO_ME"):
        name += "-me"
    elif constant_name.endswith("_GFX"):
        name += "+gfx"
    return name


class NvmlBackend:
    """:class:`~slurmiso.gpu.backend.GpuBackend` on the node's real GPUs."""

    name = "nvml"
    capabilities = Capabilities()

    def __init__(self) -> None:
        self._nvml: Any = None
        self._profiles: Dict[int, List[MigProfile]] = {}

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ connection
    def connect(self) -> None:
        """Load and initialise NVML (idempotent); :class:`GpuUnavailable` if it cannot."""
        if self._nvml is not None:
            return
        try:
            import pynvml
        except ImportError as exc:
            raise GpuUnavailable(
                f"python package nvidia-ml-py (pynvml) is not installed: {exc}",
                hint="pip install nvidia-ml-py",
            ) from exc
        try:
            with _translate("NVML initialisation"):
                pynvml.nvmlInit()
        except GpuError as err:
            if isinstance(err, GpuUnavailable):
                raise
            raise GpuUnavailable(err.message, hint=_HINTS[GpuUnavailable]) from err
        self._nvml = pynvml

    def close(self) -> None:
        if self._nvml is None:
            return
        nvml, self._nvml = self._nvml, None
        self._profiles.clear()
        try:
            with _translate("NVML shutdown"):
                nvml.nvmlShutdown()
        except GpuError as err:  # nothing useful to do about a failed shutdown
            log.debug("ignoring %s", err)

    @property
    def nvml(self) -> Any:
        self.connect()
        return self._nvml

    def _handle(self, index: int) -> Any:
        with _translate("count GPUs"):
            count = int(self.nvml.nvmlDeviceGetCount())
        if not 0 <= index < count:
            raise GpuNotFound(f"no GPU {index} on this node (NVML sees {count} GPU(s))")
        with _translate(f"GPU {index}"):
            return self.nvml.nvmlDeviceGetHandleByIndex(index)

    def _count(self) -> int:
        with _translate("count GPUs"):
            return int(self.nvml.nvmlDeviceGetCount())

    def _indices(self, index: Optional[int]) -> List[int]:
        return [index] if index is not None else list(range(self._count()))

    def set_compute_timeslice(self, index: int, value: Timeslice) -> None:
        """NVML has no call for it: ``nvidia-smi compute-policy`` on the GPU's UUID."""
        from slurmiso.gpu.timeslice import SmiTimeslice

        SmiTimeslice(lambda i: self.device(i).uuid).set_compute_timeslice(index, value)

    def set_memory_limits(self, index: int, cgroup: str, limits: JobMemoryLimits) -> None:
        """``nvmlDeviceSetMemoryLimits_v1`` (driver r615+; root): the driver, not we,
        writes the cgroup's partition and its ancestors' reservations."""
        handle, arg = self._limits_arg("Set", index, cgroup)
        arg.softLimit, arg.hardLimit = limits.soft_bytes, limits.hard_bytes
        with _translate(f"set GPU {index}'s memory limits for {cgroup}"):
            self.nvml.nvmlDeviceSetMemoryLimits_v1(handle, arg)

    def memory_limits(self, index: int, cgroup: str) -> JobMemoryLimits:
        from slurmiso.gpu.memory_limits import JobMemoryLimits

        handle, arg = self._limits_arg("Get", index, cgroup)
        with _translate(f"read GPU {index}'s memory limits for {cgroup}"):
            self.nvml.nvmlDeviceGetMemoryLimits_v1(handle, arg)
        return JobMemoryLimits(int(arg.softLimit), int(arg.hardLimit), int(arg.currentUsed))

    def _limits_arg(self, verb: str, index: int, cgroup: str) -> Tuple[Any, Any]:
        """(GPU handle, nvidia-ml-py's ``c_nvml<verb>MemoryLimits_v1_t`` naming the cgroup)."""
        struct = getattr(self.nvml, f"c_nvml{verb}MemoryLimits_v1_t", None)
        if struct is None:
            raise GpuNotSupported(f"this nvidia-ml-py has no nvmlDevice{verb}MemoryLimits_v1",
                                  hint="install nvidia-ml-py 13.615 or later")
        handle = self._handle(index)
        arg = struct()
        arg.nameSpace = cgroup.encode()
        return handle, arg

    # --------------------------------------------------------------------- devices
    def devices(self) -> List[DeviceInfo]:
        return [self.device(i) for i in range(self._count())]

    def device(self, index: int) -> DeviceInfo:
        nvml, handle = self.nvml, self._handle(index)
        with _translate(f"GPU {index}: read device info"):
            name = _text(nvml.nvmlDeviceGetName(handle))
            uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            minor = int(nvml.nvmlDeviceGetMinorNumber(handle))
            bus_id = _text(nvml.nvmlDeviceGetPciInfo(handle).busId)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
        current, pending = self._mig_mode(index, handle)
        model = profiles.lookup_model(name)
        return DeviceInfo(
            index=index,
            uuid=uuid,
            name=name,
            model=model.name if model else "",
            minor=minor,
            pci_bus_id=bus_id,
            memory_total_mb=int(mem.total) // _MIB,
            memory_used_mb=int(mem.used) // _MIB,
            utilization_pct=self._utilization(index, handle)[0],
            mig_enabled=current,
            mig_pending=pending,
            architecture=self._architecture(index, handle),
        )

    def _architecture(self, index: int, handle: Any) -> str:
        """``nvmlDeviceGetArchitecture`` as a name ("" where the driver or binding lacks it)."""
        getter = getattr(self.nvml, "nvmlDeviceGetArchitecture", None)
        if getter is None:
            return ""
        try:
            with _translate(f"GPU {index}: read architecture"):
                code = int(getter(handle))
        except (GpuLost, GpuUnavailable):
            raise
        except GpuError as err:  # NOT_SUPPORTED, FUNCTION_NOT_FOUND (old driver)
            log.debug("architecture unknown: %s", err)
            return ""
        return _ARCHITECTURES.get(code, "")

    def mig_mode(self, index: int) -> Tuple[bool, bool]:
        return self._mig_mode(index, self._handle(index))

    def _mig_mode(self, index: int, handle: Any) -> Tuple[bool, bool]:
        try:
            with _translate(f"GPU {index}: read MIG mode"):
                current, pending = self.nvml.nvmlDeviceGetMigMode(handle)
        except GpuNotSupported:  # pre-Ampere or consumer parts: no MIG at all
            return False, False
        return bool(current), bool(pending)

    def _utilization(self, index: int, handle: Any) -> Tuple[Optional[int], Optional[int]]:
        """(gpu %, memory %); NVML has none in MIG mode (NOT_SUPPORTED): None, not 0."""
        try:
            with _translate(f"GPU {index}: read utilization"):
                rates = self.nvml.nvmlDeviceGetUtilizationRates(handle)
        except GpuNotSupported:
            return None, None
        return int(rates.gpu), int(rates.memory)

    def telemetry(self, index: int) -> Telemetry:
        """Memory, graphics-engine activity and, through GPM (Hopper+), SM activity; SM is
        None (unknown) where GPM is missing."""
        from slurmiso.gpu.gpm import gpm_sm

        handle = self._handle(index)
        with _translate(f"GPU {index}: read memory"):
            mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
        gpu_pct, mem_pct = self._utilization(index, handle)
        mig, _ = self._mig_mode(index, handle)  # no utilization in MIG mode: unknown, not 0
        if mig:
            gpu_pct = mem_pct = None
        sm = gpm_sm(self.nvml, handle)
        return Telemetry(
            gpu_index=index,
            sm_active=sm["sm_active"],
            gr_engine_active=None if gpu_pct is None else gpu_pct / 100.0,
            memory_used_mb=int(mem.used) // _MIB,
            memory_total_mb=int(mem.total) // _MIB,
            extra={} if mem_pct is None else {"memory_bandwidth_util": mem_pct / 100.0},
            sm_source="gpm" if sm["sm_active"] is not None else "",
            sm_occupancy=sm["sm_occupancy"],
        )

    # -------------------------------------------------------------------- profiles
    def profiles(self, index: int) -> List[MigProfile]:
        """NVML's GPU-instance profiles; the catalogue of a known model when NVML lists none
        (MIG disabled), so both backends answer alike."""
        if index not in self._profiles:
            handle = self._handle(index)
            with _translate(f"GPU {index}: read name"):
                model = profiles.lookup_model(_text(self.nvml.nvmlDeviceGetName(handle)))
            found = self._query_profiles(index, handle, model)
            if not found and model is not None:
                found = list(model.profiles)
            self._profiles[index] = found
        return list(self._profiles[index])

    def _query_profiles(
        self, index: int, handle: Any, model: Optional[GpuModel]
    ) -> List[MigProfile]:
        nvml = self.nvml
        constants = sorted(
            (getattr(nvml, n), n)
            for n in dir(nvml)
            if n.startswith("NVML_GPU_INSTANCE_PROFILE_") and not n.endswith("_COUNT")
        )
        found: Dict[int, MigProfile] = {}
        for constant, constant_name in constants:
            info = self._profile_info(index, handle, constant)
            if info is None or int(info.id) in found or int(info.instanceCount) == 0:
                continue
            placements = self._possible_placements(index, handle, int(info.id), model)
            found[int(info.id)] = MigProfile(
                name=profile_name(model, info, constant_name),
                profile_id=int(info.id),
                compute_slices=int(info.sliceCount),
                memory_slices=placements[0][1] if placements else 0,
                memory_mb=int(info.memorySizeMB),
                max_instances=int(info.instanceCount),
                placements=tuple(start for start, _ in placements),
                media_engines=constant_name.endswith(("_REV1", "_ALL_ME")),
            )
        return sorted(found.values(), key=lambda p: (p.compute_slices, p.memory_mb, p.name))

    def _profile_info(self, index: int, handle: Any, constant: int) -> Any:
        """Profile info, or None where this GPU does not have that profile."""
        what = f"GPU {index}: read MIG profile {constant}"
        try:
            try:
                with _translate(what):
                    return self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant)
            except GpuError as err:
                if _nvml_code(err) != _DEFAULT_CODES["NVML_ERROR_FUNCTION_NOT_FOUND"]:
                    raise
                with _translate(what):  # driver without the v2 call
                    return self.nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, constant, 1)
        except (GpuLost, GpuUnavailable):
            raise
        except GpuError as err:  # NOT_SUPPORTED / INVALID_ARGUMENT: no such profile here
            log.debug("skipping: %s", err)
            return None

    def _possible_placements(
        self, index: int, handle: Any, profile_id: int, model: Optional[GpuModel]
    ) -> List[Tuple[int, int]]:
        """(start, size) placements; NVML wants root for this, so a non-root caller gets the
        catalogue's placements of a known model instead."""
        nvml = self.nvml
        array = (nvml.c_nvmlGpuInstancePlacement_t * _ARRAY_LEN)()
        count = ctypes.c_uint(_ARRAY_LEN)
        try:
            with _translate(f"GPU {index}: read placements of MIG profile id {profile_id}"):
                nvml.nvmlDeviceGetGpuInstancePossiblePlacements(
                    handle, profile_id, array, ctypes.byref(count)
                )
        except (GpuLost, GpuUnavailable):
            raise
        except GpuError as err:
            known = [p for p in (model.profiles if model else ()) if p.profile_id == profile_id]
            log.debug("%s; using the catalogue's placements", err)
            return [(start, p.memory_slices) for p in known for start in p.placements]
        return [(int(array[i].start), int(array[i].size)) for i in range(count.value)]

    def _profile(self, index: int, name: str) -> MigProfile:
        for prof in self.profiles(index):
            if prof.name == name:
                return prof
        allowed = ", ".join(p.name for p in self.profiles(index)) or "none (no MIG support)"
        raise GpuNotSupported(
            f"MIG profile {name!r} does not exist on GPU {index}; allowed profiles: {allowed}"
        )

    def free_placements(self, index: int, profile: str) -> List[int]:
        prof = self._profile(index, profile)
        handle = self._handle(index)
        if not self._mig_mode(index, handle)[0]:
            return []
        with _translate(f"GPU {index}: read remaining capacity of {profile}"):
            remaining = int(
                self.nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, prof.profile_id)
            )
        if remaining == 0:
            return []
        used: Set[int] = set()
        for gi in self._gpu_instances(index, handle):
            used.update(range(gi["start"], gi["start"] + gi["size"]))
        return [
            s for s in prof.placements if not used.intersection(range(s, s + prof.memory_slices))
        ]

    # ------------------------------------------------------------------- instances
    def _gpu_instances(self, index: int, handle: Any) -> List[Dict[str, Any]]:
        """Existing GIs as dicts: id, profile, start, size, handle."""
        nvml = self.nvml
        out = []
        for prof in self.profiles(index):
            array = (nvml.c_nvmlGpuInstance_t * _ARRAY_LEN)()
            count = ctypes.c_uint(_ARRAY_LEN)
            with _translate(f"GPU {index}: list {prof.name} GPU instances"):
                nvml.nvmlDeviceGetGpuInstances(handle, prof.profile_id, array, ctypes.byref(count))
                for i in range(count.value):
                    info = nvml.nvmlGpuInstanceGetInfo(array[i])
                    out.append(
                        {
                            "id": int(info.id),
                            "profile": prof,
                            "handle": array[i],
                            "start": int(info.placement.start),
                            "size": int(info.placement.size),
                        }
                    )
        return sorted(out, key=lambda gi: gi["id"])

    def _mig_devices(self, index: int, handle: Any) -> Dict[int, Tuple[int, str, int, Any]]:
        """MIG devices by GI id: (ci id, MIG UUID, used MiB, handle); first CI of each GI."""
        nvml = self.nvml
        out: Dict[int, Tuple[int, str, int, Any]] = {}
        with _translate(f"GPU {index}: count MIG devices"):
            slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
        for slot in range(slots):
            try:
                with _translate(f"GPU {index}: MIG device {slot}"):
                    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except GpuError as err:  # an empty slot: NOT_FOUND (INVALID_ARGUMENT on some drivers)
                if isinstance(err, (GpuLost, GpuUnavailable)):
                    raise
                continue
            with _translate(f"GPU {index}: read MIG device {slot}"):
                gi_id = int(nvml.nvmlDeviceGetGpuInstanceId(mig))
                ci_id = int(nvml.nvmlDeviceGetComputeInstanceId(mig))
                uuid = _text(nvml.nvmlDeviceGetUUID(mig))
                used = int(nvml.nvmlDeviceGetMemoryInfo(mig).used) // _MIB
            if gi_id not in out or ci_id < out[gi_id][0]:
                out[gi_id] = (ci_id, uuid, used, mig)
        return out

    def instances(self, index: Optional[int] = None) -> List[MigInstance]:
        result: List[MigInstance] = []
        for i in self._indices(index):
            handle = self._handle(i)
            if not self._mig_mode(i, handle)[0]:
                continue
            devices = self._mig_devices(i, handle)
            for gi in self._gpu_instances(i, handle):
                ci_id, uuid, used, _ = devices.get(gi["id"], (None, "", 0, None))
                result.append(
                    MigInstance(
                        gpu_index=i,
                        gi_id=gi["id"],
                        profile=gi["profile"].name,
                        placement_start=gi["start"],
                        placement_size=gi["size"],
                        ci_id=ci_id,
                        uuid=uuid,
                        memory_total_mb=gi["profile"].memory_mb,
                        memory_used_mb=used,
                    )
                )
        return result

    def create_gpu_instance(
        self, index: int, profile: str, placement: Optional[int] = None
    ) -> MigInstance:
        nvml, handle = self.nvml, self._handle(index)
        prof = self._profile(index, profile)
        if not self._mig_mode(index, handle)[0]:
            raise GpuNotSupported(
                f"MIG mode is disabled on GPU {index}; cannot create a GPU instance",
                hint="enable MIG mode first (slurmiso mig apply)",
            )
        if placement is not None and placement not in prof.placements:
            raise GpuError(
                f"invalid argument: placement {placement} is not a legal start for {prof.name}; "
                f"legal starts: {', '.join(map(str, prof.placements))}"
            )
        what = f"GPU {index}: create GPU instance {prof.name}"
        try:
            with _translate(what):
                if placement is None:
                    gi = nvml.nvmlDeviceCreateGpuInstance(handle, prof.profile_id)
                else:
                    spot = nvml.c_nvmlGpuInstancePlacement_t()
                    spot.start, spot.size = placement, prof.memory_slices
                    gi = nvml.nvmlDeviceCreateGpuInstanceWithPlacement(
                        handle, prof.profile_id, ctypes.byref(spot)
                    )
        except GpuInsufficientResources as err:
            free = ", ".join(map(str, self.free_placements(index, profile))) or "none"
            raise GpuInsufficientResources(f"{err.message}; free placements: {free}") from err
        with _translate(f"{what}: read it back"):
            info = nvml.nvmlGpuInstanceGetInfo(gi)
        return MigInstance(
            gpu_index=index,
            gi_id=int(info.id),
            profile=prof.name,
            placement_start=int(info.placement.start),
            placement_size=int(info.placement.size),
            memory_total_mb=prof.memory_mb,
        )

    def _gi_handle(self, index: int, handle: Any, gi_id: int) -> Any:
        with _translate(f"GPU {index}: GPU instance {gi_id}"):
            return self.nvml.nvmlDeviceGetGpuInstanceById(handle, gi_id)

    def create_compute_instance(self, index: int, gi_id: int) -> MigInstance:
        nvml, handle = self.nvml, self._handle(index)
        gi = self._gi_handle(index, handle, gi_id)
        what = f"GPU {index}: create compute instance in GPU instance {gi_id}"
        with _translate(what):
            gi_info = nvml.nvmlGpuInstanceGetInfo(gi)
        profile_id = int(gi_info.profileId)
        prof = next((p for p in self.profiles(index) if p.profile_id == profile_id), None)
        if prof is None:
            raise GpuNotSupported(f"{what}: unknown GPU instance profile id {profile_id}")
        slices = prof.compute_slices
        ci_constant = getattr(nvml, f"NVML_COMPUTE_INSTANCE_PROFILE_{slices}_SLICE", None)
        if ci_constant is None:
            raise GpuNotSupported(f"{what}: NVML has no {slices}-slice compute profile")
        with _translate(what):
            ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi, ci_constant, nvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
            )
            ci = nvml.nvmlGpuInstanceCreateComputeInstance(gi, ci_info.id)
            ci_id = int(nvml.nvmlComputeInstanceGetInfo(ci).id)
        ci_found, uuid, used, _ = self._mig_devices(index, handle).get(gi_id, (ci_id, "", 0, None))
        if not uuid:
            log.warning("GPU %d: MIG device of GI %d CI %d not listed yet", index, gi_id, ci_id)
        return MigInstance(
            gpu_index=index,
            gi_id=gi_id,
            profile=prof.name,
            placement_start=int(gi_info.placement.start),
            placement_size=int(gi_info.placement.size),
            ci_id=ci_id,
            uuid=uuid,
            memory_total_mb=prof.memory_mb,
            memory_used_mb=used,
        )

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        gi = self._gi_handle(index, self._handle(index), gi_id)
        with _translate(f"GPU {index}: destroy compute instance {ci_id} of GPU instance {gi_id}"):
            ci = self.nvml.nvmlGpuInstanceGetComputeInstanceById(gi, ci_id)
            self.nvml.nvmlComputeInstanceDestroy(ci)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        gi = self._gi_handle(index, self._handle(index), gi_id)
        with _translate(f"GPU {index}: destroy GPU instance {gi_id}"):
            self.nvml.nvmlGpuInstanceDestroy(gi)

    # ------------------------------------------------------------------- processes
    def processes(self, index: Optional[int] = None) -> List[GpuProcess]:
        """Compute processes; in MIG mode asked per MIG device, which needs no root (the
        aggregate query on the parent GPU does)."""
        result: List[GpuProcess] = []
        for i in self._indices(index):
            handle = self._handle(i)
            if self._mig_mode(i, handle)[0]:
                for _, uuid, _, mig in self._mig_devices(i, handle).values():
                    result += self._device_processes(i, mig, uuid)
            else:
                result += self._device_processes(i, handle, "")
        return result

    def _device_processes(self, index: int, handle: Any, mig_uuid: str) -> List[GpuProcess]:
        with _translate(f"GPU {index}: list compute processes"):
            procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        sm = self._process_sm(index, handle) if procs and not mig_uuid else None
        return [
            GpuProcess(
                pid=int(p.pid),
                gpu_index=index,
                used_memory_mb=int(p.usedGpuMemory or 0) // _MIB,
                mig_uuid=mig_uuid,
                name=_process_name(int(p.pid)),
                memory_known=p.usedGpuMemory is not None,  # pynvml: None = not available
                sm_util=None if sm is None else sm.get(int(p.pid), 0.0),
            )
            for p in procs
        ]

    def _process_sm(self, index: int, handle: Any) -> Optional[Dict[int, float]]:
        """pid -> mean smUtil (0..1) of the driver's samples of the last
        :data:`PROCESS_SM_WINDOW_S`; NVML returns one per process "that had some non-zero
        utilization", so a process with none used no SM time (0). None where the driver will
        not say (MIG devices, older drivers), never a guess."""
        import time

        read = getattr(self.nvml, "nvmlDeviceGetProcessUtilization", None)
        if read is None:
            return None  # an nvidia-ml-py without it
        since = int((time.time() - PROCESS_SM_WINDOW_S) * 1e6)  # CPU timestamps in us
        try:
            with _translate(f"GPU {index}: read process utilization"):
                samples = read(handle, since)
        except GpuNotFound:
            return {}  # no sample since: no process used the SMs in the window
        except GpuError:
            return None
        per: Dict[int, List[int]] = {}
        for x in samples:
            if 0 <= int(x.smUtil) <= 100:
                per.setdefault(int(x.pid), []).append(int(x.smUtil))
        return {pid: sum(v) / len(v) / 100.0 for pid, v in per.items()}


def _process_name(pid: int) -> str:
    """Best effort: the pid may live in another pid namespace (containers)."""
    import psutil

    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return ""
