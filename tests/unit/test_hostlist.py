"""Slurm hostlist expressions: slurm.conf(5) grammar both ways, with round-trip properties."""

from __future__ import annotations

import random

import pytest

from slurmiso.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    "expr,hosts",
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu[001-003,010]", ["gpu001", "gpu002", "gpu003", "gpu010"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("rack[1-2]-gpu", ["rack1-gpu", "rack2-gpu"]),
        ("n1,n1", ["n1"]),
        ("gpu[098-101]", ["gpu098", "gpu099", "gpu100", "gpu101"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[5]", ["n5"]),
        # several bracket groups in one name: the cartesian product, leftmost slowest
        ("rack[0-1]_blade[0-1]", ["rack0_blade0", "rack0_blade1", "rack1_blade0", "rack1_blade1"]),
        ("rack[1-2]-gpu[01-03]", ["rack1-gpu01", "rack1-gpu02", "rack1-gpu03",
                                  "rack2-gpu01", "rack2-gpu02", "rack2-gpu03"]),
        ("c[1-2]n[1,3]x", ["c1n1x", "c1n3x", "c2n1x", "c2n3x"]),
    ],
)
def test_expand(expr: str, hosts: list) -> None:
    assert expand(expr) == hosts


def test_expand_rack_gpu_sixteen() -> None:
    hosts = expand("rack[1-2]-gpu[01-16]")
    assert len(hosts) == 32 and hosts[0] == "rack1-gpu01" and hosts[-1] == "rack2-gpu16"


@pytest.mark.parametrize("bad", ["n[1-", "n]1", "n[3-1]", "n[a-b]", "n[[1]]", "n[]", "n[1-2]]"])
def test_expand_rejects(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


def test_expand_refuses_huge_products() -> None:
    with pytest.raises(HostlistError, match="more than"):
        expand("a[0-999]b[0-999]")


@pytest.mark.parametrize(
    "hosts,expr",
    [
        (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
        (["gpu001", "gpu002"], "gpu[001-002]"),
        (["n7"], "n7"),
        (["login", "n1", "n2"], "n[1-2],login"),
        (["n9", "n10"], "n[9-10]"),
    ],
)
def test_compress(hosts: list, expr: str) -> None:
    assert compress(hosts) == expr
    assert sorted(expand(expr)) == sorted(hosts)


@pytest.mark.parametrize(
    "expr",
    ["gpu[098-101]", "rack[1-2]-gpu[01-16]", "rack[0-1]_blade[0-1]", "n[1-3,5]", "gpu[001-016]",
     "c[1-2]n[1,3]x", "n[9,010-011]"],
)
def test_compress_of_expand_is_canonical(expr: str) -> None:
    assert compress(expand(expr)) == expr


def _random_hosts(rng: random.Random) -> list:
    """Names of the shapes clusters use: prefixes, padded and plain numbers, 1-2 fields."""
    hosts = set()
    for _ in range(rng.randint(1, 40)):
        fields = rng.randint(0, 2)
        name = rng.choice(["n", "gpu", "rack", "login", "a-b"])
        for f in range(fields):
            width = rng.choice([0, 2, 3])
            num = rng.randint(0, 120)
            name += f"{num:0{width}d}" + rng.choice(["", "-gpu", "_blade", "x"] if f == 0 else [""])
        hosts.add(name)
    return sorted(hosts)


@pytest.mark.parametrize("seed", range(300))
def test_round_trip_property(seed: int) -> None:
    """expand(compress(h)) is h as a set; compressing again changes nothing."""
    hosts = _random_hosts(random.Random(seed))
    text = compress(hosts)
    assert sorted(expand(text)) == hosts
    assert compress(expand(text)) == text


@pytest.mark.parametrize("seed", range(100))
def test_expand_then_compress_property(seed: int) -> None:
    """An expression built from random ranges expands to the hosts its compression names."""
    rng = random.Random(1000 + seed)
    lo = rng.randint(0, 200)
    hi = lo + rng.randint(0, 30)
    width = rng.choice([0, 3, 4])
    expr = f"r[1-{rng.randint(1, 3)}]-g[{lo:0{width}d}-{hi}]"
    hosts = expand(expr)
    assert set(expand(compress(hosts))) == set(hosts)
    assert len(compress(hosts).split("],")) == 1  # one term, like the input
