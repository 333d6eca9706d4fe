"""The selectors of ``monitor.signals.servers``: which series of a job's ``/metrics`` answer
mean latency, requests and failures.

``name{label="v",label=~"regex"}``, PromQL's form: the name may hold ``*`` (any run of letters,
digits and ``_``), matchers are ``=``, ``!=``, ``=~`` and ``!~`` (regexes anchored at both ends, as
in PromQL). Here, not in the monitor, because the config loader checks them on every load,
the hooks' included: stdlib ``re`` only, no dataclass.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Pattern, Tuple

_NAME_CHARS = "A-Za-z0-9_:"
_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
Matcher = Tuple[str, str, str, Optional[Pattern[str]]]


class BadSelector(ValueError):
    """A selector that does not parse; the message says where."""


class Selector:
    """A parsed selector: its text, the name pattern as a regex, the label matchers."""

    __slots__ = ("text", "name", "matchers")

    def __init__(self, text: str, name: Pattern[str], matchers: Tuple[Matcher, ...] = ()
                 ) -> None:
        self.text, self.name, self.matchers = text, name, matchers

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"

    def labels_match(self, labels: Dict[str, str]) -> bool:
        for label, op, value, regex in self.matchers:
            have = labels.get(label, "")
            if op == "=" and have != value or op == "!=" and have == value:
                return False
            if regex is not None and (regex.fullmatch(have) is None) == (op == "=~"):
                return False
        return True


def name_regex(pattern: str) -> str:
    """The regex (unanchored) of a selector's name pattern. ``*`` never spans a ``:``: a
    server that namespaces its series (``sglang:``, ``vllm:``) is never read by a wildcard
    meant for plain names."""
    return "".join("[A-Za-z0-9_]*" if ch == "*" else re.escape(ch) for ch in pattern)


def parse_selector(text: str) -> Selector:
    """``vllm:request_success_total{finished_reason=~"error|abort"}`` -> :class:`Selector`."""
    raw = text.strip()
    brace = raw.find("{")
    name = raw if brace < 0 else raw[:brace]
    if not name or not re.fullmatch(f"[{_NAME_CHARS}*]+", name) or name.strip("*") == "":
        raise BadSelector(f"{text!r}: the name must be letters, digits, _ : and * "
                          "(not only *)")
    matchers = []
    if brace >= 0:
        if not raw.endswith("}"):
            raise BadSelector(f"{text!r}: no closing }}")
        body, i = raw[brace + 1:-1], 0
        while i < len(body):
            while i < len(body) and body[i] in " ,":
                i += 1
            if i >= len(body):
                break
            m = _LABEL.match(body, i)
            if not m:
                raise BadSelector(f"{text!r}: a label name expected at {body[i:i + 10]!r}")
            label, i = m.group(0), m.end()
            while i < len(body) and body[i] == " ":
                i += 1
            op = next((o for o in ("=~", "!~", "!=", "=") if body.startswith(o, i)), "")
            if not op:
                raise BadSelector(f"{text!r}: =, !=, =~ or !~ expected after {label}")
            i += len(op)
            while i < len(body) and body[i] == " ":
                i += 1
            value, i = _quoted(body, i, text)
            regex = None
            if op in ("=~", "!~"):
                try:
                    regex = re.compile(value)
                except re.error as exc:
                    raise BadSelector(f"{text!r}: {label}{op}: {exc}") from None
            matchers.append((label, op, value, regex))
    return Selector(raw, re.compile(name_regex(name)), tuple(matchers))


def _quoted(body: str, i: int, text: str) -> Tuple[str, int]:
    if i >= len(body) or body[i] != '"':
        raise BadSelector(f"{text!r}: a value in double quotes expected")
    out, i = [], i + 1
    while i < len(body) and body[i] != '"':
        if body[i] == "\\" and i + 1 < len(body):
            i += 1
        out.append(body[i])
        i += 1
    if i >= len(body):
        raise BadSelector(f"{text!r}: unterminated value")
    return "".join(out), i + 1
