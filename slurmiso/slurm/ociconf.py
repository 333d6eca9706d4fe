"""oci.conf (Slurm's ``--container`` support): the lines slurmiso needs, read and written.

    >>> conf = parse_oci_conf('RunTimeRun="crun run --bundle %b x"\\nEnvExclude="^SLURMISO_"\\n')
    >>> [p.line for p in problems(conf, (24, 11, 5), needs_mps=True)]
    ['EnvExclude="^(SLURM_CONF|SLURM_CONF_SERVER)="']

One table (:func:`required_lines`) serves ``slurmiso gen oci-conf`` and ``slurmiso doctor``,
as slurmconf.py does for slurm.conf. What Slurm does with oci.conf and the bundle's
config.json was read from SchedMD's source (github.com/SchedMD/slurm, tags slurm-22-05-8-1,
slurm-23-02-0-1, slurm-24-11-5-1, slurm-26-05-3-1): doc/man/man5/oci.conf.5, the options
table in src/common/oci_config.c (22.05: src/slurmd/slurmstepd/read_oci_conf.c) and
src/slurmd/slurmstepd/container.c. docs/admin-guide.md ("Containers") has the details.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from slurmiso.slurm.containers import (
    NEEDED_ENV,
    NEEDED_ENV_FAMILIES,
    BindRoot,
    comment,
    config_json_mounts,
)

Version = Tuple[int, int, int]

#: From 23.02 slurmstepd writes the container's config.json in container_run(), after the
#: TaskProlog and GRES have set the step's environment. 22.05 writes it in setup_container()
#: when the step is set up, before gres_g_step_set_env() and before any TaskProlog
#: (slurmstepd.c, task.c): slurmiso's exports, and even CUDA_VISIBLE_DEVICES, never reach
#: a 22.05 container.
ENV_AFTER_TASK_PROLOG_SINCE: Version = (23, 2, 0)

#: The keys each release's parser knows; an unknown key makes slurmstepd's parse fail.
KEYS_22_05 = ("ContainerPath", "CreateEnvFile", "RunTimeCreate", "RunTimeDelete",
              "RunTimeKill", "RunTimeQuery", "RunTimeRun", "RunTimeStart")
KEYS_23_02 = KEYS_22_05 + ("DebugFlags", "DisableCleanup", "DisableHooks", "EnvExclude",
                           "FileDebug", "IgnoreFileConfigJson", "MountSpoolDir",
                           "RunTimeEnvExclude", "SrunArgs", "SrunPath", "StdIODebug",
                           "SyslogDebug")

RUNTIMES = ("crun", "runc")
#: Slurm's own default exclusion (its containers guide's examples): slurmstepd's config
#: must not leak into the container. It matches none of slurmiso's variables.
DEFAULT_ENV_EXCLUDE = "^(SLURM_CONF|SLURM_CONF_SERVER)="
_TRUE = ("1", "y", "yes", "true")


def env_after_task_prolog(version: Optional[Version]) -> bool:
    return version is None or version >= ENV_AFTER_TASK_PROLOG_SINCE


def known_keys(version: Optional[Version]) -> Tuple[str, ...]:
    return KEYS_23_02 if env_after_task_prolog(version) else KEYS_22_05


@dataclass(frozen=True)
class OciConf:
    """A parsed oci.conf: keys by their lower-case name, and the lines that did not parse."""

    values: Dict[str, str]
    names: Dict[str, str]  # lower-case key -> as written
    malformed: Tuple[Tuple[int, str], ...] = ()

    def get(self, key: str) -> str:
        return self.values.get(key.lower(), "")

    def has(self, key: str) -> bool:
        return key.lower() in self.values


_LINE = re.compile(r"^\s*([A-Za-z][A-Za-z0-9]*)\s*=\s*(.*?)\s*$")


def _cut_comment(line: str) -> str:
    """The line up to the first '#' not escaped by an odd number of backslashes, quoted or
    not, escapes kept (src/common/parse_config.c, _strip_comments)."""
    backslashes = 0
    for i, ch in enumerate(line):
        if ch == "#" and backslashes % 2 == 0:
            return line[:i]
        backslashes = backslashes + 1 if ch == "\\" else 0
    return line


def _unescape(text: str) -> str:
    """Each backslash escapes the character after it (parse_config.c, _strip_escapes)."""
    return re.sub(r"\\(.)", r"\1", text)


def _logical_lines(text: str) -> List[Tuple[int, str, str]]:
    """(first line number, raw text, text as Slurm reads it): comments cut, a line ending
    in a backslash joined to the next (parse_config.c's continuation), escapes dropped."""
    out: List[Tuple[int, str, str]] = []
    start = 0
    raws: List[str] = []
    parts: List[str] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        body = _cut_comment(raw).rstrip("\r\n")
        if not raws:
            start = lineno
        raws.append(raw)
        if body.endswith("\\") and (len(body) - len(body.rstrip("\\"))) % 2 == 1:
            parts.append(body[:-1])
            continue
        parts.append(body)
        out.append((start, " ".join(r.strip() for r in raws), _unescape("".join(parts))))
        raws, parts = [], []
    if raws:
        out.append((start, " ".join(r.strip() for r in raws), _unescape("".join(parts))))
    return out


def parse_oci_conf(text: str) -> OciConf:
    """Key=Value lines, keys case-insensitive, values optionally double-quoted."""
    values: Dict[str, str] = {}
    names: Dict[str, str] = {}
    bad: List[Tuple[int, str]] = []
    for lineno, raw, text_line in _logical_lines(text):
        line = text_line.strip()
        if not line:
            continue
        m = _LINE.match(line)
        value = m.group(2) if m else ""
        if value.startswith('"'):
            if len(value) < 2 or not value.endswith('"') or '"' in value[1:-1]:
                m = None
            value = value[1:-1]
        if m is None:
            bad.append((lineno, raw.strip()[:120]))
            continue
        values[m.group(1).lower()] = value
        names[m.group(1).lower()] = m.group(1)
    return OciConf(values, names, tuple(bad))


@dataclass(frozen=True)
class OciLine:
    """One oci.conf line slurmiso relies on, and why."""

    key: str
    value: str
    why: str

    @property
    def text(self) -> str:
        return f'{self.key}="{self.value}"' if " " in self.value or "|" in self.value \
            else f"{self.key}={self.value}"


#: Where the packages install the gate. slurmstepd runs RunTimeRun through /bin/sh with its
#: own PATH, so the line names it in full (``gen oci-conf --gate`` for another install).
GATE = "/usr/bin/slurmiso-oci-gate"
#: Each user's runtime state, as in Slurm's containers guide (``%U``: numeric uid, 23.02+).
STATE_ROOT = "/run/user/%U/"


def runtime_lines(runtime: str, gate: str = GATE, state_root: str = STATE_ROOT) -> List[OciLine]:
    """The runtime's run-mode commands, after Slurm's containers guide (doc/html/
    containers.shtml): rootless, state under /run/user/<uid>, one container per task. crun
    is told to leave cgroups alone, so the container's processes stay in the step's task
    cgroup (Slurm's device, memory and CPU limits, slurmiso's fence and per-job figures);
    runc has no such switch and, rootless without a delegated cgroup, makes none. The run
    command goes through :data:`GATE`."""
    name = "%n.%u.%j.%s.%t"
    base = f"{runtime} --rootless=true --root={state_root}"
    if runtime == "crun":
        base += " --cgroup-manager=disabled"
    why = f"how slurmstepd runs the container ({runtime}, run mode: no polling)"
    if runtime == "crun":
        why = why[:-1] + "; its processes stay in the step's task cgroup, under Slurm's " \
            "limits and slurmiso's fence)"
    return [
        OciLine("RunTimeQuery", f"{base} state {name}", why),
        OciLine("RunTimeKill", f"{base} kill -a {name}", why),
        OciLine("RunTimeDelete", f"{base} delete --force {name}", why),
        OciLine("RunTimeRun", f"exec {gate} %n %b {base} run --bundle %b {name}",
                "slurmiso-oci-gate reads the step's final config.json first and refuses a "
                "container that lacks the TaskProlog's verdict or cannot reach its MPS pipe "
                "directory; otherwise it execs the runtime. 'exec': slurmstepd runs the line "
                "with /bin/sh -c, and a shell left waiting would die of the preemption's "
                "SIGTERM and end the step before the program could checkpoint"),
    ]


def required_lines(runtime: str, gate: str = GATE,
                   state_root: str = STATE_ROOT) -> List[OciLine]:
    """Every oci.conf line slurmiso needs (Slurm 23.02 and later), with its reason."""
    return runtime_lines(runtime, gate, state_root) + [
        OciLine("IgnoreFileConfigJson", "false",
                "slurmstepd writes the step's environment (slurmiso's task-prolog exports) "
                "into the config.json it reads, after the bundle's mounts; with true it "
                "writes no config.json and neither reaches the container"),
        OciLine("EnvExclude", DEFAULT_ENV_EXCLUDE,
                "keeps slurmd's own config out of the container; must never match "
                + NEEDED_ENV_FAMILIES),
    ]


@dataclass(frozen=True)
class Problem:
    """What is wrong in a live oci.conf: the line to add or fix, and why."""

    code: str
    line: str
    why: str


def _excluded(pattern: str) -> Tuple[List[str], bool]:
    """The needed variables ``pattern`` would drop: slurmstepd matches EnvExclude (POSIX
    ERE, regexec) against each NAME=value entry. The flag is False when the pattern uses
    what Python's re reads differently (bracket classes such as [[:alpha:]]) or cannot
    compile at all: then nothing could be checked."""
    import warnings

    if "[:" in pattern or "[=" in pattern or "[." in pattern:
        return [], False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            rx = re.compile(pattern)
    except re.error:
        return [], False
    return [n.name for n in NEEDED_ENV if rx.search(f"{n.name}=0")], True


def gated(run: str) -> bool:
    """RunTimeRun execs the gate, given the node and the bundle (``exec GATE %n %b ...``):
    without ``exec`` the shell slurmstepd runs it with stays the task, and dies of SIGTERM."""
    words = run.split()
    return len(words) > 4 and words[0] == "exec" and \
        words[1].endswith("/slurmiso-oci-gate") and words[2:4] == ["%n", "%b"]


def problems(conf: OciConf, version: Optional[Version], needs_mps: bool,
             runtime: str = "crun") -> List[Problem]:
    """Each slurmiso line a live oci.conf lacks or contradicts (empty: nothing to fix)."""
    out = [Problem("oci-conf-malformed", f"line {n}: {text}",
                   "not Key=Value: slurmstepd cannot parse oci.conf and every --container "
                   "step on the node fails") for n, text in conf.malformed]
    keys = {k.lower() for k in known_keys(version)}
    out += [Problem("oci-conf-unknown-key", f"{conf.names[k]}={conf.values[k]}",
                    "this Slurm's oci.conf parser does not know the key: slurmstepd "
                    "refuses the file") for k in conf.values if k not in keys]
    lines = {ln.key: ln for ln in required_lines(runtime)}
    if not conf.has("RunTimeRun") and not conf.has("RunTimeCreate"):
        out.append(Problem("oci-conf-line", lines["RunTimeRun"].text,
                           "no RunTimeRun or RunTimeCreate: Slurm rejects the file and "
                           "--container runs nothing"))
    elif not gated(conf.get("RunTimeRun")):
        out.append(Problem("oci-conf-gate", lines["RunTimeRun"].text,
                           "RunTimeRun does not start with slurmiso-oci-gate: a container "
                           "whose bundle cannot reach its MPS pipe directory, or that lost "
                           "slurmiso's environment, would run outside its job's share"))
    if conf.get("IgnoreFileConfigJson").lower() in _TRUE:
        out.append(Problem("oci-conf-line", lines["IgnoreFileConfigJson"].text,
                           lines["IgnoreFileConfigJson"].why))
    dropped, compiled = _excluded(conf.get("EnvExclude")) if conf.has("EnvExclude") \
        else ([], True)
    if dropped or not compiled:
        why = (f"EnvExclude drops {', '.join(dropped)} from the container's environment"
               if dropped else "EnvExclude is not a regular expression slurmiso can read, "
               "so it may drop slurmiso's variables")
        out.append(Problem("oci-conf-env", lines["EnvExclude"].text,
                           why + (" (the MPS pipe directory among them)" if needs_mps and
                                  "CUDA_MPS_PIPE_DIRECTORY" in dropped else "")))
    return out


def render_oci_conf(roots: Sequence[BindRoot], runtime: str, source: str,
                    notes: Sequence[str] = (), gate: str = GATE,
                    state_root: str = STATE_ROOT) -> str:
    """oci.conf with every line's reason, and the config.json mounts oci.conf cannot say."""
    import json

    out = comment("oci.conf for Slurm's --container support (Slurm 23.02 or later), with the "
                  "lines slurmiso relies on. Install next to slurm.conf on every node; "
                  "'slurmiso doctor' checks it.")
    out += comment(f"generated by 'slurmiso gen oci-conf' from {source}; regenerate, do not "
                   "edit")
    last_why = ""
    for ln in required_lines(runtime, gate, state_root):
        if ln.why != last_why:
            out += [""] + comment(ln.why)
        out.append(ln.text)
        last_why = ln.why
    out += [""] + comment(
        "Environment: no line to add. From 23.02 slurmstepd writes the step's whole "
        "environment, after GRES and the TaskProlog, into the container's process.env, "
        "minus what EnvExclude matches. slurmiso needs these there: "
        + ", ".join(n.name for n in NEEDED_ENV) + " (NVIDIA_VISIBLE_DEVICES, the job's "
        "device UUIDs or void, is what NVIDIA's container hooks read).")
    out += [""] + comment(
        "oci.conf has no bind-mount parameter (oci.conf(5): none in 22.05; from 23.02 to "
        "26.05 only MountSpoolDir, for Slurm's own spool directory). slurmstepd keeps the bundle's "
        "config.json 'mounts' and appends its own after them, so every bundle run on a "
        "slurmiso node must carry these entries in its config.json ('slurmiso gen oci-conf "
        "--config-json' prints them as JSON):")
    if not roots:
        out.append("#   (none: no mps pool and no --ckpt-root)")
    for r in roots:
        out += comment(r.why + ":")
        out.append(f"#   {json.dumps(config_json_mounts([r])[0])}")
    for note in notes:
        out += [""] + comment(note)
    return "\n".join(out) + "\n"
