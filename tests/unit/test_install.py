"""What a new admin meets installing slurmiso: issue 17's defects, one test each.

Every test here failed on the code before the fix it names.
"""

from __future__ import annotations

import configparser
import os
import re
import subprocess
import sys
from typing import Any, Dict

import pytest
import yaml

from slurmiso.cli import manpage
from slurmiso.cli.main import build_parser, main
from slurmiso.config.loader import parse_config
from slurmiso.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(REPO, "etc", "slurmiso.yaml")
ENV = dict(os.environ, PYTHONPATH=REPO)


def example_data() -> Dict[str, Any]:
    with open(EXAMPLE) as fh:
        return yaml.safe_load(fh)


def read(*parts: str) -> str:
    with open(os.path.join(*parts), encoding="utf-8") as fh:
        return fh.read()


def run_py(args: list, cwd: str = REPO, env: Any = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env or ENV,
                          capture_output=True, text=True, timeout=60)


def slurm_free_env() -> Dict[str, str]:
    return {k: v for k, v in ENV.items() if not k.startswith(("SLURM_", "SLURMISO_"))}


# ----------------------------------------------------------------- README, paths, hints
def test_readme_install_section_shows_packages_first_and_no_bare_pypi_install() -> None:
    text = read(REPO, "README.md")
    assert not re.search(r"^\s*pip install slurmiso\b", text, re.M), "not on PyPI"
    section = text.split("## Installing on a cluster", 1)[1]
    assert section.index("apt install") < section.index("pip install")


def test_scripts_dir_is_the_running_installations(tmp_path: Any) -> None:
    from slurmiso.install import scripts_dir

    bindir = tmp_path / "venv" / "bin"
    bindir.mkdir(parents=True)
    for name in ("slurmiso", "slurmiso-prolog"):
        (bindir / name).write_text("#!/bin/sh\n")
        (bindir / name).chmod(0o755)
    assert scripts_dir(str(bindir / "slurmiso")) == str(bindir)


def test_gen_slurm_conf_names_this_installation_not_usr_local(monkeypatch: Any,
                                                              capsys: Any) -> None:
    import slurmiso.install

    monkeypatch.setattr(slurmiso.install, "scripts_dir", lambda argv0=None: "/opt/venv/bin")
    assert main(["gen", "slurm-conf", "-c", EXAMPLE, "--slurm-version", "22.05.8"]) == 0
    out = capsys.readouterr().out
    assert "Prolog=/opt/venv/bin/slurmiso-prolog" in out.splitlines()
    assert "/usr/local/bin" not in out


def test_shipped_units_and_cron_do_not_assume_usr_local() -> None:
    for rel in ("systemd/slurmiso-monitor.service", "systemd/slurmiso-agent.service",
                "cron.d/slurmiso-audit"):
        assert "/usr/local/bin" not in read(REPO, "etc", rel), rel


def test_gen_systemd_and_cron_point_at_bindir(tmp_path: Any, capsys: Any) -> None:
    assert main(["gen", "systemd", "--dir", str(tmp_path), "--bindir", "/opt/v/bin"]) == 0
    unit = (tmp_path / "slurmiso-monitor.service").read_text()
    assert "ExecStart=/opt/v/bin/slurmiso monitor" in unit
    assert "ExecStart=/opt/v/bin/slurmiso agent" in (tmp_path / "slurmiso-agent.service").read_text()
    assert main(["gen", "cron", "--bindir", "/opt/v/bin"]) == 0
    assert "PATH=/opt/v/bin:/usr/bin:/bin" in capsys.readouterr().out


def test_gen_config_writes_the_annotated_example_and_keeps_an_existing_file(
        tmp_path: Any, capsys: Any) -> None:
    target = tmp_path / "slurmiso.yaml"
    assert main(["gen", "config", "-o", str(target)]) == 0
    assert target.read_text() == read(EXAMPLE)
    target.write_text("site: edits\n")
    assert main(["gen", "config", "-o", str(target)]) == 2
    assert target.read_text() == "site: edits\n"
    assert "--force" in capsys.readouterr().err
    assert main(["gen", "config", "-o", str(target), "--force"]) == 0


def test_missing_config_hint_names_a_command_that_works_after_install(tmp_path: Any) -> None:
    from slurmiso.config import load_config

    missing = str(tmp_path / "slurmiso.yaml")
    with pytest.raises(ConfigError) as err:
        load_config(missing)
    assert f"slurmiso gen config -o {missing}" in str(err.value)
    assert "etc/slurmiso.yaml" not in str(err.value)


