"""The release table: which side of each measured difference a version is on."""

from __future__ import annotations

import pytest

from slurmiso.slurm import slurmconf, versions


@pytest.mark.parametrize("version,qos_in_env,alloc_tres", [
    ((22, 5, 8), False, False),
    ((24, 11, 5), False, True),
    ((26, 5, 5), True, True),
])
def test_measured_releases(version, qos_in_env, alloc_tres) -> None:
    assert versions.has("prolog_env_qos", version) is qos_in_env
    assert versions.has("show_job_alloc_tres", version) is alloc_tres
    assert versions.needs_workaround("prolog_env_qos", version) is not qos_in_env


def test_unknown_version_keeps_every_workaround() -> None:
    for d in versions.DIFFERENCES:
        assert versions.has(d.key, None) is None
        assert versions.needs_workaround(d.key, None)
    assert versions.describe(None) == ["Slurm version unknown: every workaround stays on"]


def test_disable_gpu_acct_boundary_is_the_one_slurmconf_uses() -> None:
    assert slurmconf.DISABLE_GPU_ACCT_SINCE == (23, 2, 7)
    assert not slurmconf.has_disable_gpu_acct((23, 2, 6))
    assert slurmconf.has_disable_gpu_acct((23, 2, 7))
    assert not slurmconf.has_disable_gpu_acct(None)


def test_data_parser_per_measured_release() -> None:
    assert versions.data_parser((22, 5, 8)) == "v0.0.38"
    assert versions.data_parser((24, 11, 5)) == "v0.0.42"
    assert versions.data_parser((26, 5, 5)) == "v0.0.45"
    assert versions.data_parser((25, 5, 1)) is None  # not measured: said so, not guessed
    assert "not measured" in versions.describe((25, 5, 1))[-1]


def test_version_from_hook_env_wins_over_commands() -> None:
    assert versions.from_env({"SLURM_VERSION": "24.11.5"}) == (24, 11, 5)
    assert versions.from_env({}) is None
    assert versions.current({"SLURM_VERSION": "26.05.5"}) == (26, 5, 5)


def test_every_difference_says_both_sides_and_the_workaround() -> None:
    keys = [d.key for d in versions.DIFFERENCES]
    assert len(keys) == len(set(keys))
    for d in versions.DIFFERENCES:
        assert d.before and d.after and d.workaround and len(d.since) == 3


def test_show_config_reads_indexed_hook_keys_of_24_11_and_later() -> None:
    """24.11.5/26.05.5 print ``Prolog[0] = ...``; 22.05.8 prints ``Prolog = ...``."""
    from slurmiso.slurm.client import parse_show_config

    new = parse_show_config("Epilog[0]               = /sbx/bin/slurmiso-epilog\n"
                            "Prolog[0]               = /sbx/bin/slurmiso-prolog\n"
                            "Prolog[1]               = /etc/slurm/site-prolog\n"
                            "PrologFlags             = Alloc,Contain\n"
                            "TaskEpilog              = (null)\n")
    assert new["Prolog"] == "/sbx/bin/slurmiso-prolog"
    assert new["Epilog"] == "/sbx/bin/slurmiso-epilog" and new["Prolog[1]"]
    assert new["TaskEpilog"] == "(null)" and new["PrologFlags"] == "Alloc,Contain"
    old = parse_show_config("Prolog                  = /sbx/bin/slurmiso-prolog\n")
    assert old == {"Prolog": "/sbx/bin/slurmiso-prolog"}
