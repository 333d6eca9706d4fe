"""The MPS stand-in's static SM partitions (``nvidia-cuda-mps-control -d -S``, CUDA 13.1+).

What NVIDIA documents (MPS guide, "Legacy MPS v2 Interface" and "Common Tasks"; CUDA
programming guide, "Green contexts"): the mode is chosen when the daemon starts (``-S``,
Ampere and newer); ``sm_partition add <GPU UUID> <chunks>`` prints the full partition ID,
``<GPU UUID>/<id>``; ``sm_partition rm <GPU UUID> <id>`` removes it; ``lspart`` lists them; a
client picks one with ``CUDA_MPS_SM_PARTITION=<GPU UUID>/<id>``; SMs are not oversubscribed,
and the active thread percentage "is no longer applicable". What it does not document, and the
stand-in takes from third-party code (unverified): 8 SMs per chunk (Hopper and later), and a
client without a valid partition being refused. docs/mps-v3.md says which is which.
"""

from __future__ import annotations

import base64
import json
from typing import Dict, List, Optional, Tuple

#: SMs per chunk (third-party code for Hopper and later; NVIDIA says "chunks" only).
CHUNK_SMS = 8


class SmPartitions:
    """One GPU's chunks and the partitions carved from them."""

    def __init__(self, gpu_uuid: str, sm_count: int) -> None:
        self.uuid = gpu_uuid
        self.sm_count = sm_count
        self.total = sm_count // CHUNK_SMS
        self.parts: Dict[str, int] = {}  # partition id -> chunks
        self._made = 0

    def free(self) -> int:
        return self.total - sum(self.parts.values())

    def command(self, words: List[str]) -> Optional[str]:
        """The answer to a partition command, None when ``words`` is not one."""
        if words == ["lspart"]:
            rows = [f"{self.uuid} {pid} {n} {n * CHUNK_SMS}" for pid, n in self.parts.items()]
            return "\n".join(["GPU Partition chunks SMs", *rows, f"{self.uuid} free "
                              f"{self.free()} {self.free() * CHUNK_SMS}"]) + "\n"
        if words[:2] == ["sm_partition", "add"] and len(words) == 4:
            return self._add(words[2], words[3])
        if words[:2] == ["sm_partition", "rm"] and len(words) == 4:
            if not self._ours(words[2]) or words[3] not in self.parts:
                return f"error: no partition {words[3][:80]} on {words[2][:80]}\n"
            del self.parts[words[3]]
            return ""
        return None

    def _ours(self, uuid: str) -> bool:
        return len(uuid) >= 8 and self.uuid.startswith(uuid)  # a unique prefix will do

    def _add(self, uuid: str, chunks: str) -> str:
        if not self._ours(uuid):
            return f"error: no device {uuid[:80]}\n"
        if not chunks.isdigit() or int(chunks) < 1:
            return f"error: {chunks[:20]} is not a number of chunks\n"
        if int(chunks) > self.free():
            return f"error: not enough free chunks ({self.free()} free of {self.total})\n"
        self._made += 1
        pid = base64.b32encode(self._made.to_bytes(5, "big")).decode().rstrip("=")
        self.parts[pid] = int(chunks)
        return f"{self.uuid}/{pid}\n"

    def grant(self, value: str) -> Tuple[Optional[Dict[str, object]], str]:
        """(what a client asking for partition ``value`` gets, "") or (None, why not)."""
        uuid, _, pid = value.strip().partition("/")
        if not value:
            return None, "static SM partitioning: the client names no CUDA_MPS_SM_PARTITION"
        if not self._ours(uuid) or pid not in self.parts:
            return None, f"static SM partitioning: no partition {value[:120]!r}"
        sms = self.parts[pid] * CHUNK_SMS
        return {"sm_partition": f"{self.uuid}/{pid}", "sm_count": sms,
                "active_thread_percentage": round(100.0 * sms / self.sm_count, 1)}, ""


def refusal(why: str) -> str:
    """A refused client's answer, as the stand-in's clients read it."""
    return json.dumps({"mps": False, "error": why}) + "\n"
