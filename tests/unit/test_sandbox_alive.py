"""The sandbox's daemon liveness check survives a pid file being rewritten (Slurm's daemons
truncate it, then write): read in between it is empty, and that is not a dead daemon."""

from __future__ import annotations

from typing import Any, List, Optional

from slurmiso_sandbox import services


class Flicker:
    """A service whose pid file reads empty ``gaps`` times, then shows the daemon."""

    def __init__(self, gaps: int) -> None:
        self.answers: List[Optional[int]] = [None] * gaps + [4242]

    def pid(self) -> Optional[int]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def test_an_empty_pid_file_for_an_instant_is_not_a_dead_daemon() -> None:
    svc: Any = Flicker(gaps=1)
    assert services.alive(svc)() is True


def test_a_pid_file_that_stays_empty_is_a_dead_daemon() -> None:
    svc: Any = Flicker(gaps=10)
    assert services.alive(svc)() is False
