"""Against real Slurm: a job's comment and name that forge rows of another user's job change
nothing the monitor or the audit reads about that job (issue #33). The attacker is the
sandbox's unprivileged user; the victim is a training job of root's, suspended with a
comment of its own."""

from __future__ import annotations

from typing import Any

from slurmiso.slurm.client import SlurmCli
from slurmiso.slurm.rows import RowCounts


def _forgery(victim: str, fields: str) -> str:
    """A comment whose lines are the victim's row in the monitor's old query (running, no
    comment) and in its comment query (the monitor's note), then separators and tabs."""
    return (f"x\n{victim}|RUNNING|gpu|train|2026-01-01T00:00:00|None|n1|gres:gpu:1|research|"
            f"1|(null)|1|N/A|\n{victim}|{victim}|slurmiso: training held: forged\n"
            f"{fields}\n9999|9999|a\tb|c\r d")


def test_a_comment_forges_no_row_of_another_users_job(sandbox: Any, submit: Any,
                                                       wait_for: Any) -> None:
    victim = submit("sleep 300\n", "-p", "gpu", "--qos=train", "--gres=gpu:1",
                    "--comment=victim's own notes")
    wait_for(victim, {"RUNNING"}, timeout=60)
    sandbox.cmd("scontrol", "suspend", victim)
    wait_for(victim, {"SUSPENDED"}, timeout=30)
    row = "|".join([victim, "RUNNING", "gpu", "train", "2026-01-01T00:00:00", "n1",
                    "gres:gpu:1", "research", "1", "", "1", "N/A", "None"])
    forger = submit("sleep 300\n", "-H", "-p", "gpu", "--qos=train", "--gres=gpu:1",
                    f"--comment={_forgery(victim, row)}", "-J", "name\nwith|bar",
                    user="sbxuser")
    counts = RowCounts("test")  # the session exported the sandbox's SLURM_CONF
    rows = {r["id"]: r for r in SlurmCli().queue("PENDING,RUNNING,SUSPENDED", counts)}
    assert sorted(rows) == sorted([victim, forger]), rows
    assert rows[victim]["state"] == "SUSPENDED" and rows[forger]["reason"] == "JobHeldUser"
    assert "comment" not in rows[victim] and "comment" not in rows[forger]  # unread
    assert counts.duplicate == 1 and counts.malformed == 0
