"""The one definition of what a user may pass in slurmiso's SPANK options.

Three places check a user's ``--iso-*`` values and must agree byte for byte: the SPANK plugin
(``sbatch``, advisory), ``job_submit.lua`` (slurmctld, trusted) and the Prolog (root, last
line). The limits below are the single source: :func:`lua_limits` feeds the ``SLURMISO``
table of the generated Lua, :func:`render_c_header` writes ``spank/slurmiso_limits.h``, and
:func:`problem` is what the Prolog runs. Each rule is written so that all three can apply it
with integer arithmetic on bytes (no regex engine, no floats, no locale).

Stdlib only: the Prolog imports this on every job start.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

from slurmiso.classname import CLASS_CHARS, CLASS_FIRST, CLASS_MAX_LEN, class_name_problem

#: The options, as the Prolog names them (``--iso-mps-mem`` -> ``iso_mps_mem``).
OPTIONS: Tuple[str, ...] = (
    "iso_class", "iso_mps_mem", "iso_mig_profile", "iso_ckpt_dir", "iso_metrics")

#: ``--iso-mps-mem``: DIGITS[.FRACTION][K|M|G|T][B|iB], at most 1 TiB, at least 1 MiB.
SIZE_MAX_LEN = 16
SIZE_MAX_INT_DIGITS = 7
SIZE_MAX_FRAC_DIGITS = 3
SIZE_MIN_MIB = 1
SIZE_MAX_MIB = 1024 * 1024
#: MiB per unit, times 1024 so that K is whole: K=1, M=1024, G=1024^2, T=1024^3.
SIZE_UNITS_KIB: Dict[str, int] = {"K": 1, "M": 1024, "G": 1024**2, "T": 1024**3}

#: ``--iso-mig-profile``: <1-7>g.<1-4 digits>gb[+me], then it must be a profile the cluster has.
PROFILE_MAX_LEN = 16
PROFILE_MAX_MEM_DIGITS = 4

#: ``--iso-ckpt-dir``: absolute, no ``..`` component, only these characters (no spaces,
#: quotes, shell metacharacters, control bytes or non-ASCII).
DIR_MAX_LEN = 1024
DIR_CHARS = (
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789" "/._-+@%,="
)

#: ``--iso-metrics``: PORT[/PATH], the job's own Prometheus endpoint, which the node's agent
#: reads at 127.0.0.1:PORT only. PORT 1024..65535 without leading zeros; PATH starts with
#: "/", at most 64 characters of these (no query, no spaces, no "%").
METRICS_PORT_MIN = 1024
METRICS_PORT_MAX = 65535
METRICS_PATH_MAX_LEN = 64
METRICS_PATH_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789/_.-"
METRICS_DEFAULT_PATH = "/metrics"


def show(value: str, limit: int = 40) -> str:
    """``value`` as one printable ASCII line for a message (hostile input stays inert)."""
    out = []
    for ch in value[:limit]:
        out.append(ch if " " <= ch <= "~" and ch != "\\" else ch.encode("unicode_escape").decode())
    return "".join(out) + ("..." if len(value) > limit else "")


def size_mib(text: str) -> int:
    """MiB of a ``--iso-mps-mem`` value, rounded up; ValueError if it breaks a rule.

    Integer arithmetic in thousandths of the unit, as the Lua and C checks do it.
    """
    if not text or len(text) > SIZE_MAX_LEN:
        raise ValueError(f"must be 1 to {SIZE_MAX_LEN} characters")
    i = 0
    while i < len(text) and "0" <= text[i] <= "9":
        i += 1
    whole = text[:i]
    if not whole or len(whole) > SIZE_MAX_INT_DIGITS:
        raise ValueError(f"must start with 1 to {SIZE_MAX_INT_DIGITS} digits")
    frac = ""
    if i < len(text) and text[i] == ".":
        j = i + 1
        while j < len(text) and "0" <= text[j] <= "9":
            j += 1
        frac = text[i + 1 : j]
        if not frac or len(frac) > SIZE_MAX_FRAC_DIGITS:
            raise ValueError(f"needs 1 to {SIZE_MAX_FRAC_DIGITS} digits after the point")
        i = j
    unit = "M"
    if i < len(text) and text[i] in SIZE_UNITS_KIB:
        unit = text[i]
        i += 1
    if text[i:] not in ("", "B", "iB"):
        raise ValueError("unit must be K, M, G or T, optionally followed by B or iB")
    milli = int(whole) * 1000 + int((frac + "000")[:3])
    scaled = milli * SIZE_UNITS_KIB[unit]  # thousandths of a KiB
    return -(-scaled // (1000 * 1024))


def metrics_endpoint(value: str) -> Tuple[int, str]:
    """(port, path) of a ``--iso-metrics`` value; ValueError saying which rule it breaks."""
    port_text, slash, rest = value.partition("/")
    if not 4 <= len(port_text) <= 5 or not all("0" <= ch <= "9" for ch in port_text) or (
            port_text[0] == "0"):
        raise ValueError(f"must start with a port of {METRICS_PORT_MIN} to "
                         f"{METRICS_PORT_MAX} (digits, no leading zero)")
    port = int(port_text)
    if not METRICS_PORT_MIN <= port <= METRICS_PORT_MAX:
        raise ValueError(f"port must be {METRICS_PORT_MIN} to {METRICS_PORT_MAX}")
    path = slash + rest
    if len(path) > METRICS_PATH_MAX_LEN or any(ch not in METRICS_PATH_CHARS for ch in path):
        raise ValueError(f"the path must be '/' and at most {METRICS_PATH_MAX_LEN - 1} of "
                         "letters, digits, / _ . -")
    return port, path or METRICS_DEFAULT_PATH


def _class_problem(value: str, classes: Optional[Iterable[str]]) -> Optional[str]:
    bad = class_name_problem(value)
    if bad:
        return bad
    if classes is not None and value not in classes:
        return f"is not a job class of this cluster (allowed: {', '.join(classes)})"
    return None


def _profile_problem(value: str, profiles: Optional[Iterable[str]]) -> Optional[str]:
    shape = "must look like <1-7>g.<memory>gb[+me], e.g. 3g.40gb"
    if not 1 <= len(value) <= PROFILE_MAX_LEN or len(value) < 6:
        return shape
    if value[0] not in "1234567" or value[1:3] != "g.":
        return shape
    i = 3
    while i < len(value) and "0" <= value[i] <= "9":
        i += 1
    if not 1 <= i - 3 <= PROFILE_MAX_MEM_DIGITS or value[i:] not in ("gb", "gb+me"):
        return shape
    if profiles is not None and value not in profiles:
        return f"is not a MIG profile of this cluster's GPUs (allowed: {', '.join(profiles)})"
    return None


def _dir_problem(value: str) -> Optional[str]:
    if not 1 <= len(value) <= DIR_MAX_LEN:
        return f"must be 1 to {DIR_MAX_LEN} characters"
    if value[0] != "/":
        return "must be an absolute path"
    if any(ch not in DIR_CHARS for ch in value):
        return "may hold only letters, digits and / . _ - + @ % , ="
    if ".." in value.split("/"):
        return "may not have a '..' component"
    return None


def problem(
    name: str,
    value: str,
    classes: Optional[Iterable[str]] = None,
    profiles: Optional[Iterable[str]] = None,
) -> Optional[str]:
    """Why ``--<name>=<value>`` is refused, as one line naming the fix; None if it is fine.

    ``classes``/``profiles`` are the allow-lists (None: check the form only, as the SPANK
    plugin does without plugstack arguments).
    """
    why: Optional[str]
    if name == "iso_class":
        why = _class_problem(value, list(classes) if classes is not None else None)
    elif name == "iso_mps_mem":
        try:
            mib = size_mib(value)
        except ValueError as exc:
            why = f"is not a size ({exc}; e.g. 8G, 8GiB, 512M)"
        else:
            ok = SIZE_MIN_MIB <= mib <= SIZE_MAX_MIB
            why = None if ok else f"must be between {SIZE_MIN_MIB}M and {SIZE_MAX_MIB // 1024}G"
    elif name == "iso_mig_profile":
        why = _profile_problem(value, list(profiles) if profiles is not None else None)
    elif name == "iso_ckpt_dir":
        why = _dir_problem(value)
    elif name == "iso_metrics":
        try:
            metrics_endpoint(value)
            why = None
        except ValueError as exc:
            why = f"is not PORT[/PATH] ({exc}; e.g. 8000 or 8000/metrics)"
    else:
        return f"--{name.replace('_', '-')} is not a slurmiso option"
    if why is None:
        return None
    return f"--{name.replace('_', '-')}={show(value)} {why}"


def lua_limits() -> Dict[str, object]:
    """The limits for the ``SLURMISO`` table of job_submit.lua (see data/job_submit.lua)."""
    return {
        "class_max_len": CLASS_MAX_LEN,
        "size_max_len": SIZE_MAX_LEN,
        "size_max_int_digits": SIZE_MAX_INT_DIGITS,
        "size_max_frac_digits": SIZE_MAX_FRAC_DIGITS,
        "size_min_mib": SIZE_MIN_MIB,
        "size_max_mib": SIZE_MAX_MIB,
        "size_units_kib": dict(SIZE_UNITS_KIB),
        "profile_max_len": PROFILE_MAX_LEN,
        "profile_max_mem_digits": PROFILE_MAX_MEM_DIGITS,
        "dir_max_len": DIR_MAX_LEN,
        "metrics_port_min": METRICS_PORT_MIN,
        "metrics_port_max": METRICS_PORT_MAX,
        "metrics_path_max_len": METRICS_PATH_MAX_LEN,
    }


def _c_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_c_header() -> str:
    """``spank/slurmiso_limits.h``: the same limits for the C plugin (golden-tested)."""
    defines = [
        ("SLURMISO_CLASS_MAX_LEN", str(CLASS_MAX_LEN)),
        ("SLURMISO_CLASS_FIRST", _c_string(CLASS_FIRST)),
        ("SLURMISO_CLASS_CHARS", _c_string(CLASS_CHARS)),
        ("SLURMISO_SIZE_MAX_LEN", str(SIZE_MAX_LEN)),
        ("SLURMISO_SIZE_MAX_INT_DIGITS", str(SIZE_MAX_INT_DIGITS)),
        ("SLURMISO_SIZE_MAX_FRAC_DIGITS", str(SIZE_MAX_FRAC_DIGITS)),
        ("SLURMISO_SIZE_MIN_MIB", f"{SIZE_MIN_MIB}ULL"),
        ("SLURMISO_SIZE_MAX_MIB", f"{SIZE_MAX_MIB}ULL"),
        ("SLURMISO_PROFILE_MAX_LEN", str(PROFILE_MAX_LEN)),
        ("SLURMISO_PROFILE_MAX_MEM_DIGITS", str(PROFILE_MAX_MEM_DIGITS)),
        ("SLURMISO_DIR_MAX_LEN", str(DIR_MAX_LEN)),
        ("SLURMISO_DIR_CHARS", _c_string(DIR_CHARS)),
        ("SLURMISO_METRICS_PORT_MIN", str(METRICS_PORT_MIN)),
        ("SLURMISO_METRICS_PORT_MAX", str(METRICS_PORT_MAX)),
        ("SLURMISO_METRICS_PATH_MAX_LEN", str(METRICS_PATH_MAX_LEN)),
        ("SLURMISO_METRICS_PATH_CHARS", _c_string(METRICS_PATH_CHARS)),
    ]
    units = ", ".join(f"{SIZE_UNITS_KIB[u]}ULL" for u in "KMGT")
    body = "".join(f"#define {name} {value}\n" for name, value in defines)
    return (
        "/* Generated from slurmiso/submit/options.py (python3 -m slurmiso.submit.options >\n"
        " * spank/slurmiso_limits.h); do not edit. job_submit.lua and the Prolog apply the same\n"
        " * limits; tests/unit/test_option_validator.py checks this file is current. */\n"
        "#ifndef SLURMISO_LIMITS_H\n#define SLURMISO_LIMITS_H\n\n" + body
        + '#define SLURMISO_SIZE_UNITS "KMGT"\n'
        + f"#define SLURMISO_SIZE_UNITS_KIB {{ {units} }}\n"
        + "\n#endif\n"
    )


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_c_header())
