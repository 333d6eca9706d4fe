"""The HTML report's charts and heading, read back out of the SVG it draws (issue 16's list:
points placed by time with gaps, separate/log scales, fixed class colours, readable labels,
a heading that counts only findings at or above the threshold)."""

from __future__ import annotations

import re
from typing import Any, Dict, List, Tuple

from slurmiso.audit.render.html import PALETTE
from tests.audit_helpers import run_audit, utc  # noqa: F401
from tests.unit.test_audit_figures import row, sacct

CHARTS = re.compile(r"<h3>(.*?)</h3>(<svg.*?</svg>)", re.S)


def html(tmp_path: Any, capsys: Any, monkeypatch: Any, rows: List[str]) -> str:
    journal = tmp_path / "j.jsonl"
    journal.write_text("")
    rc, out, err = run_audit(["--sacct-file", sacct(tmp_path, rows), "--journal", str(journal),
                              "--format", "html"], capsys, monkeypatch)
    assert rc in (0, 1), err
    return out


def charts(page: str) -> Dict[str, str]:
    return {title.split(" (")[0]: svg for title, svg in CHARTS.findall(page)}


def lines(svg: str) -> Dict[str, List[List[Tuple[float, float]]]]:
    """colour -> segments (polylines, or single points drawn as circles) of (x, y)."""
    out: Dict[str, List[List[Tuple[float, float]]]] = {}
    for colour, points in re.findall(r'<polyline[^>]*stroke="([^"]+)"[^>]*points="([^"]+)"',
                                     svg):
        out.setdefault(colour, []).append(
            [(float(p.split(",")[0]), float(p.split(",")[1])) for p in points.split()])
    for cx, cy, colour in re.findall(r'<circle cx="([^"]+)" cy="([^"]+)" r="3" fill="([^"]+)"',
                                     svg):
        out.setdefault(colour, []).append([(float(cx), float(cy))])
    return out


def _train_weeks() -> List[str]:
    # jobs on 1 and 2 May, then nothing until 15 May
    return [row(str(i), day=f"2024-05-{d:02d}", start="01:00:00", end="01:30:00",
                submit="01:00:00") for i, d in ((1, 1), (2, 2), (9, 15))]


def test_points_are_placed_by_time_and_a_gap_breaks_the_line(tmp_path, utc, capsys,  # noqa: F811
                                                             monkeypatch):
    page = html(tmp_path, capsys, monkeypatch, _train_weeks())
    segments = lines(charts(page)["GPU-hours by class"])[PALETTE[1]]  # train: 2nd class
    assert len(segments) == 3  # days without jobs are not bridged by a line
    x1, x2, x15 = sorted(x for seg in segments for x, _ in seg)
    assert (x15 - x2) / (x2 - x1) > 11  # 13 days look 13 times as long as one day


def test_waits_of_seconds_and_hours_get_a_log_axis(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rows = [row(f"{i}", qos="infer", part="infer", tres="gres/mps=10", submit="01:00:00",
                start="01:00:10", end="01:10:00") for i in range(1, 3)]
    rows += [row("7", submit="01:00:00", start="05:00:00", end="06:00:00")]
    svg = charts(html(tmp_path, capsys, monkeypatch, rows))["Mean queue wait by class, log scale"]
    infer = [y for seg in lines(svg)[PALETTE[0]] for _, y in seg]
    train = [y for seg in lines(svg)[PALETTE[1]] for _, y in seg]
    bottom = max(float(y) for y in re.findall(r'<line x1="\d+" y1="([\d.]+)"', svg))
    top = min(float(y) for y in re.findall(r'<line x1="\d+" y1="([\d.]+)"', svg))
    # on a linear axis up to 4 h, a 10 s wait would sit on the bottom line
    assert bottom - infer[0] > 0.15 * (bottom - top) and train[0] < infer[0]
    assert ">1m<" in svg and ">1h<" in svg


def test_class_colours_follow_the_config_order(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    only_train = html(tmp_path, capsys, monkeypatch, [row("1")])
    both = html(tmp_path, capsys, monkeypatch, [
        row("1"), row("2", qos="infer", part="infer", tres="gres/mps=10")])
    for page in (only_train, both):
        legend = dict((name, colour) for colour, name in re.findall(
            r'<rect [^>]*fill="([^"]+)"/><text [^>]*>([^<]+)</text>',
            charts(page)["GPU-hours by class"]))
        assert legend["train"] == PALETTE[1]  # train is the config's second class
    assert "infer" not in charts(only_train)["GPU-hours by class"]


def test_time_labels_are_few_and_apart(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rows = [row(str(i), day=f"2024-05-{d:02d}", start="01:00:00", end="02:00:00",
                submit="01:00:00") for i, d in enumerate(range(1, 29), 1)]
    svg = charts(html(tmp_path, capsys, monkeypatch, rows))["GPU-hours by class"]
    xs = [float(x) for x, _ in re.findall(r'<text x="([\d.]+)" y="[\d.]+" font-size="11" '
                                           r'text-anchor="(?:start|middle|end)" fill="#555">'
                                           r'(\d{4}-\d\d-\d\d|\d\d-\d\d \d\d:\d\d)</text>', svg)]
    assert 2 <= len(xs) <= 7
    assert min(b - a for a, b in zip(xs, xs[1:])) >= 60


def test_the_heading_counts_only_findings_at_or_above_the_threshold(tmp_path, utc, capsys,  # noqa: F811
                                                                   monkeypatch):
    page = html(tmp_path, capsys, monkeypatch, [row("1")])  # one info finding (empty journal)
    assert "journal-empty" in page
    assert "<h1>slurmiso audit: <span class=ok>clean</span></h1>" in page
    assert "Findings (1 in all, 0 at or above warning)" in page
