"""MUNGE credentials for slurmiso's own messages between hosts (the monitor's heartbeat).

A header any local user can send proves nothing; a MUNGE credential proves the uid of the
process that made it, on a host holding the cluster's key (Slurm's own trust root). Each
node's munged decodes a credential once (a replay is refused) and only within its TTL.
``libmunge.so.2`` is called through :mod:`ctypes` (one round trip to munged, no fork); where it
cannot be loaded, :func:`available` says why and callers decide (see docs/monitor.md).
Constants are those of munge.h (MUNGE 0.5.x).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import enum
from dataclasses import dataclass
from typing import Any, Optional, Tuple

from slurmiso.errors import SlurmisoError

#: munge.h: munge_opt_t MUNGE_OPT_TTL; munge_err_t values this module names.
_OPT_TTL = 4
_MAX_CRED = 4096


class MungeStatus(enum.IntEnum):
    """munge_err_t values a decode can return (the rest are reported by number)."""

    SUCCESS = 0
    SOCKET = 6
    BAD_CRED = 8
    CRED_INVALID = 14
    CRED_EXPIRED = 15
    CRED_REWOUND = 16
    CRED_REPLAYED = 17
    CRED_UNAUTHORIZED = 18


class MungeUnavailable(SlurmisoError):
    """libmunge cannot be loaded, or munged does not answer."""


@dataclass(frozen=True)
class Decoded:
    """What munged says about a credential: its status, the maker's uid and gid, payload."""

    status: int
    uid: int = -1
    gid: int = -1
    payload: bytes = b""

    @property
    def ok(self) -> bool:
        return self.status == MungeStatus.SUCCESS

    def why(self) -> str:
        try:
            return MungeStatus(self.status).name.lower().replace("_", "-")
        except ValueError:
            return f"munge error {self.status}"


_LIB: Optional[Tuple[Any, Any]] = None


def _lib() -> Tuple[Any, Any]:
    """(libmunge, libc), loaded once; MungeUnavailable names what is missing."""
    global _LIB
    if _LIB is None:
        path = ctypes.util.find_library("munge") or "libmunge.so.2"
        try:
            munge = ctypes.CDLL(path)
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError as exc:
            raise MungeUnavailable(f"libmunge cannot be loaded ({exc})",
                                   hint="install munge (Debian: libmunge2)") from None
        munge.munge_encode.restype = ctypes.c_int
        munge.munge_encode.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_void_p,
                                       ctypes.c_void_p, ctypes.c_int]
        munge.munge_decode.restype = ctypes.c_int
        munge.munge_decode.argtypes = [ctypes.c_char_p, ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_int),
                                       ctypes.POINTER(ctypes.c_uint32),
                                       ctypes.POINTER(ctypes.c_uint32)]
        munge.munge_ctx_create.restype = ctypes.c_void_p
        munge.munge_ctx_destroy.argtypes = [ctypes.c_void_p]
        munge.munge_ctx_set.restype = ctypes.c_int
        munge.munge_strerror.restype = ctypes.c_char_p
        munge.munge_strerror.argtypes = [ctypes.c_int]
        libc.free.argtypes = [ctypes.c_void_p]
        _LIB = (munge, libc)
    return _LIB


def available() -> Optional[str]:
    """None where credentials can be made and checked here, else why not."""
    try:
        _lib()
    except MungeUnavailable as exc:
        return str(exc)
    return None


def encode(payload: bytes, ttl_s: int = 0) -> str:
    """A credential for ``payload`` made as this process's uid (``ttl_s`` 0: munged's
    default, 300 s)."""
    munge, libc = _lib()
    ctx = munge.munge_ctx_create()
    if not ctx:
        raise MungeUnavailable("munge_ctx_create failed")
    try:
        if ttl_s:
            munge.munge_ctx_set(ctypes.c_void_p(ctx), _OPT_TTL, ctypes.c_int(int(ttl_s)))
        cred = ctypes.c_char_p()
        err = munge.munge_encode(ctypes.byref(cred), ctypes.c_void_p(ctx), payload,
                                 len(payload))
        try:
            if err != MungeStatus.SUCCESS or not cred.value:
                raise MungeUnavailable(f"munge_encode: {munge.munge_strerror(err).decode()}",
                                       hint="check that munged runs (systemctl status munge)")
            return cred.value.decode("ascii")
        finally:
            if cred:
                libc.free(ctypes.cast(cred, ctypes.c_void_p))
    finally:
        munge.munge_ctx_destroy(ctypes.c_void_p(ctx))


def decode(cred: str) -> Decoded:
    """munged's verdict on a credential from anyone (hostile: length-capped, ASCII only)."""
    if not cred or len(cred) > _MAX_CRED or not cred.isascii():
        return Decoded(MungeStatus.BAD_CRED)
    munge, libc = _lib()
    buf, length = ctypes.c_void_p(), ctypes.c_int()
    uid, gid = ctypes.c_uint32(), ctypes.c_uint32()
    err = munge.munge_decode(cred.encode("ascii"), None, ctypes.byref(buf),
                             ctypes.byref(length), ctypes.byref(uid), ctypes.byref(gid))
    try:
        payload = ctypes.string_at(buf, length.value) if buf.value and length.value > 0 \
            else b""
    finally:
        if buf.value:
            libc.free(buf)
    if err == MungeStatus.SOCKET:
        raise MungeUnavailable("munged does not answer",
                               hint="check that munged runs (systemctl status munge)")
    return Decoded(int(err), int(uid.value), int(gid.value), payload)
