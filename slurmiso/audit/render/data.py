"""JSON (the report dict as is) and CSV (one metric per row, for spreadsheets and tools)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Dict, Iterator, List


def render_json(report: Dict[str, Any]) -> str:
    return json.dumps(report, indent=2, sort_keys=True) + "\n"


def render_csv(report: Dict[str, Any]) -> str:
    """Long format ``section,name,metric,value``: stable columns whatever the classes are."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["section", "name", "metric", "value"])
    for rows in (_class_rows, _table_rows, _who_rows, _ladder_rows, _series_rows):
        w.writerows(rows(report))
    return buf.getvalue()


Rows = Iterator[List[Any]]


def _class_rows(report: Dict[str, Any]) -> Rows:
    for name, metrics in [*report["classes"].items(), ("overall", report["overall"])]:
        for key, value in metrics.items():
            if isinstance(value, dict):
                for k2, v2 in value.items():
                    yield ["class", name, f"{key}.{k2}", _cell(v2)]
            else:
                yield ["class", name, key, _cell(value)]


def _table_rows(report: Dict[str, Any]) -> Rows:
    for section, table in (("pool", report["pools"]), ("checkpoint", report["checkpoints"])):
        for name, figures in table.items():
            for key, value in figures.items():
                yield [section, name, key, _cell(value)]


def _who_rows(report: Dict[str, Any]) -> Rows:
    for section, label in (("users", "user"), ("accounts", "account")):
        for r in report.get("who", {}).get(section, []):
            for key, value in r.items():
                if key != label:
                    yield [label, r[label], key, _cell(value)]
    for e in report.get("gpu_efficiency", []):
        for key in ("user", "gpu_util", "gpu_hours", "wasted_gpu_hours"):
            yield ["gpu_efficiency", e["job"], key, _cell(e[key])]
    for action, n in report["monitor_actions"].items():
        yield ["monitor_action", action, "count", n]


def _ladder_rows(report: Dict[str, Any]) -> Rows:
    lad = report.get("ladder")
    if not lad:
        return
    yield ["ladder", "all", "status", lad["status"]]
    yield ["ladder", "all", "bad_lines", lad["bad_lines"]]
    scopes = [("all", lad["total"])] if lad["total"] else []
    scopes += [(f"class:{k}", v) for k, v in lad["by_class"].items()]
    scopes += [(f"pool:{k}", v) for k, v in lad["by_pool"].items()]
    for scope, tally in scopes:
        for key, value in tally.items():
            if isinstance(value, dict):
                for step, n in value.items():
                    yield ["ladder", scope, f"{key}.{step}", _cell(n)]
            else:
                yield ["ladder", scope, key, _cell(value)]


def _series_rows(report: Dict[str, Any]) -> Rows:
    for p in report["series"]["points"]:
        for key in ("gpu_hours", "wait_mean_s", "wait_max_s", "starts"):
            yield ["series", f"{p['class']}@{p['t']}", key, _cell(p[key])]
    for f in report["findings"]:
        yield ["finding", f["code"], f["severity"],
               f"{f['message']} [{' '.join(f['subjects'])}]"]


def _cell(value: Any) -> Any:
    return "" if value is None else value
