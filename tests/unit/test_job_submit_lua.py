"""The generated job_submit.lua run by a real Lua 5.1 (what Debian's Slurm links) on fake jobs.

Each case is a ``job_desc`` table as slurmctld 22.05 hands it over (fields measured in the
sandbox: unset numbers are NO_VAL/NO_VAL16, ``tres_per_node`` reads ``gres:shard:3``, SPANK
options arrive in ``spank_job_env``); the script must accept it untouched, fill the class's
defaults, or reject it with a message that names the fix. The shipped examples
(etc/job_submit.lua, etc/plugstack.conf.d/slurmiso.conf) are the golden files.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from typing import Any, Dict, List, Optional, Tuple

import pytest
import yaml

from slurmiso.config import parse_config
from slurmiso.config.model import Config
from slurmiso.submit.job_submit import lua_literal, render_job_submit, submit_data
from slurmiso.submit.plugstack import render_plugstack
from tests.goldens import check_golden as _check

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LUA = shutil.which("lua5.1") or shutil.which("lua")
NO_VAL, NO_VAL16, INFINITE = 4294967294, 65534, 4294967295


def example_config(edit: Optional[Any] = None) -> Config:
    with open(os.path.join(REPO, "etc", "slurmiso.yaml")) as fh:
        data = yaml.safe_load(fh)
    if edit:
        edit(data)
    return parse_config(data, "etc/slurmiso.yaml")


def _restricted(data: Dict[str, Any]) -> None:
    """infer only for account 'serving'; a class with no default for the no-default case."""
    data["classes"][0]["qos"]["accounts"] = ["serving"]


CFG = example_config(_restricted)


def check_golden(rel: str, text: str) -> None:
    """The shipped example is the golden file (UPDATE_GOLDEN=1 rewrites it)."""
    _check(os.path.join(REPO, rel), text)


def test_job_submit_of_the_example_config_matches_golden() -> None:
    check_golden("etc/job_submit.lua", render_job_submit(example_config()))


def test_plugstack_of_the_example_config_matches_golden() -> None:
    check_golden("etc/plugstack.conf.d/slurmiso.conf", render_plugstack(example_config()))


def test_data_table_precomputes_mps_counts_and_mig_slices() -> None:
    parts = submit_data(CFG)["partitions"]
    assert parts["infer"]["mps_max"] == {"infer": 100, "train": 60, "debug": 100}
    assert parts["elastic"]["slices"]["3g.40gb"] == 3
    assert parts["elastic"]["class_profile"] == {"infer": "3g.40gb", "train": "4g.40gb"}
    # keyed by partition, not pool: the example's exclusive pool "bulk" serves partition train
    assert {k: v["pool"] for k, v in parts.items()} == {
        "infer": "serve", "mixed": "mixed", "elastic": "elastic", "train": "bulk"}
    assert parts["train"]["mode"] == "exclusive"
    assert not {"mps_max", "slices"} & set(parts["train"])  # no share tables for whole GPUs


@pytest.mark.parametrize("value, text", [
    (True, "true"), (3, "3"), ('a"b\\', '"a\\"b\\\\"'), ([], "{}"), (["x", 1], '{ "x", 1 }'),
    ({"end": 1, "3g.40gb": 3, "ok": 2}, '{\n  ["3g.40gb"] = 3,\n  ["end"] = 1,\n  ok = 2,\n}'),
])
def test_lua_literal(value: Any, text: str) -> None:
    assert lua_literal(value) == text


# --------------------------------------------------------------------- the script itself
_FAKE_SLURM = """
slurm = { SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534,
          INFINITE = 4294967295 }
local said = ""
slurm.log_user = function(fmt, ...) said = string.format(fmt, ...) end
slurm.log_error = slurm.log_user
slurm.log_info = function() end
dofile(SCRIPT)
local function show(v) if v == nil then return "nil" end return tostring(v) end
for i, case in ipairs(CASES) do
  said = ""
  local rc
  if case.cli then
    rc = slurm_cli_pre_submit(case.cli, 0)
    io.write(i, "\\t", rc, "\\t", said, "\\t", show(case.cli.signal), "\\n")
  else
    local job = case.job
    rc = slurm_job_submit(job, PARTS, 0)
    io.write(i, "\\t", rc, "\\t", said, "\\t", show(job.requeue), "|", show(job.time_limit), "\\n")
  end
