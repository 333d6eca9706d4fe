"""One validator for the user's ``--iso-*`` options, applied identically in three places.

The same hostile list goes through the SPANK plugin's C check (compiled here with gcc, without
Slurm's headers), the generated job_submit.lua (run by Lua 5.1) and the Prolog (run_hook on a
simulated node). All three must agree on every input; every hostile input is refused, and in
the Prolog a refusal is a record that hides the GPUs, never a drain and never a job that runs
on the raw GPU (issue 13, "Fail closed").
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any, Dict, List, Tuple

import pytest

from slurmiso.config import load_config
from slurmiso.hooks import task_prolog
from slurmiso.hooks.runner import run_hook
from slurmiso.submit import options
from slurmiso.submit.job_submit import lua_literal, render_job_submit
from slurmiso.submit.plugstack import mig_profile_names
from tests.hookctx import Drains, job_env, state, write_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LUA = shutil.which("lua5.1") or shutil.which("lua")
GCC = shutil.which("gcc") or shutil.which("cc")

#: (option, value): each must be refused by all three.
HOSTILE: List[Tuple[str, str]] = [
    ("iso_class", "../../etc/passwd"),
    ("iso_class", "debug\n"),
    ("iso_class", "de\x00bug"),
    ("iso_class", "x;rm -rf /"),
    ("iso_class", "$(reboot)"),
    ("iso_class", "`id`"),
    ("iso_class", ""),
    ("iso_class", "a" * 33),
    ("iso_class", "d" * 300),
    ("iso_class", "gold"),  # not a class of this cluster
    ("iso_class", "d\u0435bug"),  # Cyrillic e
    ("iso_class", "-debug"),
    ("iso_class", "debug "),
    ("iso_class", "debug|cat"),
    ("iso_mps_mem", "9" * 300),
    ("iso_mps_mem", "9" * 310),
    ("iso_mps_mem", "-1"),
    ("iso_mps_mem", "-5G"),
    ("iso_mps_mem", "0"),
    ("iso_mps_mem", "150%"),
    ("iso_mps_mem", "8Gi"),
    ("iso_mps_mem", "1e9"),
    ("iso_mps_mem", "0x10"),
    ("iso_mps_mem", "8 G"),
    ("iso_mps_mem", "8G\n"),
    ("iso_mps_mem", "2T"),  # above the 1 TiB range
    ("iso_mps_mem", "1048577M"),
    ("iso_mps_mem", "inf"),
    ("iso_mps_mem", "nan"),
    ("iso_mps_mem", ""),
    ("iso_mps_mem", "\uff18G"),  # fullwidth 8
    ("iso_mps_mem", "1.G"),
    ("iso_mps_mem", ".5G"),
    ("iso_mps_mem", "0.0001M"),
    ("iso_mps_mem", "8GB;id"),
    ("iso_mig_profile", "../3g.40gb"),
    ("iso_mig_profile", "3g.40gb\n"),
    ("iso_mig_profile", "8g.80gb"),
    ("iso_mig_profile", "3g.999gb"),  # right shape, not a profile of these GPUs
    ("iso_mig_profile", "3g.40gb+me;x"),
    ("iso_mig_profile", "3g.40GB"),
    ("iso_mig_profile", ""),
    ("iso_mig_profile", "3g.40gb\x00"),
    ("iso_mig_profile", "3g.40gb "),
    ("iso_ckpt_dir", "relative/ckpt"),
    ("iso_ckpt_dir", "/scratch/../etc"),
    ("iso_ckpt_dir", "/.."),
    ("iso_ckpt_dir", "/a/.."),
    ("iso_ckpt_dir", "/tmp/x\ny"),
    ("iso_ckpt_dir", "/tmp/$(id)"),
    ("iso_ckpt_dir", "/tmp/a b"),
    ("iso_ckpt_dir", "/tmp/\u00e9t\u00e9"),
    ("iso_ckpt_dir", "/" + "a" * 1100),
    ("iso_ckpt_dir", ""),
    ("iso_ckpt_dir", "/tmp/`id`"),
    ("iso_ckpt_dir", "/tmp/x;rm"),
    ("iso_ckpt_dir", "/tmp/\x00x"),
    ("iso_ckpt_dir", "/tmp/\x1b[31mred"),
    ("iso_metrics", ""),
    ("iso_metrics", "80"),  # below 1024: a system port
    ("iso_metrics", "1023"),
    ("iso_metrics", "65536"),
    ("iso_metrics", "99999"),
    ("iso_metrics", "08000"),  # a leading zero: two spellings of one port
    ("iso_metrics", "123456"),
    ("iso_metrics", "8000 "),
    ("iso_metrics", "8000\n"),
    ("iso_metrics", "8000\x00/metrics"),
    ("iso_metrics", "-8000"),
    ("iso_metrics", "+8000"),
    ("iso_metrics", "8000.5"),
    ("iso_metrics", "0x1f40"),
    ("iso_metrics", "localhost:8000"),
    ("iso_metrics", "10.0.0.5:8000/metrics"),  # another host: only 127.0.0.1 is read
    ("iso_metrics", "http://evil/8000"),
    ("iso_metrics", "8000metrics"),
    ("iso_metrics", "8000/metrics?x=1"),
    ("iso_metrics", "8000/metrics#x"),
    ("iso_metrics", "8000/me trics"),
    ("iso_metrics", "8000/%2e%2e/admin"),
    ("iso_metrics", "8000/metrics\r\nHost: other"),  # request smuggling
    ("iso_metrics", "8000/" + "a" * 64),  # a path of 65 characters
    ("iso_metrics", "8000/\u00e9t\u00e9"),
    ("iso_metrics", "\uff18000"),  # fullwidth 8
    ("iso_metrics", "8000/$(id)"),
]

#: Accepted by all three (a validator that refuses everything must fail this test).
VALID: List[Tuple[str, str]] = [
    ("iso_class", "debug"),
    ("iso_mps_mem", "8G"),
    ("iso_mps_mem", "8.5GiB"),
    ("iso_mps_mem", "512M"),
    ("iso_mps_mem", "1T"),
    ("iso_mps_mem", "1048576M"),
    ("iso_mps_mem", "1"),
    ("iso_mps_mem", "1K"),
    ("iso_mps_mem", "0.001M"),
    ("iso_mps_mem", "0.001GB"),
    ("iso_mig_profile", "3g.40gb"),
    ("iso_mig_profile", "7g.80gb"),
    ("iso_ckpt_dir", "/scratch/u-1/ckpt_2"),
    ("iso_ckpt_dir", "/a/..b/c..d/.x"),
    ("iso_metrics", "8000"),
    ("iso_metrics", "1024"),
    ("iso_metrics", "65535"),
    ("iso_metrics", "8000/metrics"),
    ("iso_metrics", "8000/"),
    ("iso_metrics", "9100/v1/prom_metrics-2.txt"),
    ("iso_metrics", "8000/" + "a" * 63),
]
ALL = HOSTILE + VALID


def test_hostile_list_is_long_and_every_value_is_distinct() -> None:
    assert len(HOSTILE) >= 40 and len(set(HOSTILE)) == len(HOSTILE)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Tuple[str, Any]:
    tmp = str(tmp_path_factory.mktemp("cluster"))
    path = write_config(tmp, "exclusive")
    return path, load_config(path)


def python_verdicts(cfg: Any) -> List[bool]:
    classes = [c.name for c in cfg.classes]
    profiles = mig_profile_names(cfg)
    return [options.problem(n, v, classes, profiles) is None for n, v in ALL]


def _lua_string(value: str) -> str:
    """A Lua 5.1 literal of the value's UTF-8 bytes, every non-alphanumeric byte as \\ddd."""
    return '"' + "".join(chr(b) if chr(b).isalnum() and b < 128 else f"\\{b:03d}"
                         for b in value.encode("utf-8")) + '"'