def test_unit_documentation_pages_exist() -> None:
    """systemd-analyze verify fails on a man: page that is not installed."""
    pages = manpage.all_pages()
    for unit in ("slurmiso-monitor.service", "slurmiso-agent.service"):
        text = read(REPO, "etc", "systemd", unit)
        refs = re.findall(r"man:([\w.-]+)\((\d)\)", text)
        assert refs, unit
        for name, section in refs:
            assert f"{name}.{section}" in pages, (unit, name)


# ---------------------------------------------------------------------- Slurm and hostlists
def test_slurm_commands_on_path_are_found(tmp_path: Any) -> None:
    from slurmiso.slurm.client import find_command

    bindir = tmp_path / "cm" / "slurm" / "bin"
    bindir.mkdir(parents=True)
    tool = bindir / "scontrol-not-elsewhere"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    env = {"PATH": f"relative/dir::{bindir}:/usr/bin"}
    assert find_command("scontrol-not-elsewhere", env) == str(tool)


def test_relative_path_entries_are_ignored(tmp_path: Any, monkeypatch: Any) -> None:
    from slurmiso.errors import SlurmUnavailable
    from slurmiso.slurm.client import find_command

    (tmp_path / "fake-scontrol").write_text("#!/bin/sh\n")
    (tmp_path / "fake-scontrol").chmod(0o755)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SlurmUnavailable):
        find_command("fake-scontrol", {"PATH": ".:"})


@pytest.mark.parametrize("nodes", ["rack[1-2]-gpu[01-16]", "rack[0-1]_blade[0-1]"])
def test_check_config_accepts_slurm_conf_hostlists(nodes: str) -> None:
    data = example_data()
    data["pools"][0]["nodes"] = nodes
    cfg = parse_config(data, "x")
    assert cfg.pool_for_node("rack1-gpu16" if "gpu" in nodes else "rack1_blade0") is not None


@pytest.mark.parametrize("version,present", [("22.05.8", False), ("23.02.6", False),
                                             ("23.02.7", True), ("24.11.5", True)])
