"""Value classes that cost next to nothing to define, for the hooks' start-up path.

slurmd starts the prolog and the epilog as new interpreters on every job, so every class they
define is built per job. ``dataclasses`` writes and compiles the source of each generated
method when a class is defined (about a millisecond a class) and needs ``inspect`` and ``ast``
to import (several more); the config model alone has twenty classes. A :class:`Value`
subclass gets the same contract from one generic ``__init__``: positional or keyword
construction with defaults (``field(default_factory=...)`` for mutable ones), read-only
attributes unless declared ``frozen=False``, a ``repr`` and, with ``eq=True``, equality and
hashing over the fields. mypy reads subclasses as dataclasses (PEP 681 ``dataclass_transform``),
so constructor calls, field types and frozenness stay checked.

A leaf module: no slurmiso imports, and only ``typing`` names at run time.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, Tuple, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_kwargs: Any) -> Any:
        return lambda cls: cls


T = TypeVar("T")
V = TypeVar("V", bound="Value")


class _Factory:
    """A default made anew for each instance (see :func:`field`)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make


def field(*, default_factory: Callable[[], T]) -> T:
    """A mutable default (a dict, a list) made anew for each instance, as in dataclasses."""
    return _Factory(default_factory)  # type: ignore[return-value]


@dataclass_transform(frozen_default=True, eq_default=False, field_specifiers=(field,))
class Value:
    """Base of value classes: the fields are the subclass's annotated names, in order.

    A name with a class-level value has that default; fields without a default come first,
    as in dataclasses. Instances are frozen unless the class says ``frozen=False``, and
    compare by identity unless it says ``eq=True`` (then by type and field values, and a
    frozen one hashes by them too).
    """

    _fields: ClassVar[Tuple[str, ...]] = ()
    _defaults: ClassVar[Dict[str, Any]] = {}

    def __init_subclass__(cls, frozen: bool = True, eq: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("__annotations__")
        if own is None:  # none of its own; Python 3.14 builds them on first access (PEP 649)
            own = cls.__annotations__ if sys.version_info >= (3, 10) else {}
        names = [n for n, kind in own.items() if "ClassVar" not in str(kind)]
        defaults = dict(cls._defaults)
        for name in names:
            if name in cls.__dict__:
                defaults[name] = cls.__dict__[name]
            elif defaults:
                raise TypeError(f"{cls.__name__}.{name}: a field without a default follows "
                                "one with a default")
        cls._fields = cls._fields + tuple(n for n in names if n not in cls._fields)
        cls._defaults = defaults
        if not frozen:
            cls.__setattr__ = object.__setattr__  # type: ignore[method-assign,assignment]
            cls.__delattr__ = object.__delattr__  # type: ignore[method-assign]
        if eq:
            cls.__eq__ = _eq  # type: ignore[method-assign,assignment]
            cls.__hash__ = _hash if frozen else None  # type: ignore[method-assign,assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        fields = self._fields
        cls = type(self).__name__
        if len(args) > len(fields):
            raise TypeError(f"{cls}() takes {len(fields)} arguments but {len(args)} were given")
        values = dict(zip(fields, args))
        for name, value in kwargs.items():
            if name in values:
                raise TypeError(f"{cls}() got multiple values for argument {name!r}")
            values[name] = value
        own = self.__dict__
        defaults = self._defaults
        for name in fields:
            if name in values:
                own[name] = values.pop(name)
            elif name in defaults:
                value = defaults[name]
                own[name] = value.make() if isinstance(value, _Factory) else value
            else:
                raise TypeError(f"{cls}() missing required argument {name!r}")
        if values:
            raise TypeError(f"{cls}() got an unexpected keyword argument {next(iter(values))!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: {type(self).__name__} is frozen")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: {type(self).__name__} is frozen")

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{type(self).__name__}({inner})"


def _values(obj: Value) -> Tuple[Any, ...]:
    return tuple(getattr(obj, name) for name in obj._fields)


def _eq(self: Value, other: object) -> bool:
    if other.__class__ is not self.__class__:
        return NotImplemented
    return _values(self) == _values(other)


def _hash(self: Value) -> int:
    return hash(_values(self))


def replace(obj: V, **changes: Any) -> V:
    """A copy of ``obj`` with some fields changed (``dataclasses.replace``)."""
    values = {name: getattr(obj, name) for name in obj._fields}
    values.update(changes)
    return type(obj)(**values)


def as_dict(obj: Value) -> Dict[str, Any]:
    """The fields of ``obj`` as a dict, nested value classes as dicts too (``asdict``)."""
    return {name: _plain(getattr(obj, name)) for name in obj._fields}


def _plain(value: Any) -> Any:
    if isinstance(value, Value):
        return as_dict(value)
    if type(value) in (list, tuple):
        return type(value)(_plain(v) for v in value)
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value
