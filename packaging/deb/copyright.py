"""Print the Debian copyright file (DEP-5): slurmiso, and pynvml when its path is given."""

import sys

HEAD = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: slurmiso
Source: the slurmiso source tree (sdist: python3 setup.py sdist)

Files: *
Copyright: slurmiso authors
License: Apache-2.0
 On Debian systems the full text of the Apache License 2.0 is in
 /usr/share/common-licenses/Apache-2.0; the sdist and wheel carry it as LICENSE.
"""


def pynvml_block(path: str) -> str:
    """The BSD header of the vendored pynvml.py (nvidia-ml-py), as a Files: paragraph."""
    lines = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            lines.append(line.lstrip("#").rstrip())
    text = [ln.strip() for ln in lines if ln.strip()]
    copyright_line = next(ln for ln in text if ln.startswith("Copyright"))
    body = "\n".join(" " + (ln or ".") for ln in text if ln != copyright_line)
    return ("\nFiles: usr/lib/slurmiso/python/pynvml.py\n"
            f"Copyright: {copyright_line[len('Copyright'):].strip()}\n"
            "License: BSD-3-Clause\n"
            f"{body}\n")


if __name__ == "__main__":
    sys.stdout.write(HEAD + (pynvml_block(sys.argv[1]) if len(sys.argv) > 1 else ""))