_LUA_DRIVER = """
slurm = { SUCCESS = 0, ERROR = -1, NO_VAL = 4294967294, NO_VAL16 = 65534,
          INFINITE = 4294967295 }
local said = ""
slurm.log_user = function(fmt, ...) said = string.format(fmt, ...) end
slurm.log_error = slurm.log_user
slurm.log_info = function() end
dofile(SCRIPT)
for i, case in ipairs(CASES) do
  said = ""
  local job = { qos = "debug", default_account = "a", partition = "part",
                requeue = 65534, time_limit = 4294967294, min_nodes = 4294967294,
                num_tasks = 4294967294, tres_per_node = "gres:gpu:1",
                spank_job_env = { "_SLURM_SPANK_OPTION_slurmiso_" .. case[1] .. "=" .. case[2] } }
  local rc = slurm_job_submit(job, {}, 0)
  io.write(i, "\\t", rc, "\\t", (string.gsub(said, "\\n", " ")), "\\n")
end
"""


def lua_verdicts(cfg: Any, tmp: Any) -> List[Tuple[bool, str]]:
    if LUA is None:
        pytest.skip("no Lua interpreter (apt-get install lua5.1; 'slurmiso sandbox up' does)")
    script = tmp / "job_submit.lua"
    script.write_text(render_job_submit(cfg))
    cases = "{\n" + "".join(
        f"  {{ {_lua_string(n)}, {_lua_string(v)} }},\n" for n, v in ALL) + "}"
    driver = tmp / "driver.lua"
    driver.write_text(f"SCRIPT = {lua_literal(str(script))}\nCASES = {cases}\n" + _LUA_DRIVER)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
    cp = subprocess.run([LUA, str(driver)], capture_output=True, timeout=60, env=env)
    assert cp.returncode == 0, cp.stderr
    rows = [ln.split(b"\t") for ln in cp.stdout.splitlines()]
    assert len(rows) == len(ALL), cp.stdout[-2000:]
    return [(int(r[1]) == 0, r[2].decode("utf-8", "replace")) for r in rows]