end
"""

BASE = {"qos": None, "default_qos": "normal", "default_account": "research",
        "partition": "bulk", "requeue": NO_VAL16, "time_limit": NO_VAL, "min_nodes": NO_VAL,
        "num_tasks": NO_VAL}
PARTS = {"bulk": {"name": "bulk", "flag_default": 1}, "infer": {"name": "infer", "flag_default": 0}}


def job(**fields: Any) -> Dict[str, Any]:
    out = copy.deepcopy(BASE)
    out.update(fields)
    return {k: v for k, v in out.items() if v is not None}


def run_lua(cfg: Config, cases: List[Dict[str, Any]], tmp_path: Any) -> List[Tuple[int, str, str]]:
    if LUA is None:
        pytest.skip("no Lua interpreter (apt-get install lua5.1; 'slurmiso sandbox up' does)")
    script = tmp_path / "job_submit.lua"
    script.write_text(render_job_submit(cfg))
    driver = tmp_path / "driver.lua"
    driver.write_text(f"SCRIPT = {lua_literal(str(script))}\nCASES = {lua_literal(cases)}\n"
                      f"PARTS = {lua_literal(PARTS)}\n" + _FAKE_SLURM)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    cp = subprocess.run([LUA, str(driver)], capture_output=True, text=True, timeout=30, env=env)
    assert cp.returncode == 0, cp.stderr
    rows = [ln.split("\t") for ln in cp.stdout.splitlines()]
    assert len(rows) == len(cases), cp.stdout
    return [(int(r[1]), r[2], r[3]) for r in rows]


def spank(opts: Dict[str, str]) -> List[str]:
    """spank_job_env as sbatch sends it: the plugin's copy and Slurm's raw option."""
    out = []
    for name, value in opts.items():
        out += [f"SLURMISO_{name.upper()}={value}",
                f"_SLURM_SPANK_OPTION_slurmiso_iso_{name}={value}"]
    return out


#: (description, job_desc, expected rc, substring of the message, "requeue|time_limit")
JOB_CASES = [
    ("infer within limits is untouched", job(qos="infer", account="serving", time_limit=60,
     tres_per_node="gres:gpu:2"), 0, "", "65534|60"),
    ("train gets requeue and its max wall", job(qos="train"), 0, "", "1|10080"),
    ("no --qos: default QoS -> default class train", job(requeue=1), 0, "", "1|10080"),
    ("train --no-requeue", job(qos="train", requeue=0), -1,
     "train jobs are preempted and requeued, so they must be requeueable: remove --no-requeue",
     ""),
    ("infer too long", job(qos="infer", account="serving", time_limit=2880), -1,
     "infer jobs may run at most 1-00:00:00 (asked 2-00:00:00): lower --time", ""),
    ("infer unlimited", job(qos="infer", account="serving", time_limit=INFINITE), -1,
     "(asked UNLIMITED)", ""),
    ("infer too many GPUs per node x nodes", job(qos="infer", account="serving",
     tres_per_node="gres:gpu:h100:8", min_nodes=2), -1,
     "infer jobs may use at most 8 GPU(s) (asked 16): lower --gres=gpu/--gpus", ""),
    ("debug --gpus=2", job(qos="debug", tres_per_job="gres/gpu:2"), -1,
     "debug jobs may use at most 1 GPU(s) (asked 2)", ""),
    ("account may not use infer", job(qos="infer", time_limit=10), -1,
     "account research may not run infer jobs (allowed: serving): submit with "
     "--account=serving or another --qos", ""),
    ("mps within the class share", job(qos="train", partition="infer",
     tres_per_node="gres:mps:50"), 0, "", "1|10080"),
    ("mps above the class share", job(qos="train", partition="infer",
     tres_per_node="gres:mps:80"), -1,
     "train jobs run at 60% of an MPS GPU on partition infer: ask --gres=mps:60 or less "
     "(asked mps:80)", ""),
    ("shards match the class profile", job(qos="train", partition="elastic",
     tres_per_node="gres:shard:4"), 0, "", "1|10080"),
    ("shards do not match the class profile", job(qos="train", partition="elastic",
     tres_per_node="gres:shard:3"), -1,
     "on partition elastic a train job gets a 4g.40gb MIG instance (4 compute slices, class "
     "train): ask --gres=shard:4 (asked shard:3)", ""),
    ("shards match --iso-mig-profile", job(qos="train", partition="elastic",
     tres_per_node="gres:shard:3", spank_job_env=spank({"mig_profile": "3g.40gb"})), 0, "",
     "1|10080"),
    ("--iso-mig-profile larger than the class's", job(qos="infer", account="serving",
     partition="elastic", tres_per_node="gres:shard:7", spank_job_env=spank({"mig_profile": "7g.80gb"})),
     -1, "--iso-mig-profile=7g.80gb is larger than class infer's 3g.40gb", ""),
    ("debug has no MIG profile", job(qos="debug", partition="elastic",
     tres_per_node="gres:shard:1"), -1, "class debug has no MIG profile for H100-80GB", ""),
    ("bogus --iso-class", job(spank_job_env=["SLURMISO_CLASS=bogus"]), -1,
     "slurmiso: --iso-class=bogus is not allowed here (allowed: infer, train, debug)", ""),
    ("--iso-class conflicts with --qos", job(qos="train", spank_job_env=spank({"class": "infer"})),
     -1, "--iso-class=infer conflicts with --qos=train (class train)", ""),
    ("--iso-class needs its QoS", job(spank_job_env=spank({"class": "infer"})), -1,
     "class infer needs --qos=infer (job has normal): add --qos=infer", ""),
    ("bad --iso-mps-mem", job(spank_job_env=spank({"mps_mem": "8Gi"})), -1,
     "--iso-mps-mem=8Gi is not allowed here", ""),
    ("good --iso-mps-mem", job(spank_job_env=spank({"mps_mem": "8.5GiB"})), 0, "", "1|10080"),
    ("--iso-ckpt-dir with ..", job(spank_job_env=spank({"ckpt_dir": "/scratch/../etc"})), -1,
     "--iso-ckpt-dir=/scratch/../etc is not allowed here", ""),
    ("--iso-ckpt-dir relative", job(spank_job_env=spank({"ckpt_dir": "ckpt"})), -1,
     "--iso-ckpt-dir=ckpt is not allowed here", ""),
    ("partition from part_list default", job(partition=None, qos="debug",
     tres_per_node="gres:gpu:1"), 0, "", "65534|120"),
]


def test_job_submit_cases(tmp_path: Any) -> None:
    results = run_lua(CFG, [{"job": c[1]} for c in JOB_CASES], tmp_path)
    for (desc, _job, rc, msg, fields), (got_rc, said, got_fields) in zip(JOB_CASES, results):
        assert got_rc == rc, f"{desc}: rc {got_rc}, said {said!r}"
        if msg:
            assert said.startswith("slurmiso: ") and msg in said, f"{desc}: {said!r}"
        else:
            assert said == "", f"{desc}: {said!r}"
        if fields:
            assert got_fields == fields, f"{desc}: requeue|time_limit {got_fields}"


def test_unknown_qos_without_default_class_is_rejected(tmp_path: Any) -> None:
    cfg = example_config(lambda d: d.update(default_class=""))
    [(rc, said, _)] = run_lua(cfg, [{"job": job(qos="normal")}], tmp_path)
    assert rc == -1
    assert said == ("slurmiso: no job class for QoS normal on partition bulk (and no default "
                    "class): submit with --qos=infer or --qos=train or --qos=debug")


CLI_CASES = [
    ("train without --signal gets USR1@warn", {"qos": "train", "signal": "0@0"}, 0, "",
     "USR1@300"),
    ("train with its own signal time", {"qos": "train", "signal": "USR1@600"}, 0, "", "USR1@600"),
    ("signal shorter than the grace", {"qos": "train", "signal": "USR1@60"}, -1,
     "slurmiso: --signal=USR1@60 leaves less than the 120s checkpoint grace of train jobs "
     "before the time limit: use --signal=USR1@300", "USR1@60"),
    ("B: never reaches the wrapper step", {"qos": "train", "signal": "B:USR1"}, -1,
     "reaches only the batch shell, but train jobs run 'srun slurmiso run': use "
     "--signal=USR1@300 (without B:)", "B:USR1"),
    ("infer does not checkpoint: untouched", {"qos": "infer", "signal": "0@0"}, 0, "", "0@0"),
]


def test_cli_filter_signal(tmp_path: Any) -> None:
    results = run_lua(CFG, [{"cli": c[1]} for c in CLI_CASES], tmp_path)
    for (desc, _opts, rc, msg, sig), (got_rc, said, got_sig) in zip(CLI_CASES, results):
        assert got_rc == rc, f"{desc}: rc {got_rc}, said {said!r}"
        assert (msg in said) if msg else said == "", f"{desc}: {said!r}"
        assert got_sig == sig, desc
