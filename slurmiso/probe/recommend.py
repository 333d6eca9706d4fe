"""The softest pool mode whose mixed inference holds the SLO, and why.

The order comes from the issue's rule, "rate-limit first, then quotas, then partition or
dedicate": each step up costs training (and the site) more, so a step is taken only when the
one below it fails the measured SLO.

* ``timeslice`` (rank 0, *rate-limit*): the GPU's own time slices and nothing reserved; training
  keeps every SM and byte inference does not use, and no daemon or layout has to be run.
* ``mps`` / ``mps-priority`` / ``mps-v3`` (rank 1, *quotas*): one GPU, but each class held to
  a thread percentage and a pinned-memory limit by the MPS control daemon (``mps-priority``
  adds NVIDIA's client priority on one shared server; ``mps-v3`` holds both in a namespace
  per class of one server). Idle SMs are still shared.
* ``mig-dynamic`` / ``mig-static`` (rank 2, *partition*): hardware slices of fixed SMs and
  memory; what one class leaves idle the other cannot use, and a layout has to be managed.
* ``exclusive`` (rank 3, *dedicate*): a whole GPU per class; it always isolates and costs a
  second GPU, so it is the reference and the last resort.

Among modes of one rank, the one that keeps more training throughput wins. A mode whose pair
did not share a GPU (Slurm placed them apart) proves nothing about sharing and is left out,
except ``exclusive``, which is two GPUs by design.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from slurmiso.values import Value

RANK = {"timeslice": 0, "mps": 1, "mps-priority": 1, "mps-v3": 1, "mps-sm-partition": 1,
        "mig-dynamic": 2, "mig-static": 2, "exclusive": 3}
TIER = {0: "rate-limit", 1: "quotas", 2: "partition", 3: "dedicate"}
#: The modes the probe knows, softest first (the order --modes and the report list them in).
MODE_ORDER = ("timeslice", "mps", "mps-priority", "mps-v3", "mps-sm-partition", "mig-dynamic",
              "mig-static", "exclusive")


class Target(Value, eq=True):
    """The inference class's SLO as the probe checks it."""

    infer_class: str
    p99_ms: Optional[float]
    max_error_rate: Optional[float] = None  # a ratio 0..1; None = not configured
    source: str = ""  # where the target came from (config key or option)


def meets(infer: Dict[str, Any], target: Target) -> List[str]:
    """What a run's inference figures miss of ``target`` ([] = it holds)."""
    misses = []
    p99 = infer.get("p99_ms")
    if p99 is None:
        misses.append("no latency measured")
    elif target.p99_ms is not None and p99 > target.p99_ms:
        misses.append(f"P99 {p99:g} ms > {target.p99_ms:g} ms")
    rate = infer.get("error_rate")
    if target.max_error_rate is not None and (rate is None or rate > target.max_error_rate):
        misses.append(f"error rate {_pct(rate)} > {_pct(target.max_error_rate)}")
    return misses


def _pct(ratio: Optional[float]) -> str:
    return "?" if ratio is None else f"{ratio * 100:.2f}%"


def _keeps(mode: Dict[str, Any]) -> float:
    """Training throughput kept beside inference: against a whole GPU where that was measured
    (a partition's cost counts), else against the mode's own solo run."""
    train = mode.get("train") or {}
    value = train.get("throughput_vs_gpu")
    if value is None:
        value = train.get("throughput_vs_solo")
    return -1.0 if value is None else float(value)


def _holds_text(m: Dict[str, Any], target: Target) -> str:
    infer = m["infer"]
    parts = [f"mixed P99 {infer['p99_ms']:g} ms <= {target.p99_ms:g} ms"]
    if target.max_error_rate is not None:
        parts.append(f"error rate {_pct(infer.get('error_rate'))} <= "
                     f"{_pct(target.max_error_rate)}")
    keeps = (m.get("train") or {}).get("throughput_vs_solo")
    if keeps is not None:
        parts.append(f"training keeps {keeps:.0%} of its solo throughput")
    return ", ".join(parts)


