"""The MPS stand-in's protocol 3 (issue 35, item 7), as NVIDIA's MPS guide documents it:
servers, namespaces, their limits, the routing of a client and what it is granted."""

from __future__ import annotations

import sys
from typing import Dict, List

import pytest

from slurmiso.isolation.mps_sim_v3 import Namespace, V3Controller, apply_config, grant

ROOT, ALICE, BOB = 0, 1001, 1002
needs_tomllib = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="the stand-in reads TOML with Python 3.11's tomllib")


def run(c: V3Controller, line: str, uid: int = ROOT) -> str:
    rc, out = c.command(line.split(), caller_uid=uid)
    assert rc == 0, out
    return out


def refused(c: V3Controller, line: str, uid: int = ROOT) -> str:
    rc, out = c.command(line.split(), caller_uid=uid)
    assert rc == 1 and out.startswith("error: ") and out.count("\n") == 1
    return out


def shared(multiuser: bool = True) -> V3Controller:
    """One root server per GPU with a namespace per class, as slurmiso would lay it out."""
    c = V3Controller(devices=1, multiuser=multiuser)
    run(c, "server create shared --uid=0")
    for ns in ("infer", "train"):
        run(c, f"namespace create {ns} --server=shared")
    run(c, "namespace set infer --server=shared --pinned-memory-limit=40G "
           "--active-thread-percentage=100 --client-priority=0")
    run(c, "namespace set train --server=shared --pinned-memory-limit=24G "
           "--active-thread-percentage=60 --client-priority=1")
    return c


def test_servers_and_namespaces_list_in_nvidias_columns() -> None:
    c = shared()
    assert run(c, "server list --format=csv,noheader") == "shared,0,-,Ready,-,-,-\n"
    lines = run(c, "namespace list --server=shared --format=csv").splitlines()
    assert lines[0] == ("name,server,server-status,pinned-memory-limit,"
                        "active-thread-percentage,client-priority,pipe-directory")
    assert lines[1:] == ["default,shared,Ready,-,-,-,-", "infer,shared,Ready,40960M,100,0,-",
                         "train,shared,Ready,24576M,60,1,-"]
    assert run(c, "namespace get train shared client-priority") == "1\n"
    run(c, "server set shared --active-thread-percentage=90")  # the default namespace
    assert run(c, "namespace get default shared active-thread-percentage") == "90\n"


@pytest.mark.parametrize("line,uid,words", [
    ("server create Shared --uid=0", ROOT, "lower-case"),
    ("server create " + "x" * 65 + " --uid=0", ROOT, "at most 64"),
    ("server create shared --uid=0", ROOT, "exists"),
    ("server create mine --uid=1001", ROOT, "multiuser"),
    ("namespace set train --server=shared --client-priority=2", ROOT, "0 (normal)"),
    ("namespace set train --server=shared --active-thread-percentage=0", ROOT, "1-100"),
    ("namespace set train --server=shared --pinned-memory-limit=lots", ROOT, "4G"),
    ("namespace set train --server=shared", ROOT, "at least one option"),
    ("namespace set train --server=shared --client-priority=0", ALICE, "belongs to uid 0"),
    ("namespace create x --server=nope", ROOT, "no server"),
    ("namespace delete default --server=shared", ROOT, "no namespace"),
    ("server frobnicate x", ROOT, "unknown command"),
])
def test_what_the_control_binary_refuses(line: str, uid: int, words: str) -> None:
    assert words in refused(shared(), line, uid)


def test_different_users_share_one_root_server_in_multiuser_mode() -> None:
    c = shared()
    infer = c.connect(ALICE, 501, ("shared", "infer"), {})
    train = c.connect(BOB, 502, ("shared", "train"), {})
    assert (infer["client_priority"], train["client_priority"]) == (0, 1)
    assert (infer["active_thread_percentage"], train["active_thread_percentage"]) == (100, 60)
    assert train["pinned_device_mem_limit_mb"] == {"0": 24576}
    assert run(c, "client list --format=csv,noheader") == ("501,shared,0,infer,-\n"
                                                           "502,shared,0,train,-\n")
    assert "active clients" in refused(c, "namespace delete train --server=shared")
    run(c, "namespace delete train --server=shared --force")


