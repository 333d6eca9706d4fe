"""Build hook: copy the shipped files under etc/ and spank/ into the package as data.

etc/ stays the one source an admin reads in the tree; wheels get a copy under
slurmiso/data/ so 'slurmiso gen config|systemd|cron' and the SPANK source work from a pip
install (slurmiso.install.asset_path finds either). Metadata lives in setup.cfg.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
#: source (relative to the tree) -> destination under slurmiso/data/
SHIPPED = {
    "etc/slurmiso.yaml": "etc/slurmiso.yaml",
    "etc/systemd/slurmiso-monitor.service": "etc/systemd/slurmiso-monitor.service",
    "etc/systemd/slurmiso-agent.service": "etc/systemd/slurmiso-agent.service",
    "etc/cron.d/slurmiso-audit": "etc/cron.d/slurmiso-audit",
    "etc/logrotate.d/slurmiso": "etc/logrotate.d/slurmiso",
    "etc/plugstack.conf.d/slurmiso.conf": "etc/plugstack.conf.d/slurmiso.conf",
    "etc/grafana/slurmiso.json": "etc/grafana/slurmiso.json",
    "spank/slurmiso_spank.c": "spank/slurmiso_spank.c",
    "spank/Makefile": "spank/Makefile",
}


class BuildWithShippedFiles(build_py):
    def run(self) -> None:
        super().run()
        for src, dst in SHIPPED.items():
            target = os.path.join(self.build_lib, "slurmiso", "data", dst)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copyfile(os.path.join(HERE, src), target)


setup(cmdclass={"build_py": BuildWithShippedFiles})
