"""The shipped agent unit against a real node's layout (issue 33, item 9): a training job's
step file lives in its working directory (``jobfiles.steps_path``), under /home, /tmp,
/var/tmp or a scratch file system, and the agent must see it there; its file-descriptor
limit leaves room for the connections it caps (``agent_http``)."""

from __future__ import annotations

import os
from typing import Dict, List

import pytest

from slurmiso.jobfiles import steps_path

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
UNIT = os.path.join(REPO, "etc", "systemd", "slurmiso-agent.service")
#: Working directories jobs run in on real clusters.
WORK_DIRS = ("/home/alice/run", "/tmp/job-41", "/var/tmp/bob", "/scratch/carol/x",
             "/run/user/1000/w", "/root/exp")
_TRUE = {"1", "yes", "true", "on"}


def service_settings(text: str) -> Dict[str, List[str]]:
    """The [Service] section's settings, every value of a key that may repeat, in order."""
    out: Dict[str, List[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, eq, value = line.partition("=")
        if eq and section == "Service":
            out.setdefault(key.strip(), []).append(value.strip())
    return out


def _under(path: str, roots: List[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def hidden(settings: Dict[str, List[str]], path: str) -> str:
    """Why the unit's sandbox hides ``path`` from the service ("" when it can read it), as
    systemd.exec(5) says: ProtectHome=yes makes /home, /root and /run/user empty and
    inaccessible (tmpfs: empty), PrivateTmp gives the service its own /tmp and /var/tmp,
    InaccessiblePaths and TemporaryFileSystem hide what they name."""
    last = {k: v[-1].lower() for k, v in settings.items() if v}
    home = last.get("ProtectHome", "no")
    if home in _TRUE | {"tmpfs"} and _under(path, ["/home", "/root", "/run/user"]):
        return f"ProtectHome={home}"
    if last.get("PrivateTmp", "no") in _TRUE and _under(path, ["/tmp", "/var/tmp"]):
        return "PrivateTmp"
    for key in ("InaccessiblePaths", "TemporaryFileSystem"):
        roots = [w.lstrip("-+").split(":")[0] for v in settings.get(key, ()) for w in v.split()]
        if _under(path, roots):
            return key
    return ""


def test_the_shipped_agent_unit_can_read_step_files_where_jobs_write_them() -> None:
    with open(UNIT, encoding="utf-8") as fh:
        settings = service_settings(fh.read())
    for work in WORK_DIRS:
        path = steps_path(work, "41")
        assert path is not None and path.startswith(work)
        assert hidden(settings, path) == "", f"{path}: the agent cannot read it"


def test_the_shipped_agent_unit_stays_read_only() -> None:
    """Seeing every step file does not mean writing anywhere: it changes nothing."""
    with open(UNIT, encoding="utf-8") as fh:
        settings = service_settings(fh.read())
    assert settings["ProtectSystem"] == ["strict"] and "/" in settings["ReadOnlyPaths"]
    assert settings["ProtectHome"][-1] == "read-only"
    assert settings["NoNewPrivileges"] == ["yes"]


def test_the_agent_unit_gives_room_for_its_connection_cap() -> None:
    """A thousand idle sockets must not exhaust the agent's descriptors: its limit is set,
    and the server's cap (derived from it) leaves the refresher its own reserve."""
    from slurmiso.agent.http_server import RESERVED_FDS, connection_cap

    with open(UNIT, encoding="utf-8") as fh:
        settings = service_settings(fh.read())
    limit = int(settings["LimitNOFILE"][-1].split(":")[0])
    assert limit >= 4096
    assert 1000 < connection_cap(limit) <= limit - RESERVED_FDS


@pytest.mark.parametrize("setting, path, why", [
    ({"ProtectHome": ["yes"]}, "/home/a/.slurmiso-steps.1.json", "ProtectHome=yes"),
    ({"PrivateTmp": ["true"]}, "/var/tmp/.slurmiso-steps.1.json", "PrivateTmp"),
    ({"InaccessiblePaths": ["-/scratch"]}, "/scratch/x/.s.json", "InaccessiblePaths"),
    ({"ProtectHome": ["read-only"]}, "/home/a/.slurmiso-steps.1.json", ""),
])
def test_the_sandbox_model_names_what_hides_a_path(
        setting: Dict[str, List[str]], path: str, why: str) -> None:
    """The checker itself: a unit that would hide a step file is caught (the old unit's
    ProtectHome=yes and PrivateTmp=yes)."""
    assert hidden(setting, path) == why
