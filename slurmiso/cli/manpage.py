"""Man pages and bash completion, generated from the argparse definitions and the config schema.

Nothing here is kept by hand: ``slurmiso(1)`` walks :func:`slurmiso.cli.main.build_parser`,
``slurmiso.yaml(5)`` records every key the strict loader reads while it parses the shipped
example (so a key added to the loader appears without anyone editing a page) and takes each
key's comment from that example, and ``slurmiso-prolog(8)`` renders the hooks' own ``--help``.
The packages run ``slurmiso gen man`` at build time; tests check every subcommand and key is
covered.
"""

from __future__ import annotations

import argparse
import re
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Tuple

from slurmiso import __version__

DATE = "2026"
Command = Tuple[str, argparse.ArgumentParser]  # ("gen slurm-conf", its parser)


# ---------------------------------------------------------------------------- roff helpers
def roff(text: str) -> str:
    """Escape text for roff: backslashes, and lines that would read as requests."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = "".join(c if ord(c) < 128 else f"\\[u{ord(c):04X}]" for c in text)
    return "\n".join("\\&" + ln if ln.startswith((".", "'")) else ln for ln in text.split("\n"))


def _header(name: str, section: str, title: str) -> List[str]:
    return [f'.TH "{name.upper()}" "{section}" "{DATE}" "slurmiso {__version__}" "{title}"']


def _paragraphs(text: str) -> List[str]:
    """argparse text (maybe pre-formatted) as roff: indented blocks kept verbatim."""
    out: List[str] = []
    for block in re.split(r"\n\s*\n", text.strip()):
        if any(ln.startswith("  ") for ln in block.splitlines()):
            out += [".nf", roff(block), ".fi"]
        else:
            out += [".PP", roff(" ".join(block.split()))]
    return out


# --------------------------------------------------------------------------- the CLI walk
def commands(parser: Optional[argparse.ArgumentParser] = None, prefix: str = "") -> List[Command]:
    """Every subcommand, depth first: [("check-config", p), ("gen", p), ("gen man", p), ...]."""
    if parser is None:
        from slurmiso.cli.main import build_parser

        parser = build_parser()
    out: List[Command] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for name, child in action.choices.items():
                if id(child) in seen:
                    continue  # an alias
                seen.add(id(child))
                path = f"{prefix} {name}".strip()
                out.append((path, child))
                out += commands(child, path)
    return out


def options(parser: argparse.ArgumentParser) -> List[argparse.Action]:
    return [a for a in parser._actions
            if a.option_strings and a.help != argparse.SUPPRESS
            and not isinstance(a, argparse._SubParsersAction)]


def _option_label(a: argparse.Action) -> str:
    flags = ", ".join(f"\\fB{roff(s)}\\fR" for s in a.option_strings)
    if a.nargs == 0:
        return flags
    metavar = a.metavar or a.dest.upper()
    return f"{flags} \\fI{roff(str(metavar))}\\fR"


def _option_lines(parser: argparse.ArgumentParser) -> List[str]:
    out: List[str] = []
    for a in options(parser):
        help_text = (a.help or "").replace("%(default)s", str(a.default))
        out += [".TP", _option_label(a), roff(" ".join(help_text.split()))]
    for a in parser._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction):
            out += [".TP", f"\\fI{roff(str(a.metavar or a.dest))}\\fR",
                    roff(" ".join((a.help or "").split()))]
    return out


def slurmiso_1() -> str:
    """slurmiso(1): global options, then every subcommand with its options and examples."""
    from slurmiso.cli.main import build_parser
    from slurmiso.errors import EXIT_CODES

    parser = build_parser()
    lines = _header("slurmiso", "1", "slurmiso manual")
    lines += [".SH NAME", "slurmiso \\- job classes, per-job GPU isolation and checkpoint on "
              "preemption for Slurm", ".SH SYNOPSIS",
              "\\fBslurmiso\\fR [\\fB\\-c\\fR \\fIPATH\\fR] [\\fB\\-v\\fR] \\fICOMMAND\\fR "
              "[\\fIOPTIONS\\fR]", ".SH DESCRIPTION"]
    lines += _paragraphs(parser.description or "")
    lines += _paragraphs("Run with no command, slurmiso prints its help and exits 0: a bare "
                         "call is a question, answered like --help. '-c PATH' is accepted "
                         "before or after the command.")
    lines += [".SH OPTIONS"] + _option_lines(parser)
    lines += [".SH COMMANDS"]
    for path, sub in commands(parser):
        lines += [".SS " + roff(f"slurmiso {path}"), ".PP", roff(sub.format_usage().strip())]
        lines += _paragraphs(sub.description or "")
        lines += _option_lines(sub)
        if sub.epilog:
            lines += _paragraphs(sub.epilog)
    lines += [".SH EXIT STATUS", "0 success."]
    for cls, code in sorted(EXIT_CODES.items(), key=lambda kv: kv[1]):
        doc = (cls.__doc__ or cls.__name__).strip().splitlines()[0]
        lines += [".br", roff(f"{code} {cls.__name__}: {doc}")]
    lines += [".br", "130 interrupted."]
    lines += [".SH ENVIRONMENT", ".TP", "\\fBSLURMISO_CONFIG\\fR",
              "config file when \\-c is not given",
              ".TP", "\\fBSLURMISO_SLURM_BIN\\fR",
              "directories searched for Slurm commands before \\fBPATH\\fR and /usr/bin",
              ".TP", "\\fBSLURMISO_GPU_BACKEND\\fR", "auto, nvml or sim; overrides gpu.backend",
              ".SH FILES", ".TP", "/etc/slurmiso/slurmiso.yaml",
              "the configuration, see \\fBslurmiso.yaml\\fR(5)",
              ".SH SEE ALSO", "\\fBslurmiso.yaml\\fR(5), \\fBslurmiso\\-prolog\\fR(8), "
              "\\fBslurm.conf\\fR(5), \\fBsbatch\\fR(1); /usr/share/doc/slurmiso/admin-guide.md"]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------- config schema
@contextmanager
def _recording(keys: Dict[str, Dict[str, Any]]) -> Iterator[None]:
    """While active, every key the loader reads is noted with its default and limits."""
    from slurmiso.config import loader

    section = loader.Section
    saved = {n: getattr(section, n) for n in ("raw", "text", "integer")}

    def norm(path: str) -> str:
        path = re.sub(r"\[\d+\]", "[]", path)
        return re.sub(r"(mig-configs)\.[^.\[]+", r"\1.NAME", path)

    def raw(self: Any, name: str, default: Any = loader.MISSING) -> Any:
        keys.setdefault(norm(self.key(name)), {}).setdefault(
            "default", None if default is loader.MISSING else default)
        return saved["raw"](self, name, default)

    def text(self: Any, name: str, default: Any = loader.MISSING, allowed: Any = ()) -> Any:
        if allowed:
            keys.setdefault(norm(self.key(name)), {})["allowed"] = ", ".join(allowed)
        return saved["text"](self, name, default, allowed)

    def integer(self: Any, name: str, default: Any, lo: int, hi: int) -> Any:
        keys.setdefault(norm(self.key(name)), {})["allowed"] = f"{lo}..{hi}"
        return saved["integer"](self, name, default, lo, hi)

    try:
        for n, f in (("raw", raw), ("text", text), ("integer", integer)):
            setattr(section, n, f)
        yield
    finally:
        for n, f in saved.items():
            setattr(section, n, f)


def example_comments(text: str) -> Dict[str, str]:
    """Key path -> its comment in the annotated example (trailing, else the lines above)."""
    out: Dict[str, str] = {}
    stack: List[Tuple[int, str]] = []
    above: List[str] = []
    for line in text.splitlines():
        m = re.match(r"^(\s*)(- )?([A-Za-z_][\w.+-]*):(.*)$", line)
        if not m:
            stripped = line.strip()
            above = above + [stripped.lstrip("# ")] if stripped.startswith("#") else []
            continue
        if not stack and not out:
            above = []  # the file's header is about the file, not its first key
        lead, dash, key, rest = len(m.group(1)), m.group(2), m.group(3), m.group(4)
        key_indent = lead + (2 if dash else 0)
        while stack and stack[-1][0] >= (lead if dash else key_indent):
            stack.pop()
        if dash:
            stack.append((lead, "[]"))
        stack.append((key_indent, key))
        path = ""
        for _, k in stack:
            path += k if k == "[]" or not path else "." + k
        comment = rest.split("#", 1)[1].strip() if "#" in rest else " ".join(above)
        if comment and path not in out:
            out[path] = comment
        above = []
    return out


def config_schema() -> List[Tuple[str, Dict[str, Any]]]:
    """Every key the loader accepts, in the order it reads them, with default/allowed/comment."""
    import yaml

    from slurmiso.config.loader import parse_config
    from slurmiso.install import asset_text

    text = asset_text("slurmiso.yaml")
    keys: Dict[str, Dict[str, Any]] = {}
    with _recording(keys):
        parse_config(yaml.safe_load(text), "slurmiso.yaml")
    comments = example_comments(text)
    for path, info in keys.items():
        info["comment"] = comments.get(re.sub(r"mig-configs\.NAME", "mig-configs.", path), "")
        if not info["comment"] and "mig-configs.NAME" in path:
            tail = path.split("mig-configs.NAME", 1)[1]
            info["comment"] = next((c for p, c in comments.items()
                                    if "mig-configs." in p and p.endswith(tail)), "")
    return list(keys.items())


def slurmiso_yaml_5() -> str:
    lines = _header("slurmiso.yaml", "5", "slurmiso manual")
    lines += [".SH NAME", "slurmiso.yaml \\- slurmiso configuration file",
              ".SH DESCRIPTION",
              ".PP", "YAML read strictly by every slurmiso command and hook: unknown keys, wrong "
              "types and cross\\-field conflicts are all reported at once by "
              "\\fBslurmiso check\\-config\\fR, each with file, key path, bad value and what "
              "is allowed. Found at \\fB\\-c\\fR, \\fB$SLURMISO_CONFIG\\fR or "
              "/etc/slurmiso/slurmiso.yaml. \\fBslurmiso gen config\\fR writes the annotated "
              "example. Durations: 90s, 5m, 2h, 1d or D\\-HH:MM:SS; sizes: 20G, 512M.",
              ".PP", "Key paths: a.b is key b inside mapping a; a[] is each item of list a; "
              "mig\\-configs.NAME is a layout name of your choice.",
              ".SH KEYS"]
    for path, info in config_schema():
        lines += [".TP", f"\\fB{roff(path)}\\fR"]
        body = []
        if info.get("comment"):
            body.append(info["comment"])
        if info.get("allowed"):
            body.append(f"Allowed: {info['allowed']}.")
        default = info.get("default")
        if default not in (None, "", [], {}, ()):
            body.append(f"Default: {default}.")
        lines.append(roff(" ".join(body) or "See the annotated example."))
    lines += [".SH FILES", "/etc/slurmiso/slurmiso.yaml",
              ".SH SEE ALSO", "\\fBslurmiso\\fR(1), \\fBslurmiso\\-prolog\\fR(8)"]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- the hooks
def slurmiso_prolog_8() -> str:
    from slurmiso.hooks.prolog import USAGE

    lines = _header("slurmiso-prolog", "8", "slurmiso manual")
    lines += [".SH NAME", "slurmiso\\-prolog, slurmiso\\-epilog, slurmiso\\-task\\-prolog, "
              "slurmiso\\-oci\\-gate \\- "
              "slurmiso's Slurm hooks", ".SH SYNOPSIS",
              "In slurm.conf(5):", ".nf", "Prolog=/usr/bin/slurmiso\\-prolog",
              "Epilog=/usr/bin/slurmiso\\-epilog", "TaskProlog=/usr/bin/slurmiso\\-task\\-prolog",
              "PrologFlags=Alloc", ".fi",
              ".PP", "(pip installs: the scripts directory of the environment; "
              "\\fBslurmiso gen slurm\\-conf\\fR prints the right lines.)"]
    for phase in ("prolog", "epilog"):
        lines += [".SH " + phase.upper()] + _paragraphs(USAGE[phase].split("\n", 2)[2])
    lines += [".SH TASK PROLOG", ".PP", roff(
        "slurmiso-task-prolog runs as the job's user before each task. It prints 'export' "
        "lines (MIG UUID in CUDA_VISIBLE_DEVICES, MPS pipe directory, limits) that slurmd "
        "puts into the task's environment; for a refused job it hides the GPUs and prints "
        "why, so the job fails alone and the node stays up.")]
    lines += [".SH OCI GATE", ".PP", roff(
        "slurmiso-oci-gate NODE BUNDLE RUNTIME... stands in front of the OCI runtime in "
        "oci.conf's RunTimeRun (slurmiso gen oci-conf writes the line). As the job's user it "
        "reads the config.json slurmstepd wrote for the step and refuses, with one line on "
        "the task's stderr, a container whose environment lacks the TaskProlog's verdict or "
        "whose MPS pipe directory is not bound from the same host path; otherwise it execs "
        "the runtime.")]
    lines += [".SH FAILURE SEMANTICS", ".PP", roff(
        "Slurm drains a node whose Prolog or Epilog exits non-zero. slurmiso exits non-zero "
        "only for a node fault (NVML unreachable, GPU lost, MIG state not as recorded, a broken "
        "config), with a one-line reason in 'sinfo -R'. A job problem refuses that job alone.")]
    lines += [".SH FILES", "/etc/slurmiso/slurmiso.yaml, /run/slurmiso (records), "
              "/var/log/slurmiso/NODE.jsonl (journal, one per node)",
              ".SH SEE ALSO", "\\fBslurmiso\\fR(1), \\fBslurmiso.yaml\\fR(5), "
              "\\fBslurm.conf\\fR(5)"]
    return "\n".join(lines) + "\n"


def all_pages() -> Dict[str, str]:
    """File name -> roff source; the epilog and task-prolog pages point at the prolog's."""
    return {
        "slurmiso.1": slurmiso_1(),
        "slurmiso.yaml.5": slurmiso_yaml_5(),
        "slurmiso-prolog.8": slurmiso_prolog_8(),
        "slurmiso-epilog.8": ".so man8/slurmiso-prolog.8\n",
        "slurmiso-task-prolog.8": ".so man8/slurmiso-prolog.8\n",
        "slurmiso-oci-gate.8": ".so man8/slurmiso-prolog.8\n",
    }


# --------------------------------------------------------------------------- completion
def bash_completion() -> str:
    """A bash completion script for slurmiso and the hooks, from the parser tree."""
    from slurmiso.cli.main import build_parser

    parser = build_parser()
    tree: Dict[str, List[str]] = {}

    def words(p: argparse.ArgumentParser) -> List[str]:
        out = [s for a in options(p) for s in a.option_strings]
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                out = list(action.choices) + out
        return out

    tree[""] = words(parser)
    for path, sub in commands(parser):
        tree[path] = words(sub)
    paths = "|".join(f'"{p}"' for p in tree if p)
    cases = "\n".join(f'        "{p}") words="{" ".join(w)}" ;;' for p, w in tree.items())
    return f"""# bash completion for slurmiso {__version__}, from 'slurmiso gen completion'
_slurmiso() {{
    local cur="${{COMP_WORDS[COMP_CWORD]}}" path="" w i words=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        case "${{path:+$path }}$w" in
            {paths}) path="${{path:+$path }}$w" ;;
        esac
    done
    case "$path" in
{cases}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
complete -o default -F _slurmiso slurmiso
complete -W "--help" slurmiso-prolog slurmiso-epilog slurmiso-task-prolog slurmiso-oci-gate
"""