def test_gen_slurm_conf_disable_gpu_acct_only_where_slurm_has_it(
        version: str, present: bool, capsys: Any) -> None:
    assert main(["gen", "slurm-conf", "-c", EXAMPLE, "--slurm-version", version]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ("JobAcctGatherParams=DisableGPUAcct" in lines) is present
    assert ("#JobAcctGatherParams=DisableGPUAcct" in lines) is not present


def test_gen_slurm_conf_asks_slurm_for_its_version(monkeypatch: Any, capsys: Any) -> None:
    from slurmiso.slurm import client

    monkeypatch.setattr(client.SlurmCli, "version", lambda self: (22, 5, 8))
    assert main(["gen", "slurm-conf", "-c", EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "JobAcctGatherParams=DisableGPUAcct" not in out.splitlines()
    assert "Slurm version: 22.5.8" in out


def test_parse_slurm_version() -> None:
    from slurmiso.slurm.client import parse_version

    assert parse_version("slurm 22.05.8") == (22, 5, 8)
    assert parse_version("slurm-wlm 24.11.5") == (24, 11, 5)
    assert parse_version("no version here") is None


# ----------------------------------------------------------------------------- doctor
def _doctor_snapshot(hook_path: str) -> Dict[str, Any]:
    from slurmiso.doctor.collect import hook_files

    return {"gpu_node": {"node": "gpu001"},
            "hooks": {"Prolog": hook_files(hook_path), "Epilog": {"path": ""},
                      "TaskProlog": {"path": ""}}}


def test_doctor_reads_a_prolog_glob(tmp_path: Any) -> None:
    from slurmiso.doctor.nodes import check_hook_files

    cfg = parse_config(example_data(), "x")
    d = tmp_path / "prolog.d"
    d.mkdir()
    hook = d / "50-slurmiso-prolog"
    hook.write_text("#!/bin/sh\n")
    hook.chmod(0o755)
    codes = {f.code for f in check_hook_files(_doctor_snapshot(f"{d}/*"), cfg)}
    assert codes == set()
    os.rename(hook, d / "10-site")
    codes = {f.code for f in check_hook_files(_doctor_snapshot(f"{d}/*"), cfg)}
    assert codes == {"hook-not-slurmiso"}
    os.remove(d / "10-site")
    codes = {f.code for f in check_hook_files(_doctor_snapshot(f"{d}/*"), cfg)}
    assert codes == {"hook-missing"}


def test_doctor_findings_cite_no_unshipped_test_file() -> None:
    from slurmiso.doctor import cluster, nodes

    for mod in (cluster, nodes):
        text = read(mod.__file__)
        assert "tests/" not in text and "test_" not in text, mod.__name__


def test_doctor_does_not_demand_disable_gpu_acct_from_22_05() -> None:
    from slurmiso.doctor.cluster import check_gpu_acct

    cfg = parse_config(example_data(), "x")
    snap = {"slurm_version": "22.05.8", "config": {"JobAcctGatherParams": "(null)"}}
    assert {f.severity for f in check_gpu_acct(snap, cfg)} == {"info"}
    snap["slurm_version"] = "24.11.5"
    assert {f.severity for f in check_gpu_acct(snap, cfg)} == {"error"}


# ------------------------------------------------------------------------------ hooks
def test_epilog_help_describes_the_epilog() -> None:
    out = run_py(["-m", "slurmiso.hooks.epilog", "--help"])
    assert out.returncode == 0
    assert out.stdout.startswith("usage: slurmiso-epilog")
    assert "undoes exactly what the prolog recorded" in out.stdout
    assert "gives it its GPU share" not in out.stdout


@pytest.mark.parametrize("module", ["slurmiso.hooks.prolog", "slurmiso.hooks.epilog"])
def test_hooks_without_a_job_fail_with_one_line(module: str) -> None:
    out = run_py(["-m", module], env=slurm_free_env())
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "SLURM_JOB_ID is not set" in lines[0]


def test_hook_subcommand_without_a_job_fails_too() -> None:
    out = run_py(["-m", "slurmiso", "epilog"], env=slurm_free_env())
    assert out.returncode == 2 and "SLURM_JOB_ID is not set" in out.stderr


# -------------------------------------------------------------------------------- CLI
def test_bare_slurmiso_prints_help_and_exits_0(capsys: Any) -> None:
    assert main([]) == 0
    assert "usage: slurmiso" in capsys.readouterr().out


def test_config_option_after_the_subcommand(capsys: Any) -> None:
    assert main(["gen", "slurm-conf", "-c", EXAMPLE, "--slurm-version", "22.05.8"]) == 0
    assert f"from {EXAMPLE}" in capsys.readouterr().out
    assert main(["check-config", "--config", EXAMPLE]) == 0
    # the top-level form still works, and a sub-level absence does not hide it
    assert main(["-c", EXAMPLE, "check-config"]) == 0


def test_write_permission_error_is_not_a_usage_error(monkeypatch: Any, capsys: Any,
                                                     tmp_path: Any) -> None:
    from slurmiso.cli import output

    def denied(*a: Any, **k: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(output, "open", denied, raising=False)
    rc = main(["gen", "cron", "-o", str(tmp_path / "slurmiso-audit")])
    err = capsys.readouterr().err
    assert rc == 1, "exit 2 means usage; the command line was right"
    assert "Permission denied" in err and "run as root" in err and "usage:" not in err


def test_run_outside_slurm_leaves_no_checkpoint_dir(tmp_path: Any) -> None:
    out = run_py(["-m", "slurmiso", "run", "--", "true"], cwd=str(tmp_path),
                 env=slurm_free_env())
    assert out.returncode == 0, out.stderr
    assert os.listdir(tmp_path) == []


def test_run_outside_slurm_keeps_a_checkpoint_that_was_written(tmp_path: Any) -> None:
    prog = "import os; d=os.environ['SLURMISO_CKPT_DIR']; open(os.path.join(d,'ck.pt'),'w')"
    out = run_py(["-m", "slurmiso", "run", "--", sys.executable, "-c", prog],
                 cwd=str(tmp_path), env=slurm_free_env())
    assert out.returncode == 0, out.stderr
    assert os.path.exists(tmp_path / "slurmiso-ckpt" / "local" / "ck.pt")


def test_signal_advice_matches_docs_and_cli_filter() -> None:
    parser = dict(manpage.commands())["run"]
    text = parser.format_help()
    assert "B:" not in text.replace("no 'B:'", "").replace("(no 'B:'", "")
    assert "srun slurmiso run --" in text and "--signal=USR1@300" in text
    docs = read(REPO, "docs", "checkpoint.md")
    assert "srun slurmiso run --" in docs and "--signal=USR1@300" in docs


def test_check_config_reports_structural_and_cross_field_problems_at_once() -> None:
    data = example_data()
    data["classes"][0]["no_such_key"] = 1                 # structural
    data["classes"][0]["qos"]["preempt"] = ["nonesuch"]   # cross-field
    with pytest.raises(ConfigError) as err:
        parse_config(data, "x")
    text = "\n".join(err.value.problems)
    assert "classes[0].no_such_key" in text and "'nonesuch' is not a class" in text


def test_example_config_starts_the_monitor_in_dry_run() -> None:
    cfg = parse_config(example_data(), "x")
    assert cfg.monitor.dry_run is True
    unit = read(REPO, "etc", "systemd", "slurmiso-monitor.service")
    assert "'monitor.dry_run: true'" in unit


# ------------------------------------------------------------------ packaging metadata
def test_setup_cfg_dependencies_and_scripts() -> None:
    from slurmiso.install import SCRIPTS

    cp = configparser.ConfigParser()
    cp.read(os.path.join(REPO, "setup.cfg"))
    requires = cp["options"]["install_requires"]
    assert "prometheus-client" in requires, "agent and monitor --metrics-port import it"
    assert "pyslurm" not in cp["options.extras_require"]
    assert cp["metadata"]["license_files"].strip() == "LICENSE"
    scripts = {ln.split("=")[0].strip() for ln in
               cp["options.entry_points"]["console_scripts"].strip().splitlines()}
    assert set(SCRIPTS) <= scripts


def test_license_is_apache_2() -> None:
    text = read(REPO, "LICENSE")
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_build_puts_the_shipped_files_in_the_package(tmp_path: Any) -> None:
    """setup.py's build step (what pip runs for a wheel) copies etc/ and spank/ as data."""
    from slurmiso.install import ASSETS

    out = run_py(["setup.py", "-q", "build_py", "--build-lib", str(tmp_path)])
    assert out.returncode == 0, out.stderr
    data = tmp_path / "slurmiso" / "data"
    for rel in ASSETS:
        assert (data / "etc" / rel).read_text() == read(REPO, "etc", rel)
    assert (data / "spank" / "slurmiso_spank.c").exists()
    probe = run_py(["-c", "from slurmiso.install import asset_path; "
                    "print(asset_path('slurmiso.yaml'))"],
                   cwd=str(tmp_path), env=dict(ENV, PYTHONPATH=str(tmp_path)))
    assert probe.stdout.strip() == str(data / "etc" / "slurmiso.yaml")


# ------------------------------------------------------------------ man and completion
def test_man_page_covers_every_subcommand_and_option() -> None:
    page = manpage.slurmiso_1()
    for path, parser in manpage.commands(build_parser()):
        assert f'.SS {manpage.roff("slurmiso " + path)}' in page, path
        for action in manpage.options(parser):
            assert manpage.roff(action.option_strings[-1]) in page, (path, action.dest)


def test_config_man_page_covers_every_key_the_loader_reads() -> None:
    page = manpage.slurmiso_yaml_5()
    schema = manpage.config_schema()
    assert len(schema) > 40
    for key, _info in schema:
        assert f"\\fB{manpage.roff(key)}\\fR" in page, key
    for top in example_data():
        assert any(k == top for k, _ in schema), top


def test_prolog_page_documents_both_hooks_and_exit_codes() -> None:
    page = manpage.slurmiso_prolog_8()
    assert ".SH PROLOG" in page and ".SH EPILOG" in page
    assert "SLURM_JOB_ID" in page and "drained" in page


def test_man_pages_render_without_warnings(tmp_path: Any) -> None:
    if not os.path.exists("/usr/bin/groff"):
        pytest.skip("groff is not installed (man-db's renderer)")
    for name, text in manpage.all_pages().items():
        if text.startswith(".so"):
            continue
        path = tmp_path / name
        path.write_text(text)
        out = subprocess.run(["groff", "-man", "-Tutf8", "-ww", "-z", str(path)],
                             capture_output=True, text=True)
        assert out.returncode == 0 and not out.stderr.strip(), (name, out.stderr[:500])


def test_bash_completion_offers_every_subcommand(tmp_path: Any) -> None:
    script = manpage.bash_completion()
    for path, _p in manpage.commands():
        assert f'"{path}")' in script, path
    path = tmp_path / "slurmiso"
    path.write_text(script)
    probe = ('source "$1"; COMP_WORDS=(slurmiso gen sl); COMP_CWORD=2; _slurmiso; '
             'echo "${COMPREPLY[@]}"')
    out = subprocess.run(["bash", "-c", probe, "bash", str(path)], capture_output=True,
                         text=True)
    assert out.stdout.split() == ["slurm-conf"], out.stderr
