"""Sizes and durations as people type them."""

from __future__ import annotations

from typing import Optional

import pytest

from slurmiso.units import parse_duration, parse_size, parse_slurm_time


@pytest.mark.parametrize(
    "text,mib",
    [
        ("20G", 20480),
        ("20g", 20480),
        ("20GiB", 20480),
        ("20GB", 20480),
        ("512M", 512),
        ("512MiB", 512),
        ("4096", 4096),
        ("1.5G", 1536),
        ("1T", 1048576),
        ("2048K", 2),
        ("1K", 1),  # fractions of a MiB round up: a limit is never lowered
        (" 8 G ", 8192),
    ],
)
def test_parse_size(text: str, mib: int) -> None:
    assert parse_size(text) == mib


@pytest.mark.parametrize("text", ["", "G", "20X", "-5G", "20 GigaBytes", "1e3M", "twenty"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("90s", 90),
        ("5m", 300),
        ("2h", 7200),
        ("1d", 86400),
        ("1w", 604800),
        ("1.5h", 5400),
        ("3600", 3600),
        ("0", 0),
        ("1-02:03:04", 93784),
        ("02:03:04", 7384),
        ("05:06", 306),
        ("2-12", 216000),
        ("1-00:30", 88200),
        ("48:00:00", 172800),
    ],
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5x", "1:2:3:4", "-5m", "01:60", "1-00:00:61", "soon"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["9" * 310, "9" * 310 + "G", "1." + "5" * 400 + "T",
                                  "\u0663G", "\uff18G", "9" * 5000],
                         ids=["310-digits", "310-digits-G", "400-decimals", "arabic-digit",
                              "fullwidth-digit", "5000-digits"])
def test_parse_size_bounds_what_users_type(text: str) -> None:
    """310 digits was float('inf') -> OverflowError (a drained node when a prolog parsed it);
    other scripts' digits passed \\d. Both are a clear ValueError now."""
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(text)


@pytest.mark.parametrize("text", ["9" * 310 + "s", "9" * 310, "1-" + "9" * 300],
                         ids=["310-digits-s", "310-digits", "300-digit-hours"])
def test_parse_duration_bounds_what_users_type(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_parse_size_is_exact() -> None:
    assert parse_size("0.1G") == 103 and parse_size("1.5T") == 1536 * 1024
    assert parse_size("0.001M") == 1 and parse_size("999999999999") == 999999999999


@pytest.mark.parametrize(
    "text,seconds",
    [
        ("30", 30 * 60),  # a bare number is minutes in Slurm
        ("05:06", 306),  # MM:SS
        ("02:03:04", 7384),  # HH:MM:SS
        ("48:00:00", 172800),
        ("1-12", 129600),  # D-HH: 1.5 days (the old sacctmgr parser read 86412)
        ("1-12:30", 131400),  # D-HH:MM
        ("1-12:30:05", 131405),  # D-HH:MM:SS
        ("7-00:00:00", 604800),
        (" 00:00:30 ", 30),
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("Partition_Limit", None),  # sacct: the partition's limit applies
        ("INVALID", None),
        ("N/A", None),
        ("", None),
    ],
)
def test_parse_slurm_time_every_form_slurm_prints(text: str, seconds: Optional[int]) -> None:
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["soon", "1:2:3:4", "01:60", "1-00:00:61", "-5", "1-" + "9" * 80])
def test_parse_slurm_time_rejects_what_slurm_never_prints(text: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        parse_slurm_time(text)
