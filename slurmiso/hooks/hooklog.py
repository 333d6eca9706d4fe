"""Syslog for the hooks through the C ``syslog`` module, not ``logging.handlers``.

``logging.handlers`` imports ``socket``, ``pickle``, ``queue`` and ``threading`` to reach
``/dev/log``; with no site-packages that was about 10 ms on top of ``logging`` per hook start
(measured with ``python3 -S``), paid on every job. The C module writes the same line: the tag
``slurmiso-<phase>[<job>]``, facility user, the record's level as the priority.
"""

from __future__ import annotations

import logging

#: logging level -> syslog priority, as logging.handlers.SysLogHandler maps them.
_PRIORITY = ((logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
             (logging.INFO, 6))
_DEBUG = 7


def priority(levelno: int) -> int:
    """The syslog priority (LOG_CRIT=2 .. LOG_DEBUG=7) of a logging level."""
    for level, prio in _PRIORITY:
        if levelno >= level:
            return prio
    return _DEBUG


class SyslogHandler(logging.Handler):
    """Sends each record to the local syslog under ``ident`` (``openlog`` once per process)."""

    def __init__(self, ident: str) -> None:
        super().__init__()
        import syslog

        self._syslog = syslog
        syslog.openlog(ident, 0, syslog.LOG_USER)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._syslog.syslog(priority(record.levelno), self.format(record))
        except Exception:  # noqa: BLE001 - logging must never take the hook down
            self.handleError(record)