_C_HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "slurmiso_validate.h"

static int hexval(int c) { return c <= '9' ? c - '0' : c - 'a' + 10; }

int main(int argc, char **argv)
{
	static char line[8192], value[4096];
	(void)argc;
	while (fgets(line, sizeof line, stdin)) {
		int opt = line[0] - '0';
		size_t n = 0;
		char *p = line + 2;
		while (p[0] && p[0] != '\n' && p[1]) {
			value[n++] = (char)(hexval(p[0]) * 16 + hexval(p[1]));
			p += 2;
		}
		value[n] = '\0';
		printf("%d\n", slurmiso_option_ok(opt, value, n, argv[1], argv[2]));
	}
	return 0;
}
"""

_C_OPT = {"iso_class": 0, "iso_mps_mem": 1, "iso_mig_profile": 2, "iso_ckpt_dir": 3,
          "iso_metrics": 4}


def c_verdicts(cfg: Any, tmp: Any) -> List[bool]:
    assert GCC is not None, "a test that calls c_verdicts carries needs_toolchain"
    src = tmp / "harness.c"
    src.write_text(_C_HARNESS)
    exe = tmp / "harness"
    cc = subprocess.run([GCC, "-std=gnu99", "-Wall", "-Wextra", "-Werror",
                         "-I", os.path.join(REPO, "spank"), "-o", str(exe), str(src)],
                        capture_output=True, text=True, timeout=120)
    assert cc.returncode == 0, cc.stderr
    stdin = "".join(f"{_C_OPT[n]} {v.encode('utf-8').hex()}\n" for n, v in ALL)
    classes = ",".join(c.name for c in cfg.classes)
    profiles = ",".join(mig_profile_names(cfg))
    cp = subprocess.run([str(exe), classes, profiles], input=stdin, capture_output=True,
                        text=True, timeout=60)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout.split()
    assert len(out) == len(ALL)
    return [x == "1" for x in out]


@pytest.mark.needs_toolchain("cc", reason="builds the SPANK plugin's option checks")
def test_c_lua_and_python_agree_on_every_input(cluster: Tuple[str, Any], tmp_path: Any) -> None:
    _path, cfg = cluster
    py = python_verdicts(cfg)
    lua = lua_verdicts(cfg, tmp_path)
    c = c_verdicts(cfg, tmp_path)
    for i, (name, value) in enumerate(ALL):
        expect = (name, value) in VALID
        got = {"python": py[i], "lua": lua[i][0], "c": c[i]}
        assert set(got.values()) == {expect}, f"--{name}={value[:50]!r}: {got} (lua: {lua[i][1]})"
        if not expect:  # the Lua refusal names the option and shows the value inertly
            assert lua[i][1].startswith(f"slurmiso: --{name.replace('_', '-')}="), lua[i][1]
            assert "\n" not in lua[i][1] and "\x00" not in lua[i][1]


def test_prolog_refuses_every_hostile_value_with_a_record(
    cluster: Tuple[str, Any], tmp_path: Any
) -> None:
    """0 jobs run unisolated, 0 node drains: each hostile value is a refused record whose
    task prolog output hides the GPUs; each valid one is a ready job."""
    cfg_path, _cfg = cluster
    tmp = os.path.dirname(cfg_path)
    drains = Drains()
    for i, (name, value) in enumerate(ALL):
        job = str(1000 + i)
        env: Dict[str, str] = job_env(job=job, qos="debug", gpus=str(i % 2))
        env[f"SPANK__SLURM_SPANK_OPTION_slurmiso_{name}"] = value
        assert run_hook("prolog", env, cfg_path, drains) == 0
        rec = state(tmp).read_job(job)
        assert rec is not None, f"--{name}={value[:40]!r}: no record"
        lines = task_prolog.lines_for(rec, job)
        if (name, value) in VALID:
            assert rec.status == "ready", (name, value, rec.reason)
        else:
            assert rec.status == "refused", (name, value)
            assert f"--{name.replace('_', '-')}=" in rec.reason
            assert lines[0] == "export CUDA_VISIBLE_DEVICES="
            assert all(ln.isprintable() for ln in lines)
            assert rec.fence["uid"] == os.getuid() and rec.fence["gpus"] == [i % 2]
        assert run_hook("epilog", env, cfg_path, drains) == 0
        assert state(tmp).read_job(job) is None
    assert drains.calls == []
    assert state(tmp).allocations() == {}


def test_limits_header_is_generated_from_the_python_definition() -> None:
    with open(os.path.join(REPO, "spank", "slurmiso_limits.h")) as fh:
        assert fh.read() == options.render_c_header(), (
            "spank/slurmiso_limits.h is stale: python3 -m slurmiso.submit.options > "
            "spank/slurmiso_limits.h"
        )


@pytest.mark.needs_toolchain("cc", reason="builds the SPANK plugin")
def test_spank_plugin_builds_with_the_shared_header(tmp_path: Any) -> None:
    assert GCC is not None
    if not os.path.exists("/usr/include/slurm/spank.h"):
        pytest.skip("needs libslurm-dev's <slurm/spank.h> to build the SPANK plugin")
    cp = subprocess.run([GCC, "-std=gnu99", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared",
                         "-o", str(tmp_path / "slurmiso.so"),
                         os.path.join(REPO, "spank", "slurmiso_spank.c")],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, cp.stderr


def test_mps_mem_is_parsed_with_bounds_never_overflow() -> None:
    """310 digits used to be float('inf') -> OverflowError in the root prolog (a drain)."""
    for text in ("9" * 310, "9" * 5000 + "G"):
        assert options.problem("iso_mps_mem", text) is not None
        with pytest.raises(ValueError):
            options.size_mib(text)
    assert options.size_mib("0.1G") == 103 and options.size_mib("1.5T") == 1536 * 1024


@pytest.mark.parametrize("name", ["in fer", "a" * 33, "1st", "tr\u00e4in", "x;y"])
def test_config_refuses_class_names_users_could_not_ask_for(name: str) -> None:
    import yaml

    from slurmiso.config import parse_config
    from slurmiso.errors import ConfigError

    with open(os.path.join(REPO, "etc", "slurmiso.yaml")) as fh:
        data = yaml.safe_load(fh)
    data["classes"][2]["name"] = name
    with pytest.raises(ConfigError) as err:
        parse_config(data, "etc/slurmiso.yaml")
    assert "classes[2].name" in str(err.value)


def test_an_option_passed_twice_with_different_values_is_refused_by_lua_and_prolog(
    cluster: Tuple[str, Any], tmp_path: Any
) -> None:
    """The plugin's SLURMISO_* copy and Slurm's raw option must agree (a client without the
    plugin can set either)."""
    cfg_path, cfg = cluster
    if LUA is None:
        pytest.skip("no Lua interpreter")
    script = tmp_path / "job_submit.lua"
    script.write_text(render_job_submit(cfg))
    driver = tmp_path / "driver.lua"
    driver.write_text(f"SCRIPT = {lua_literal(str(script))}\n" + """
slurm = { SUCCESS = 0, ERROR = -1 }
local said = ""
slurm.log_user = function(fmt, ...) said = string.format(fmt, ...) end
slurm.log_info = function() end
dofile(SCRIPT)
local job = { qos = "debug", partition = "part", default_account = "a",
              spank_job_env = { "SLURMISO_MPS_MEM=1G", "_SLURM_SPANK_OPTION_slurmiso_iso_mps_mem=900G" } }
io.write(slurm_job_submit(job, {}, 0), "\\t", said)
""")
    cp = subprocess.run([LUA, str(driver)], capture_output=True, text=True, timeout=30)
    rc, said = cp.stdout.split("\t")
    assert rc == "-1" and "passed twice" in said, cp.stdout + cp.stderr
    tmp = os.path.dirname(cfg_path)
    env = job_env(job="900", qos="debug", SPANK_SLURMISO_MPS_MEM="1G",
                  SPANK__SLURM_SPANK_OPTION_slurmiso_iso_mps_mem="900G")
    assert run_hook("prolog", env, cfg_path, Drains()) == 0
    rec = state(tmp).read_job("900")
    assert rec is not None and rec.status == "refused" and "passed twice" in rec.reason
    assert run_hook("epilog", env, cfg_path, Drains()) == 0
