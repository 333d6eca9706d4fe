"""The probe's HTML report in real headless Chromium: no console message, no request
leaving the file, a page that drew."""

from __future__ import annotations

from test_audit_html_browser import load, png_colours

from slurmiso.probe.render import render_html
from tests.unit.test_probe_audit_html import report


def test_probe_html_loads_clean_offline_and_renders(tmp_path) -> None:
    page = tmp_path / "probe.html"
    page.write_text(render_html(report()))
    console, requested, png = load(str(page), str(tmp_path))
    assert console == [] and requested == set()
    assert png_colours(png) > 50
    html = page.read_text()
    assert html.count("<svg") == 1 and "SLO P99 250 ms" in html  # one measured mode: one CDF