def test_without_multiuser_a_server_takes_only_its_own_users_clients() -> None:
    c = V3Controller(devices=1)
    run(c, "server create alice --uid=1001")
    assert c.connect(BOB, 9, ("alice", "default"), {})["mps"] is False
    assert c.connect(ALICE, 9, ("alice", "default"), {})["mps"] is True
    top = c.connect(BOB, 10, ("", ""), {})  # the top-level socket: routed by uid
    assert (top["server"], top["namespace"]) == ("uid_1002", "default")


def test_a_clients_own_variables_against_its_namespace() -> None:
    ns = Namespace("train", memory_limit_mb=24576, thread_percentage=60.0, priority=1)
    env: Dict[str, str] = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
                           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=8G,1=64G"}
    got = grant(ns, env, devices=2)
    assert got["active_thread_percentage"] == 60.0  # the namespace's overrides the client's
    assert got["pinned_device_mem_limit_mb"] == {"0": 8192, "1": 24576}  # the lower wins
    assert (got["client_priority"], got["priority_from"]) == (1, "namespace")
    # NVIDIA documents that a client's own priority wins: a training job can raise itself,
    # which is why slurmiso must watch priorities rather than trust the namespace
    own = grant(ns, {"CUDA_MPS_CLIENT_PRIORITY": "0"})
    assert (own["client_priority"], own["priority_from"]) == (0, "client")
    junk: List[str] = ["2", "-1", "normal", ""]
    for value in junk:
        assert grant(ns, {"CUDA_MPS_CLIENT_PRIORITY": value})["client_priority"] == 1


# ------------------------------------------------------------------ the configuration file
CONFIG = """
schema_version = "1.0"

[servers.shared]
uid = 0
active_thread_percentage = "100"

[servers.shared.namespaces.infer]
pinned_memory_limit = "40G"
client_priority = "0"

[servers.shared.namespaces.train]
pinned_memory_limit = "24G"
active_thread_percentage = "60"
client_priority = "1"
"""


@needs_tomllib
def test_a_configuration_file_makes_servers_and_namespaces() -> None:
    c = V3Controller(devices=1, multiuser=True)
    apply_config(c, CONFIG)
    lines = run(c, "namespace list --server=shared --format=csv,noheader").splitlines()
    assert lines == ["default,shared,Ready,-,100,-,-", "infer,shared,Ready,40960M,-,0,-",
                     "train,shared,Ready,24576M,60,1,-"]


@needs_tomllib
@pytest.mark.parametrize("text,words", [
    (CONFIG.replace('"1.0"', '"2.0"'), "schema_version"),
    (CONFIG + "\n[extra]\nx = 1\n", "unknown top-level"),
    (CONFIG.replace("uid = 0", "uid = 0\ncolour = 1"), "servers.shared: unknown key"),
    (CONFIG.replace('client_priority = "1"', 'client_priority = "2"'),
     "servers.shared.namespaces.train: error: --client-priority=2"),
    (CONFIG.replace("[servers.shared.namespaces.train]",
                    "[servers.shared.namespaces.train]\nuid = 5"), "holds only"),
    (CONFIG.replace("[servers.shared]", "[servers.Shared]")
     .replace("servers.shared.", "servers.Shared."), "lower-case"),
    ("schema_version = ", "not TOML"),
])
def test_a_configuration_error_is_named_and_applies_nothing(text: str, words: str) -> None:
    c = V3Controller(devices=1, multiuser=True)
    with pytest.raises(ValueError) as err:
        apply_config(c, text)
    assert words in str(err.value) and c.servers == {}
