"""slurmiso.values.Value: the dataclass contract the config model and GPU records rely on."""

from __future__ import annotations

import copy
import pickle
from typing import Any, Dict, List, Optional, Tuple

import pytest

from slurmiso.config.model import Config, MonitorSettings, Paths, Pool
from slurmiso.gpu.backend import MigInstance, Telemetry
from slurmiso.values import Value, as_dict, field, replace


class Point(Value, eq=True):
    x: int
    y: int = 0
    tags: Tuple[str, ...] = ()


class Box(Value):
    corner: Point
    notes: Dict[str, int] = field(default_factory=dict)


class Counter(Value, frozen=False, eq=True):
    hits: int = 0
    seen: List[str] = field(default_factory=list)


def test_positional_keyword_and_default_construction() -> None:
    assert (Point(1).x, Point(1).y, Point(1).tags) == (1, 0, ())
    p = Point(1, tags=("a",), y=2)
    assert (p.x, p.y, p.tags) == (1, 2, ("a",))
    assert repr(p) == "Point(x=1, y=2, tags=('a',))"


@pytest.mark.parametrize("args,kwargs,message", [
    ((), {}, "missing required argument 'x'"),
    ((1, 2, (), 4), {}, "takes 3 arguments but 4 were given"),
    ((1,), {"x": 2}, "multiple values for argument 'x'"),
    ((1,), {"z": 2}, "unexpected keyword argument 'z'"),
])
def test_bad_construction_is_a_type_error(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                                          message: str) -> None:
    with pytest.raises(TypeError, match=message):
        Point(*args, **kwargs)


def test_frozen_fields_cannot_change() -> None:
    p = Point(1)
    with pytest.raises(AttributeError, match="Point is frozen"):
        p.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError, match="frozen"):
        del p.y  # type: ignore[misc]
    assert p.x == 1


def test_eq_and_hash_by_value_only_when_asked() -> None:
    assert Point(1, 2) == Point(1, 2) and Point(1, 2) != Point(2, 1)
    assert len({Point(1, 2), Point(1, 2), Point(3)}) == 2
    assert Point(1) != (1, 0, ())  # another type is never equal
    a, b = Box(Point(1)), Box(Point(1))
    assert a != b and a == a  # eq=False: identity, as @dataclass(eq=False)
    assert Counter(1) == Counter(1)
    with pytest.raises(TypeError):  # mutable and eq: unhashable, as a dataclass
        hash(Counter(1))


def test_factories_give_each_instance_its_own_value() -> None:
    a, b = Box(Point(1)), Box(Point(1))
    a.notes["n"] = 1
    assert b.notes == {} and Telemetry(0).extra is not Telemetry(0).extra


def test_a_mutable_class_can_change() -> None:
    c = Counter()
    c.hits += 1
    c.seen.append("x")
    assert (c.hits, c.seen, Counter().seen) == (1, ["x"], [])


def test_field_order_is_checked_when_the_class_is_defined() -> None:
    with pytest.raises(TypeError, match="without a default follows"):
        class Bad(Value):  # noqa: F841 - defining it is the test
            a: int = 0
            b: int


def test_replace_and_as_dict() -> None:
    p = Point(1, 2, ("t",))
    q = replace(p, y=5)
    assert (q.x, q.y, q.tags, p.y) == (1, 5, ("t",), 2) and type(q) is Point
    box = Box(Point(1), {"k": 2})
    assert as_dict(box) == {"corner": {"x": 1, "y": 0, "tags": ()}, "notes": {"k": 2}}
    assert as_dict(box)["notes"] is not box.notes  # a copy, as dataclasses.asdict
    inst = MigInstance(0, 1, "1g.10gb", 6, 1, ci_id=None, uuid="MIG-x")
    assert inst.to_dict() == {
        "gpu_index": 0, "gi_id": 1, "profile": "1g.10gb", "placement_start": 6,
        "placement_size": 1, "ci_id": None, "uuid": "MIG-x", "memory_total_mb": 0,
        "memory_used_mb": 0}


def test_values_copy_and_pickle() -> None:
    p = Point(1, 2)
    assert pickle.loads(pickle.dumps(p)) == p and copy.deepcopy(p) == p
    paths = Paths(state_dir="/run/x")
    assert pickle.loads(pickle.dumps(paths)).state_dir == "/run/x"


def test_config_model_defaults_are_the_documented_ones() -> None:
    """Class-level defaults stay readable (the loader reads ``Paths.state_dir``), and the
    nested monitor defaults are instances of their classes."""
    assert Paths.state_dir == "/run/slurmiso" and Paths().journal_for("n1").endswith("n1.jsonl")
    mon = MonitorSettings()
    assert (mon.thresholds.memory_used_pct, mon.stagger.max_starts, mon.limits.relayouts_per_hour,
            mon.relayout.drain, mon.slo) == (75, 4, 2, "wait", ())
    pool = Pool("p", "n1", ("n1",), "", "p", "H100-80GB", 8, "mps")
    assert (pool.mps_shares_per_gpu, pool.shards_per_gpu, pool.mig_layout) == (100, 7, "")
    assert Config._fields[-1] == "warnings" and Config._defaults["warnings"] == ()


def test_optional_fields_keep_none() -> None:
    t: Telemetry = Telemetry(3)
    sm: Optional[float] = t.sm_active
    assert sm is None and t.gr_engine_active is None  # not measured is None, never 0.0
