"""Slurm hostlist expressions."""

from __future__ import annotations

import pytest

from slurmiso.slurm.hostlist import HostlistError, compress, expand


@pytest.mark.parametrize(
    "expr,hosts",
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu[001-003,010]", ["gpu001", "gpu002", "gpu003", "gpu010"]),
        ("a,b[1-2],c", ["a", "b1", "b2", "c"]),
        ("rack[1-2]-gpu", ["rack1-gpu", "rack2-gpu"]),
        ("n1,n1", ["n1"]),
    ],
)
def test_expand(expr: str, hosts: list) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize("bad", ["n[1-", "n]1", "n[3-1]", "n[a-b]", "n[[1]]"])
def test_expand_rejects(bad: str) -> None:
    with pytest.raises(HostlistError):
        expand(bad)


@pytest.mark.parametrize(
    "hosts,expr",
    [
        (["n1", "n2", "n3", "n5"], "n[1-3,5]"),
        (["gpu001", "gpu002"], "gpu[001-002]"),
        (["n7"], "n7"),
        (["login", "n1", "n2"], "n[1-2],login"),
    ],
)
def test_compress_round_trip(hosts: list, expr: str) -> None:
    assert compress(hosts) == expr
    assert sorted(expand(expr)) == sorted(hosts)
