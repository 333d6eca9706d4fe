"""The MPS stand-in's rules, without a daemon: what a client gets and what commands change."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

import pytest

from slurmiso.isolation.mps_sim_control import Controller, parse_client_mem, parse_mem

UID = 1000


def connect(ctl: Controller, uid: int = UID, pid: int = 1, thread: Optional[str] = None,
            mem: Optional[str] = None) -> Dict[str, Any]:
    words = [f"thread={thread}"] * (thread is not None) + [f"mem={mem}"] * (mem is not None)
    answer: Dict[str, Any] = json.loads(ctl.connect_client(uid, pid, words))
    return answer


def limited(thread: int = 60, mem_mb: int = 30720) -> Controller:
    ctl = Controller()
    ctl.command(f"set_default_active_thread_percentage {thread}")
    ctl.command(f"set_default_device_pinned_mem_limit 0 {mem_mb}M")
    return ctl


@pytest.mark.parametrize("thread, mem, want_thread, want_mem", [
    (None, None, 60.0, 30720),  # unset: the server's limits
    ("100", "0=80G", 60.0, 30720),  # raised: still the server's
    ("20", "0=1G", 20.0, 1024),  # lowered: narrows
    ("0", "0=0M", 60.0, 0),  # 0 % is not a percentage; 0 MiB narrows to nothing
    ("x", "0=lots,zz", 60.0, 30720),  # garbage narrows nothing
    ("30", "1=1G", 30.0, 30720),  # device 1 does not exist for a one-GPU daemon
])
def test_client_gets_min_of_server_and_its_variables(
    thread: Optional[str], mem: Optional[str], want_thread: float, want_mem: int
) -> None:
    got = connect(limited(), thread=thread, mem=mem)
    assert (got["active_thread_percentage"], got["pinned_device_mem_limit_mb"]) == (
        want_thread, {"0": want_mem})


def test_unlimited_daemon_allows_everything_the_client_asks() -> None:
    """Why slurmiso must set the daemon's defaults: NVIDIA's default is 100 % and no cap."""
    got = connect(Controller(), thread="100", mem=None)
    assert (got["active_thread_percentage"], got["pinned_device_mem_limit_mb"]) == (100.0, {})


def test_defaults_bind_only_servers_started_afterwards() -> None:
    ctl = Controller()
    first = connect(ctl)
    ctl.command("set_default_active_thread_percentage 25")
    again = connect(ctl, pid=2)
    assert first["server_pid"] == again["server_pid"]
    assert again["active_thread_percentage"] == 100.0
    ctl.command(f"set_active_thread_percentage {first['server_pid']} 40")  # per-server
    assert connect(ctl, pid=3)["active_thread_percentage"] == 40.0
    assert ctl.command(f"get_active_thread_percentage {first['server_pid']}") == "40.0\n"


def test_one_server_per_uid_and_a_busy_server_queues_another_user() -> None:
    ctl = limited()
    mine = connect(ctl, pid=os.getpid())  # a live client keeps the server busy
    theirs = connect(ctl, uid=UID + 1, pid=2)
    assert mine["uid"] == UID and theirs == {"mps": True, "queued_behind_uid": UID}


@pytest.mark.parametrize("command", [
    "set_default_active_thread_percentage 101", "set_default_active_thread_percentage -5",
    "set_default_device_pinned_mem_limit 1 2G", "set_default_device_pinned_mem_limit 0 2T",
    "set_active_thread_percentage 99 50", "start_server -uid x", "bogus",
])
def test_invalid_commands_change_nothing(command: str) -> None:
    ctl = limited()
    assert ctl.command(command).startswith("error: invalid command")
    assert ctl.command("get_default_active_thread_percentage") == "60.0\n"
    assert ctl.command("get_default_device_pinned_mem_limit 0") == "30720M\n"


def test_memory_values() -> None:
    assert [parse_mem(v) for v in ("512M", "30G", "1024MB", "2gb", "1.5G", "", "7")] == [
        512, 30720, 1024, 2048, None, None, None]
    assert parse_client_mem("0=1G, 1=512M,x=3G,2,3=") == {0: 1024, 1: 512}


def test_static_partitions_are_carved_from_free_chunks_and_bind_their_clients() -> None:
    """-S as NVIDIA documents it: ``sm_partition add`` prints the full ID a client names in
    CUDA_MPS_SM_PARTITION; SMs are never oversubscribed; a client with no partition is
    refused (the refusal is third-party knowledge, not NVIDIA's text)."""
    from slurmiso.isolation.mps_sim_partitions import SmPartitions

    uuid = "GPU-0123abcd-0000-1111-2222-333344445555"
    ctl = Controller(partitions=SmPartitions(uuid, 132))
    first = ctl.command(f"sm_partition add {uuid[:12]} 10").strip()
    assert first.startswith(f"{uuid}/")
    assert ctl.command(f"sm_partition add {uuid} 7").startswith("error: not enough free chunks")
    second = ctl.command(f"sm_partition add {uuid} 6").strip()
    got = json.loads(ctl.connect_client(os.getuid(), os.getpid(), [f"part={second}"]))
    assert (got["sm_count"], got["sm_partition"]) == (48, second)
    assert got["active_thread_percentage"] == round(100 * 48 / 132, 1)
    refused = json.loads(ctl.connect_client(os.getuid(), os.getpid(), []))
    assert refused["mps"] is False and "names no CUDA_MPS_SM_PARTITION" in refused["error"]
    bad = json.loads(ctl.connect_client(os.getuid(), os.getpid(), [f"part={uuid}/nope"]))
    assert bad["mps"] is False and "no partition" in bad["error"]
    assert ctl.command(f"sm_partition rm {uuid} {first.split('/')[1]}") == ""
    assert "free 10 80" in ctl.command("lspart")
