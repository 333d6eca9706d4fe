"""A CUDA client for gpu_check.py, written with torch: what an MPS daemon's limits leave it.

``python mps_client.py mem LIMIT_MB``: allocate half the limit (must work), then more than the
limit (must fail: the daemon's pinned-memory limit). ``python mps_client.py sm SECONDS``: the
SM count CUDA reports to this process and how many large matmuls it does per second. One JSON
line on stdout; exit 0 whenever it could measure, 3 when torch or CUDA is missing.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list) -> int:
    try:
        import torch
    except Exception as exc:  # torch not importable: the caller skips with this reason
        print(json.dumps({"error": f"torch not importable: {exc}"}))
        return 3
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch sees no CUDA device"}))
        return 3
    props = torch.cuda.get_device_properties(0)
    out = {"device": props.name, "sm_count": props.multi_processor_count,
           "total_mb": props.total_memory // 2**20}
    if argv[0] == "mem":
        limit = int(argv[1])
        try:
            a = torch.empty(limit // 2 * 2**20, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            out["under_limit_ok"] = True
            del a
            torch.cuda.empty_cache()
        except RuntimeError as exc:
            out["under_limit_ok"], out["under_error"] = False, str(exc)[:300]
        try:
            b = torch.empty((limit + 512) * 2**20, dtype=torch.uint8, device="cuda")
            torch.cuda.synchronize()
            out["over_limit_allocated"] = True
            del b
        except RuntimeError as exc:  # CUDA out of memory: the limit held
            out["over_limit_allocated"], out["over_error"] = False, str(exc)[:300]
    else:
        seconds = float(argv[1])
        x = torch.randn(8192, 8192, device="cuda")
        for _ in range(3):
            x @ x
        torch.cuda.synchronize()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            x @ x
            n += 1
            if n % 8 == 0:
                torch.cuda.synchronize()
        torch.cuda.synchronize()
        out["matmuls_per_s"] = round(n / (time.perf_counter() - t0), 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
