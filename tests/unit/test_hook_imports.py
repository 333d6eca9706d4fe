"""The hooks' start-up path stays lean: what a prolog and an epilog import (issue 14).

slurmd starts the prolog and the epilog as new interpreters on every job, so every module they
import is paid per job. With a fresh config cache the path needs neither the YAML parser nor
the libraries the rest of slurmiso uses. Each hook runs here in its own interpreter started
with ``-S`` (no ``site``: a development install's path hook imports ``pathlib`` before any
slurmiso code runs; PyYAML's folder is on ``PYTHONPATH`` instead), and reports ``sys.modules``
after its ``main()`` returned.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict, List, Set

import pytest
import yaml

from slurmiso.gpu.sim import SimBackend, init_state

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
YAML_DIR = os.path.dirname(os.path.dirname(os.path.abspath(yaml.__file__)))

#: Never on the hook path once the config cache is fresh.
NOT_ON_PATH = (
    "yaml",  # the cache holds the parsed YAML as JSON
    "pathlib",
    "importlib.resources",
    "importlib.metadata",
    "socket",  # the node name comes from SLURMD_NODENAME; socket only as a fallback
    "logging.handlers",  # syslog goes through the C `syslog` module
    "subprocess",  # scontrol only to drain the node or to look up a missing QoS
    "heapq",  # merging journals is for readers, not writers
    "datetime",  # the journal stamps records with time.strftime (journal.now_ts)
    "tempfile",  # imports random, shutil and the compressors
    "signal",  # only when an epilog has processes to end (isolation/processes.py)
    "uuid",  # the simulated driver's MIG UUIDs come from gpu.sim.uuid5_text
    "hashlib",  # loads OpenSSL
    "platform",
    "psutil",
    "dataclasses",  # value classes are slurmiso.values.Value: no code generated per class
    "inspect",  # what dataclasses imports (with ast, dis, tokenize's callers)
    "ast",
    "slurmiso.gpu.protocols",  # typing.Protocol classes: only annotations name them here
    "slurmiso.submit",  # SPANK option rules: only for a job that passed options
    "slurmiso.cli",
    "slurmiso.gpu.nvml",
    "slurmiso.doctor",
    "slurmiso.probe",
    "slurmiso.slurm.client",
    "slurmiso.audit",
    "slurmiso.monitor",
    "slurmiso.agent",
    "slurmiso.exposition",
    "slurmiso.restraints",
)

root_only = pytest.mark.needs_root(
    reason="the config cache is used by root only (cache.py), so a non-root run always parses "
    "YAML; the hooks run as root")

HOOK = """
import sys
from slurmiso.hooks.prolog import main
rc = main([], sys.argv[1])
mods = sorted(sys.modules)
sys.stdout.write(str(rc) + "\\n" + "\\n".join(mods) + "\\n")
"""


def _node(tmp: str) -> str:
    data = {
        "version": 1,
        "paths": {"state_dir": f"{tmp}/state", "journal": f"{tmp}/journal.jsonl"},
        "gpu": {"backend": "sim", "sim_state": f"{tmp}/sim.json"},
        "classes": [{"name": "train", "match": {"qos": ["train"]}, "isolation": "mig",
                     "mig_profile": "1g.10gb"}],
        "default_class": "",
        "pools": [{"name": "p", "nodes": "n1", "partition": "p", "gpu_model": "H100-80GB",
                   "gpus_per_node": 2, "mode": "mig-dynamic"}],
    }
    path = os.path.join(tmp, "slurmiso.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    init_state(f"{tmp}/sim.json", "H100-80GB", 2, mig=True, node="n1")
    return path


def _run(tmp: str, cfg: str, phase: str, job: int) -> Set[str]:
    env: Dict[str, str] = {
        "PYTHONPATH": os.pathsep.join([ROOT, YAML_DIR]), "SLURMISO_CONFIG": cfg, "SLURMISO_CACHE_DIR": f"{tmp}/cache",
        "SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(os.getuid()), "SLURMD_NODENAME": "n1",
        "SLURM_JOB_QOS": "train", "SLURM_JOB_GPUS": "1", "SLURM_JOB_PARTITION": "p",
        "SLURM_JOB_WORK_DIR": tmp, "PATH": os.environ.get("PATH", ""),
    }
    proc = subprocess.run([sys.executable, "-S", "-B", "-c", HOOK, phase], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines: List[str] = proc.stdout.splitlines()
    assert lines[0] == "0", f"{phase} exit {lines[0]}: {proc.stderr}"
    return set(lines[1:])


def _loaded(mods: Set[str], name: str) -> bool:
    return name in mods or any(m.startswith(name + ".") for m in mods)


@root_only
def test_prolog_and_epilog_with_a_fresh_cache_import_nothing_heavy(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = _node(tmp)
    cold = _run(tmp, cfg, "prolog", 1)  # no cache yet: parses the YAML and writes the cache
    assert "yaml" in cold, "the first run should have parsed YAML (else nothing was tested)"
    assert os.listdir(f"{tmp}/cache"), "the first run wrote no config cache"
    _run(tmp, cfg, "epilog", 1)
    for phase in ("prolog", "epilog"):
        mods = _run(tmp, cfg, phase, 2)
        assert "slurmiso.hooks.runner" in mods and "slurmiso.config.loader" in mods
        heavy = [name for name in NOT_ON_PATH if _loaded(mods, name)]
        assert heavy == [], f"{phase} imported {heavy} with a fresh config cache"
    assert SimBackend(f"{tmp}/sim.json").instances() == []  # the hooks did their work


#: Leaf modules the hooks share with other sides (the wrapper, the monitor): importing one
#: alone must pull in no other slurmiso module and nothing kept off the hook path.
HOOK_LEAVES = ("slurmiso.jobfiles", "slurmiso.pids", "slurmiso.sluid")


@pytest.mark.parametrize("leaf", HOOK_LEAVES)
def test_a_shared_leaf_module_imports_nothing_heavy(leaf: str) -> None:
    code = f"import sys, {leaf}; sys.stdout.write('\\n'.join(sorted(sys.modules)))"
    proc = subprocess.run([sys.executable, "-S", "-B", "-c", code], env={"PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    mods = set(proc.stdout.splitlines())
    assert {m for m in mods if _loaded({m}, "slurmiso")} == {"slurmiso", leaf}
    assert [name for name in NOT_ON_PATH if _loaded(mods, name)] == []


ENTRY = """
import gc, sys
from slurmiso.hooks.prolog import main
phase, how = sys.argv[1:]
sys.argv = ["slurmiso-" + phase]  # as slurmd runs the console script: no arguments
before = gc.get_freeze_count()
rc = main(None if how == "entry" else [], phase)
sys.stdout.write(f"{rc} {before} {gc.get_freeze_count()}\\n")
"""


@root_only
def test_the_process_entry_spares_the_exit_collection(tmp_path: Any) -> None:
    """main() as a process's entry point (no argv: the script and the console script) freezes
    the heap, so the interpreter's exit skips a last full collection; called with an argv (as
    tests and other code do) it leaves the caller's collector alone."""
    tmp = str(tmp_path)
    cfg = _node(tmp)
    env = {"PYTHONPATH": os.pathsep.join([ROOT, YAML_DIR]), "SLURMISO_CONFIG": cfg,
           "SLURMISO_CACHE_DIR": f"{tmp}/cache", "SLURM_JOB_UID": str(os.getuid()),
           "SLURMD_NODENAME": "n1", "SLURM_JOB_QOS": "train", "SLURM_JOB_GPUS": "1",
           "SLURM_JOB_PARTITION": "p", "PATH": os.environ.get("PATH", "")}
    seen = {}
    for job, (phase, how) in enumerate([("prolog", "entry"), ("epilog", "entry"),
                                        ("prolog", "call"), ("epilog", "call")]):
        proc = subprocess.run([sys.executable, "-S", "-B", "-c", ENTRY, phase, how],
                              env=dict(env, SLURM_JOB_ID=str(5 + job // 2)),
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        seen[phase, how] = [int(x) for x in proc.stdout.split()]
    for (phase, how), (rc, before, after) in seen.items():
        assert rc == 0 and before == 0, (phase, how, rc, before)
        assert (after > 1000) if how == "entry" else (after == 0), (phase, how, after)
    assert SimBackend(f"{tmp}/sim.json").instances() == []  # the hooks did their work


@root_only
def test_an_edited_config_is_parsed_again(tmp_path: Any) -> None:
    """The cache never hides an edit: the YAML parser comes back when the file changed."""
    tmp = str(tmp_path)
    cfg = _node(tmp)
    _run(tmp, cfg, "prolog", 1)
    with open(cfg, "a") as fh:
        fh.write("# edited\n")
    assert "yaml" in _run(tmp, cfg, "epilog", 1)


def test_hook_syslog_lines_carry_the_tag_and_the_level(monkeypatch: Any) -> None:
    """The C-syslog handler keeps what SysLogHandler sent: tag, facility user, priority."""
    import logging
    import syslog

    from slurmiso.hooks import hooklog

    sent: List[Any] = []
    monkeypatch.setattr(syslog, "openlog", lambda *a: sent.append(("open",) + a))
    monkeypatch.setattr(syslog, "syslog", lambda *a: sent.append(a))
    handler = hooklog.SyslogHandler("slurmiso-prolog[7]")
    logger = logging.getLogger("slurmiso.test_hooklog")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("GPU %d busy", 3)
        logger.error("drained")
    finally:
        logger.removeHandler(handler)
    assert sent == [("open", "slurmiso-prolog[7]", 0, syslog.LOG_USER),
                    (syslog.LOG_WARNING, "GPU 3 busy"), (syslog.LOG_ERR, "drained")]
    from logging.handlers import SysLogHandler

    for level in (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL):
        name = logging.getLevelName(level)
        assert hooklog.priority(level) == SysLogHandler.priority_names[
            SysLogHandler.priority_map[name]], name


@pytest.mark.parametrize("name", ["", "n1/gpu/0", "bench1/gpu/7", "GPU-x/gi3/ci0/g12", "n\u00e9/gpu/1"])
def test_sim_uuids_are_uuid5(name: str) -> None:
    """The sim's UUIDs without the uuid module are the ones uuid.uuid5 gave (state files
    written before keep their UUIDs)."""
    import uuid

    from slurmiso.gpu.sim import _UUID_NS, uuid5_text

    assert uuid5_text(name) == str(uuid.uuid5(uuid.UUID(_UUID_NS), name))


@pytest.mark.parametrize("name", NOT_ON_PATH)
def test_each_name_kept_off_the_hook_path_is_a_real_module(name: str) -> None:
    """A misspelt name in NOT_ON_PATH would never be "loaded" and so always pass (issue 27):
    each must name a module this interpreter can find."""
    import importlib.util

    assert importlib.util.find_spec(name) is not None, f"{name} is no module: fix NOT_ON_PATH"


def test_the_real_module_check_fails_for_a_name_that_does_not_exist() -> None:
    import importlib.util

    assert importlib.util.find_spec("slurmiso.no_such_module_anywhere") is None
