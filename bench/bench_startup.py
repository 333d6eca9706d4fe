"""Start-up cost of the CLI and of the hook executables vs a bare interpreter.

Hooks run on every job start as separate processes, so their import cost is paid per job.
Target (issue: foundation): hook start-up <= 3x ``python3 -c pass``.
"""

from __future__ import annotations

import sys

from common import interleaved, median_ms, python_env, report

RUNS = 20


def main() -> bool:
    py = sys.executable
    times = interleaved(
        {
            "bare": [py, "-c", "pass"],
            "version": [py, "-m", "slurmiso", "--version"],
            "prolog": [py, "-m", "slurmiso.hooks.prolog", "--help"],
            "task": [
                py,
                "-c",
                "import slurmiso.hooks.task_prolog, slurmiso.config, slurmiso.state",
            ],
        },
        RUNS,
        python_env(),
    )
    base = median_ms(times["bare"])
    print(f"baseline: python3 -c pass, median of {RUNS}: {base:.1f} ms")
    ok = report(
        "slurmiso --version",
        f"{median_ms(times['version']):.1f} ms",
        median_ms(times["version"]) / base,
        "of bare start-up",
    )
    ok &= report(
        "slurmiso-prolog --help (hook start-up)",
        f"{median_ms(times['prolog']):.1f} ms",
        median_ms(times["prolog"]) / base,
        "of bare start-up",
        3.0,
    )
    report(
        "task prolog imports",
        f"{median_ms(times['task']):.1f} ms",
        median_ms(times["task"]) / base,
        "of bare start-up",
    )
    return ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
