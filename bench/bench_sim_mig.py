"""Simulated backend: MIG instance create+destroy throughput.

Baseline: the same number of locked read-modify-write cycles of the same state file (what
every sim operation costs at least), so the ratio shows the backend's own overhead.
"""

from __future__ import annotations

import os
import sys
import tempfile

from common import report, time_call

OPS = 200


def main() -> bool:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from slurmiso.gpu.backend import create_mig_device, destroy_mig_device
    from slurmiso.gpu.sim import SimBackend, _StateFile, init_state

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sim.json")
        init_state(path, "H100-80GB", 8, mig=True, node="bench")
        sim = SimBackend(path)
        store = _StateFile(path)

        def cycle() -> None:
            inst = create_mig_device(sim, 3, "3g.40gb")
            destroy_mig_device(sim, inst)

        def rmw() -> None:
            with store.transaction():
                pass

        t_ops = sum(time_call(cycle, OPS))
        # create+destroy = GI create, CI create, CI destroy, GI destroy: four transactions
        t_base = sum(time_call(rmw, OPS * 4))
        assert sim.instances() == [], "benchmark left instances behind"
    rate = OPS / t_ops
    base_rate = OPS / t_base
    print(
        f"baseline: {OPS * 4} locked read-modify-write cycles of the state file: "
        f"{base_rate:.0f} equivalent pairs/s"
    )
    return report(
        "sim MIG create+destroy (GI+CI)",
        f"{rate:.0f} pairs/s",
        t_ops / t_base,
        "of the bare file-transaction time",
    )


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
