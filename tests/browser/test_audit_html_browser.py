"""The HTML report in a real browser: Debian's headless Chromium loads it, takes a screenshot,
and must log no console message and make no request that leaves the file.

Requests are read from Chromium's own NetLog (``--log-net-log``): a request the *page* made
carries the page's ``file://`` site in its network isolation key, so the browser's background
traffic (update checks) is told apart from the report's. Console messages come from
``--enable-logging=stderr`` (``CONSOLE`` lines). The test is shown to catch both by a page that
does each (:func:`test_the_checks_catch_a_page_that_phones_home`).

Chromium comes from ``tests/tools/install-chromium.sh``, which ``make test`` (and so CI) runs;
these tests live apart from ``tests/unit`` so ``make unit`` needs no browser. Without Chromium
they fail, by design: a screenshot test that skips proves nothing.
``UPDATE_GOLDEN=1`` also copies the screenshot to docs/audit-report.png for the README.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import zlib
from typing import List, Set, Tuple

import pytest

from tests.audit_helpers import ROOT, SACCT, run_audit, utc  # noqa: F401

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--enable-logging=stderr", "--v=0"]
DOCS_PNG = os.path.join(ROOT, "docs", "audit-report.png")


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("chromium is not installed: run tests/tools/install-chromium.sh (as root)")
    return path


def load(page: str, tmp: str, size: str = "1050,1900") -> Tuple[List[str], Set[str], str]:
    """(console lines, URLs the page requested, screenshot path) for ``page``."""
    net, png = os.path.join(tmp, "net.json"), os.path.join(tmp, "shot.png")
    proc = subprocess.run(
        [chromium(), *FLAGS, f"--user-data-dir={os.path.join(tmp, 'profile')}",
         f"--log-net-log={net}", f"--window-size={size}", f"--screenshot={png}",
         "file://" + page],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [x for x in proc.stderr.splitlines() if ":CONSOLE" in x]
    with open(net) as fh:
        log = json.load(fh)
    kinds = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    requested = set()
    for event in log["events"]:
        params = event.get("params") or {}
        if kinds.get(event["type"]) != "URL_REQUEST_START_JOB" or "url" not in params:
            continue
        by_page = "file://" in str(params.get("network_isolation_key", ""))
        if by_page and not params["url"].startswith(("file://", "data:")):
            requested.add(params["url"])
    return console, requested, png


def png_colours(path: str) -> int:
    """Distinct byte values in the decoded image rows: a blank page has one or two."""
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, idat = 8, b""
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        if kind == b"IDAT":
            idat += data[at + 8:at + 8 + length]
        at += 12 + length
    return len(set(zlib.decompress(idat)))


def test_the_checks_catch_a_page_that_phones_home(tmp_path):
    page = os.path.join(str(tmp_path), "bad.html")
    with open(page, "w") as fh:
        fh.write('<!DOCTYPE html><html><body><img src="http://192.0.2.1/x.png">'
                 '<script>console.error("boom")</script></body></html>')
    console, requested, _ = load(page, str(tmp_path), "400,300")
    assert any("boom" in x for x in console)
    assert requested == {"http://192.0.2.1/x.png"}


def test_report_loads_clean_offline_and_renders(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    page = os.path.join(str(tmp_path), "audit.html")
    open(os.path.join(str(tmp_path), "journal.jsonl"), "w").close()
    rc, _, err = run_audit(["--sacct-file", os.path.join(SACCT, "synthetic-week.txt"),
                            "--journal", os.path.join(str(tmp_path), "journal.jsonl"),
                            "--format", "html", "-o", page], capsys, monkeypatch)
    assert rc in (0, 1), err
    console, requested, png = load(page, str(tmp_path))
    assert console == [] and requested == set()
    assert png_colours(png) > 50  # charts and tables drew, not a blank page
    if os.environ.get("UPDATE_GOLDEN") == "1":
        shutil.copyfile(png, DOCS_PNG)


def test_the_readme_shows_the_committed_screenshot() -> None:
    assert os.path.exists(DOCS_PNG) and png_colours(DOCS_PNG) > 50
    with open(os.path.join(ROOT, "README.md")) as fh:
        assert "docs/audit-report.png" in fh.read()
