"""JSON (the report dict as is) and CSV (one metric per row, for spreadsheets and tools)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Dict


def render_json(report: Dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def render_csv(report: Dict[str, Any]) -> str:
    """Long format ``section,name,metric,value``: stable columns whatever the classes are."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["section", "name", "metric", "value"])
    for name, metrics in [*report["classes"].items(), ("overall", report["overall"])]:
        for key, value in metrics.items():
            if isinstance(value, dict):
                for k2, v2 in value.items():
                    w.writerow(["class", name, f"{key}.{k2}", _cell(v2)])
            else:
                w.writerow(["class", name, key, _cell(value)])
    for name, p in report["pools"].items():
        for key, value in p.items():
            w.writerow(["pool", name, key, _cell(value)])
    for name, ck in report["checkpoints"].items():
        for key, value in ck.items():
            w.writerow(["checkpoint", name, key, _cell(value)])
    for section, label in (("users", "user"), ("accounts", "account")):
        for r in report.get("who", {}).get(section, []):
            for key, value in r.items():
                if key != label:
                    w.writerow([label, r[label], key, _cell(value)])
    for e in report.get("gpu_efficiency", []):
        for key in ("user", "gpu_util", "gpu_hours", "wasted_gpu_hours"):
            w.writerow(["gpu_efficiency", e["job"], key, _cell(e[key])])
    for action, n in report["monitor_actions"].items():
        w.writerow(["monitor_action", action, "count", n])
    lad = report.get("ladder")
    if lad:
        w.writerow(["ladder", "all", "status", lad["status"]])
        w.writerow(["ladder", "all", "bad_lines", lad["bad_lines"]])
        scopes = [("all", lad["total"])] if lad["total"] else []
        scopes += [(f"class:{k}", v) for k, v in lad["by_class"].items()]
        scopes += [(f"pool:{k}", v) for k, v in lad["by_pool"].items()]
        for scope, tally in scopes:
            for key, value in tally.items():
                if isinstance(value, dict):
                    for step, n in value.items():
                        w.writerow(["ladder", scope, f"{key}.{step}", _cell(n)])
                else:
                    w.writerow(["ladder", scope, key, _cell(value)])
    for p in report["series"]["points"]:
        for key in ("gpu_hours", "wait_mean_s", "wait_max_s", "starts"):
            w.writerow(["series", f"{p['class']}@{p['t']}", key, _cell(p[key])])
    for f in report["findings"]:
        w.writerow(["finding", f["code"], f["severity"],
                    f"{f['message']} [{' '.join(f['subjects'])}]"])
    return buf.getvalue()


def _cell(value: Any) -> Any:
    return "" if value is None else value
