"""A set of sacct job ids in bounded memory: bits, not Python strings.

The audit must know whether it has seen a job id before (attempts vs jobs). A Python set of
five million ids costs about 100 bytes each; a bitmap costs one bit per id up to the largest
id (Slurm's ``MaxJobId`` defaults to 67,043,328: at most 8 MiB). Array tasks (``123_4``) get a
bitmap per array job. Anything else (pending ranges ``123_[5-9]``, ids beyond the bitmap's
cap) goes into a plain set; sacct prints few of those.
"""

from __future__ import annotations

from typing import Dict, Set

#: Largest id kept as a bit; above it (a hostile or odd file) ids go to the plain set.
MAX_BIT_ID = 1 << 27
MAX_TASK_ID = 1 << 22


def _set_bit(bits: bytearray, n: int) -> bool:
    """Set bit ``n``; True if it was clear. Grows ``bits`` (by at least half) as needed."""
    byte = n >> 3
    if byte >= len(bits):
        bits.extend(bytes(max(byte + 1 - len(bits), len(bits) // 2)))
    mask = 1 << (n & 7)
    if bits[byte] & mask:
        return False
    bits[byte] |= mask
    return True


class JobSet:
    """``add(job_id) -> True`` the first time an id is added, False after."""

    __slots__ = ("_bits", "_tasks", "_other", "count")

    def __init__(self) -> None:
        self._bits = bytearray()
        self._tasks: Dict[int, bytearray] = {}
        self._other: Set[str] = set()
        self.count = 0

    @property
    def bits(self) -> bytearray:
        """The bitmap of plain ids: id ``n`` was added iff ``n < len(bits) * 8`` (and below
        :data:`MAX_BIT_ID`) and its bit ``bits[n >> 3] & 1 << (n & 7)`` is set. The same
        object for the set's life (it grows in place), so a hot loop may bind it once, test
        and set a bit itself where it is inside, and add 1 to :attr:`count` for each it sets
        (the audit's kernel does, inline); any other id goes through :meth:`add`."""
        return self._bits

    def add(self, job: str) -> bool:
        if job.isdecimal():
            n = int(job)
            if n < MAX_BIT_ID:
                bits = self._bits
                byte = n >> 3
                if byte < len(bits):  # the common case inline: inside the bitmap
                    mask = 1 << (n & 7)
                    if bits[byte] & mask:
                        return False
                    bits[byte] |= mask
                    self.count += 1
                    return True
                new = _set_bit(bits, n)  # grows the bitmap
                self.count += new
                return new
        else:  # an array task (as common as plain ids on some clusters): its job's bitmap
            parent, sep, task = job.partition("_")
            if sep and task.isdecimal() and parent.isdecimal():
                t = int(task)
                if t < MAX_TASK_ID:
                    task_bits = self._tasks.get(int(parent))
                    if task_bits is None:
                        task_bits = self._tasks[int(parent)] = bytearray()
                    new = _set_bit(task_bits, t)
                    self.count += new
                    return new
        if job in self._other:
            return False
        self._other.add(job)
        self.count += 1
        return True

    def __contains__(self, job: str) -> bool:
        if job.isdecimal() and int(job) < MAX_BIT_ID:
            n = int(job)
            return (n >> 3) < len(self._bits) and bool(self._bits[n >> 3] & (1 << (n & 7)))
        parent, sep, task = job.partition("_")
        if sep and parent.isdecimal() and task.isdecimal() and int(task) < MAX_TASK_ID:
            bits = self._tasks.get(int(parent))
            t = int(task)
            return bits is not None and (t >> 3) < len(bits) and bool(bits[t >> 3] & (1 << (t & 7)))
        return job in self._other

    def __len__(self) -> int:
        return self.count

    def overlaps(self, other: JobSet) -> bool:
        """Whether an id is in both (bitmaps ANDed as big integers: fast for MiBs)."""
        if _and(self._bits, other._bits):
            return True
        for parent, bits in other._tasks.items():
            mine = self._tasks.get(parent)
            if mine is not None and _and(mine, bits):
                return True
        return not self._other.isdisjoint(other._other)

    def merge(self, other: JobSet) -> None:
        """Add every id of ``other`` (the union; ``count`` recounted only where they meet)."""
        self.count += other.count - _or_into(self._bits, other._bits)
        for parent, bits in other._tasks.items():
            mine = self._tasks.get(parent)
            if mine is None:
                self._tasks[parent] = bits
            else:
                self.count -= _or_into(mine, bits)
        self.count -= len(self._other & other._other)
        self._other |= other._other


def _and(a: bytearray, b: bytearray) -> bool:
    n = min(len(a), len(b))
    return bool(n) and bool(int.from_bytes(a[:n], "little") & int.from_bytes(b[:n], "little"))


def _or_into(mine: bytearray, other: bytearray) -> int:
    """OR ``other`` into ``mine`` (grown to fit); returns how many bits both had set."""
    n = min(len(mine), len(other))
    if len(other) > len(mine):
        mine.extend(other[len(mine):])
    if not n:
        return 0
    x, y = int.from_bytes(mine[:n], "little"), int.from_bytes(other[:n], "little")
    both = bin(x & y).count("1") if x & y else 0
    mine[:n] = (x | y).to_bytes(n, "little")
    return both