def recommend(modes: Sequence[Dict[str, Any]], target: Target) -> Dict[str, Any]:
    """``{"mode", "pool", "why", "held", "missed"}`` for the probe's per-mode results.

    ``modes`` entries carry ``mode``, ``infer`` (mixed figures), ``train`` (with
    ``throughput_vs_solo``), optionally ``pool``, ``infer_solo``, ``colocated`` and ``error``.
    """
    if target.p99_ms is None:
        return {"mode": "none", "pool": None, "held": [], "missed": {},
                "why": f"no P99 target for class {target.infer_class}: set "
                       f"monitor.slo[].p99_latency_ms for it or pass --p99-ms"}
    held: List[Dict[str, Any]] = []
    missed: Dict[str, str] = {}
    for m in modes:
        name = m["mode"]
        if m.get("error") or m.get("skipped"):
            missed[name] = f"not measured: {m.get('error') or m.get('skipped')}"
            continue
        if name not in RANK:
            missed[name] = "unknown mode"
            continue
        if m.get("colocated") is False and name != "exclusive":
            missed[name] = "the pair did not share a GPU, so sharing was not measured"
            continue
        misses = meets(m.get("infer") or {}, target)
        if misses:
            missed[name] = "; ".join(misses)
        else:
            held.append(m)
    if not held:
        return {"mode": "none", "pool": None, "held": [], "missed": missed,
                "why": _none_why(modes, target, missed)}
    best = min(held, key=lambda m: (RANK[m["mode"]], -_keeps(m)))
    rank = RANK[best["mode"]]
    why = (f"{best['mode']} holds the SLO of class {target.infer_class} "
           f"({_holds_text(best, target)}); it is the softest that does "
           f"(step '{TIER[rank]}' of: rate-limit first, then quotas, then partition or "
           f"dedicate)")
    peers = [m for m in held if RANK[m["mode"]] == rank and m is not best]
    if peers:
        others = ", ".join(f"{m['mode']} {_keeps(m):.0%}" for m in peers)
        why += (f"; of the modes of that step it keeps the most training throughput "
                f"({_keeps(best):.0%}; {others})")
    softer = [n for n, r in RANK.items() if r < rank and n in missed]
    if softer:
        why += "; softer modes missed: " + "; ".join(f"{n}: {missed[n]}" for n in softer)
    return {"mode": best["mode"], "pool": best.get("pool"), "why": why,
            "held": [m["mode"] for m in held], "missed": missed}


def _none_why(modes: Sequence[Dict[str, Any]], target: Target, missed: Dict[str, str]) -> str:
    base = (f"no mode holds the SLO of class {target.infer_class} "
            f"(P99 <= {target.p99_ms:g} ms"
            + (f", error rate <= {_pct(target.max_error_rate)}" if target.max_error_rate
               is not None else "") + ")")
    solos = [m for m in modes if not (m.get("error") or m.get("skipped"))
             and (m.get("infer_solo") or {}).get("p99_ms") is not None]
    missing_alone = [m for m in solos if meets(m["infer_solo"], target)]
    if solos and len(missing_alone) == len(solos):
        best = min(solos, key=lambda m: m["infer_solo"].get("p99_ms") or float("inf"))
        return (base + f": inference alone already misses it (best solo P99 "
                f"{best['infer_solo'].get('p99_ms')} ms, {best['mode']}), so no isolation can "
                "fix it; speed up the service or revise the SLO")
    measured = [m for m in modes if not (m.get("error") or m.get("skipped"))
                and (m.get("infer") or {}).get("p99_ms") is not None]
    if measured:
        closest = min(measured, key=lambda m: m["infer"]["p99_ms"])
        base += f"; closest: {closest['mode']} at P99 {closest['infer']['p99_ms']:g} ms"
    if missed:
        base += "; " + "; ".join(f"{n}: {why}" for n, why in missed.items())
    return base
