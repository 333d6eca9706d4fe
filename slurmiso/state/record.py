"""The job record's shape, checked on every read.

The record (``state_dir/jobs/<jobid>.json``) is the contract between prolog, epilog,
reconcile, status and the wrapper. Until it becomes the typed, versioned dataclass issue 14
asks for, this is the one list of the fields every reader relies on and the JSON types they
must have, so a corrupt file drains the node with its name instead of a KeyError deep in a
handler. Stdlib only: every hook imports it.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping

#: The fields of a job record every reader relies on, with the JSON types they must have.
_RECORD_FIELDS: Dict[str, Any] = {
    "job_id": str, "uid": int, "status": str, "mode": str, "gpus": list, "resources": list,
    "claims": list, "env": dict, "warnings": list, "restart_count": int, "times": dict,
    "late_epilogs": int,
}
_STATUSES = ("preparing", "ready", "refused", "releasing", "released")
#: Per resource kind: fields that must be whole numbers (when the state says they exist).
_RESOURCE_INTS = {"mig-dynamic": ("gpu", "start"), "mps": ("gpu",)}


def record_problem(record: Mapping[str, Any]) -> str:
    """Why a job record cannot be trusted ("" if it can): checked on every read, so a
    corrupt file drains the node with its name instead of a KeyError deep in a handler."""
    for name, kind in _RECORD_FIELDS.items():
        if name in record and (
            not isinstance(record[name], kind) or isinstance(record[name], bool)
        ):
            return f"field {name!r} is {type(record[name]).__name__}, expected {kind.__name__}"
    if "status" in record and record["status"] not in _STATUSES:
        return f"status {str(record['status'])[:40]!r} is not one of {', '.join(_STATUSES)}"
    if not all(isinstance(g, int) and not isinstance(g, bool) for g in record.get("gpus", [])):
        return "'gpus' holds something other than GPU indices"
    if not all(isinstance(c, str) for c in record.get("claims", [])):
        return "'claims' holds something other than allocation keys"
    for i, res in enumerate(record.get("resources", [])):
        if not isinstance(res, dict) or not isinstance(res.get("kind"), str):
            return f"resources[{i}] is not an object with a 'kind'"
        if not isinstance(res.get("state", ""), str):
            return f"resources[{i}].state is not a string"
        for name in _RESOURCE_INTS.get(res["kind"], ()):
            if name == "start" and res.get("state") == "released":
                continue
            value = res.get(name)
            if not isinstance(value, int) or isinstance(value, bool):
                return f"resources[{i}] ({res['kind']}) has no whole-number {name!r}"
        if res["kind"] == "mig-dynamic":
            if not isinstance(res.get("profile"), str):
                return f"resources[{i}] (mig-dynamic) has no 'profile'"
            gi = res.get("gi")
            if res.get("state") == "ready" and (not isinstance(gi, int) or isinstance(gi, bool)):
                return f"resources[{i}] (mig-dynamic, ready) has no whole-number 'gi'"
    return ""
