"""The probe's results where admins read them: the audit's table of the latest probe per pool,
the Prometheus textfile and the text report (the HTML report in a real browser:
tests/browser/test_probe_html_browser.py)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict

import yaml

from slurmiso.probe import store
from slurmiso.probe.render import render_text
from tests.audit_helpers import CONFIG, SACCT, run_audit, utc  # noqa: F401


def report(pool: str = "mps", generated_ts: float = 1_700_000_000.0) -> Dict[str, Any]:
    cdf = [[1.0 + i / 10, (i + 1) / 50] for i in range(50)]
    mode = {"mode": "mps", "pool": pool, "colocated": True, "seconds": 42.0,
            "infer": {"requests": 200, "p50_ms": 3.1, "p95_ms": 7.5, "p99_ms": 11.25,
                      "error_rate": 0.005},
            "infer_solo": {"p99_ms": 4.5}, "train": {"step_s": 0.25, "throughput_vs_solo": 0.8},
            "train_solo": {"step_s": 0.2},
            "memory": {"train_peak_mb": 20000, "train_limit_mb": 24576,
                       "train_headroom_pct": 18.6, "headroom_ok": False},
            "cdf": {"mixed": cdf, "solo": [[x / 2, y] for x, y in cdf]}}
    skipped = {"mode": "mig-dynamic", "pool": "migd", "skipped": "no shards",
               "infer": {}, "train": {}}
    return {"version": 1, "generated": "2023-11-14T22:13:20Z", "generated_ts": generated_ts,
            "where": "slurm", "host": "login1", "gpus": "mps: mps on H100-80GB",
            "workload": {"kind": "torch"},
            "slo": {"class": "infer", "p99_ms": 250.0, "max_error_rate": 0.01,
                    "source": "monitor.slo"},
            "modes": [mode, skipped],
            "recommendation": {"mode": "mps", "why": "mps holds the SLO"},
            "runs": [{"run": "mps-solo-infer", "where": "job 7", "node": "n2", "seconds": 3.0,
                      "output": "/x/mps-solo-infer.out"}], "notes": ["a note"]}


def test_latest_probe_per_pool_and_textfile(tmp_path) -> None:
    d = str(tmp_path)
    store.save(report(generated_ts=1_700_000_000.0), d)
    newer = report(generated_ts=1_700_000_100.0)
    newer["modes"][0]["infer"]["p99_ms"] = 9.0
    store.save(newer, d)
    with open(os.path.join(d, "probe-broken.json"), "w") as fh:
        fh.write("{")
    latest = store.latest_per_pool(d)
    assert list(latest) == ["mps"] and latest["mps"]["infer"]["p99_ms"] == 9.0
    text = store.textfile(newer)
    assert 'slurmiso_probe_p99_seconds{mode="mps",pool="mps"} 0.009\n' in text
    assert 'slurmiso_probe_recommended{mode="mps",pool="mps"} 1' in text
    assert "migd" not in text  # skipped modes export nothing


def test_audit_shows_the_latest_probe_beside_the_pools(tmp_path, capsys, monkeypatch,
                                                        utc) -> None:  # noqa: F811
    with open(CONFIG) as fh:
        data = yaml.safe_load(fh)
    pool = data["pools"][0]["name"]
    data.setdefault("paths", {})["probe_dir"] = str(tmp_path / "probe")
    cfg = tmp_path / "slurmiso.yaml"
    cfg.write_text(yaml.safe_dump(data))
    store.save(report(pool=pool), str(tmp_path / "probe"))
    journal = tmp_path / "journal.jsonl"
    journal.write_text("")
    args = ["--sacct-file", os.path.join(SACCT, "synthetic-week.txt"), "--journal", str(journal)]
    rc, out, err = run_audit(args, capsys, monkeypatch, config=str(cfg))
    assert rc in (0, 1), err
    assert "LATEST PROBE PER POOL (SLURMISO PROBE)" in out.upper()
    row = next(line for line in out.splitlines() if line.startswith(pool + " ") and "mps" in line)
    assert "11.25 ms" in row and "4.5 ms" in row and "80%" in row
    rc, out, _ = run_audit(args + ["--format", "json"], capsys, monkeypatch, config=str(cfg))
    assert json.loads(out)["probe"][pool]["p99_ms"] == 11.25


def test_audit_without_probes_has_no_probe_section(tmp_path, capsys, monkeypatch,
                                                   utc) -> None:  # noqa: F811
    with open(CONFIG) as fh:
        data = yaml.safe_load(fh)
    data.setdefault("paths", {})["probe_dir"] = str(tmp_path / "none")
    cfg = tmp_path / "slurmiso.yaml"
    cfg.write_text(yaml.safe_dump(data))
    journal = tmp_path / "journal.jsonl"
    journal.write_text("")
    rc, out, _ = run_audit(["--sacct-file", os.path.join(SACCT, "synthetic-week.txt"),
                            "--journal", str(journal), "--format", "json"], capsys, monkeypatch,
                           config=str(cfg))
    assert "probe" not in json.loads(out)


def test_text_report_names_every_figure() -> None:
    text = render_text(report())
    assert "recommendation: mps" in text and "11.25" in text and "18.6%" in text or "19%" in text
    assert "skipped: no shards" in text and "LOW" in text
