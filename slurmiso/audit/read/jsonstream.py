"""Read the elements of one top-level JSON array without loading the whole document.

``sacct --json`` prints ``{"meta": ..., "errors": [...], "jobs": [ {...}, {...} ]}`` (key order
varies by version) and a busy cluster's month is gigabytes of it. The stdlib has no streaming
JSON parser, so this walks the top-level object with ``JSONDecoder.raw_decode`` over a sliding
buffer: each small value (meta, errors) and each array element is decoded on its own, and the
buffer only ever holds about one element plus one read chunk.
"""

from __future__ import annotations

import json
from typing import IO, Any, Dict, Iterator, List, Tuple

CHUNK = 1 << 20
#: One element larger than this is not sacct output; stop before memory runs away.
MAX_ELEMENT = 256 << 20


class TruncatedJson(ValueError):
    """The document ended early; every complete element before the cut was yielded."""


class _Buffer:
    def __init__(self, fh: IO[str]) -> None:
        self.fh = fh
        self.text = ""
        self.pos = 0
        self.eof = False
        self.decoder = json.JSONDecoder()

    def more(self) -> bool:
        if self.eof:
            return False
        chunk = self.fh.read(CHUNK)
        if not chunk:
            self.eof = True
            return False
        if self.pos:
            self.text = self.text[self.pos :]
            self.pos = 0
        if len(self.text) > MAX_ELEMENT:
            raise ValueError(f"a JSON value longer than {MAX_ELEMENT >> 20} MiB: not sacct output")
        self.text += chunk
        return True

    def peek(self) -> str:
        """The next non-blank character (consumed blanks), or "" at the end."""
        while True:
            text, pos = self.text, self.pos
            while pos < len(text) and text[pos] in " \t\r\n":
                pos += 1
            self.pos = pos
            if pos < len(text):
                return text[pos]
            if not self.more():
                return ""

    def expect(self, chars: str) -> str:
        c = self.peek()
        if not c:
            raise TruncatedJson(f"document ends where one of {chars!r} was expected")
        if c not in chars:
            raise ValueError(f"expected one of {chars!r} at offset {self.pos}, found {c!r}")
        self.pos += 1
        return c

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.text, self.pos)
            except json.JSONDecodeError as exc:
                if self.more():
                    continue
                cut = exc.pos >= len(self.text.rstrip()) or exc.msg.startswith("Unterminated")
                if self.eof and cut:
                    raise TruncatedJson(f"document ends inside a value ({exc.msg})") from None
                raise ValueError(f"{exc.msg} at offset {exc.pos}") from None
            # a number at the buffer's end may continue in the next chunk
            partial = end == len(self.text) and not isinstance(value, (dict, list, str))
            if partial and self.more():
                continue
            self.pos = end
            return value


def iter_array(fh: IO[str], key: str, others: Dict[str, Any]) -> Iterator[Any]:
    """Yield the elements of ``document[key]``; the other top-level values go into ``others``.

    Raises :class:`TruncatedJson` after the last complete element when the input stops early,
    and ``ValueError`` for input that is not a JSON object.
    """
    buf = _Buffer(fh)
    buf.expect("{")
    if buf.peek() == "}":
        return
    while True:
        name = buf.value()
        buf.expect(":")
        if name == key and buf.peek() == "[":
            buf.expect("[")
            if buf.peek() != "]":
                while True:
                    yield buf.value()
                    if buf.expect(",]") == "]":
                        break
            else:
                buf.expect("]")
        else:
            others[str(name)] = buf.value()
        if buf.expect(",}") == "}":
            return


def split_meta(others: Dict[str, Any]) -> Tuple[str, List[Any]]:
    """(Slurm release, errors) from ``sacct --json``'s meta/errors, whatever the version."""
    meta = others.get("meta") or {}
    slurm = meta.get("Slurm") or meta.get("slurm") or {}
    release = str(slurm.get("release") or "")
    if not release and isinstance(slurm.get("version"), dict):
        v = slurm["version"]
        release = f"{v.get('major')}.{v.get('minor')}.{v.get('micro')}"
    errors = others.get("errors") or []
    return release, errors if isinstance(errors, list) else [errors]
