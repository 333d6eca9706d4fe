# slurmiso — developer and CI entry points. Everything a target needs, it installs.
#   make test    install, bring up the local Slurm sandbox, run unit + integration tests
#   make demo    install, bring up the sandbox, run a short mixed inference/training scenario
#   make bench   benchmarks; each prints its figure and a ratio to a baseline run beside it
#   make unit    fast unit tests only (no Slurm, no root, no browser)
#   make lint    ruff + mypy
#   make deb     Debian packages into dist/deb (packaging/deb/build.sh)
#   make rpm     EL9 RPMs into dist/rpm (packaging/rpm/build.sh; built here, not EL9-tested)
#   make gpu-check  on a machine with an NVIDIA GPU, first: tests/nvml, slurmiso's MPS daemon
#                with a class's limits, slurmiso probe --local (8 min at most; never changes MIG
#                or compute mode); JSON + text summary into $$OUT or ./gpu-check-out
#   make package-test  build the .debs, install them with no network into clean Debian 12
#                and 13 roots (debootstrap, cached in /var/cache/slurmiso-dev/roots), check, purge

PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PYTEST_ARGS ?=
# What `make integration` runs (a release's subset in CI: see .ci/run)
INTEGRATION ?= tests/integration
# Slurm release for the sandbox (22.05, 24.11, 26.05; empty: the host's own). A release the
# host lacks runs from a cached Debian root: make test SLURM=24.11, make demo SLURM=26.05.
SLURM ?=
SLURM_ARG = $(if $(SLURM),--slurm $(SLURM))
# cgroup version of the sandbox's Slurm (v1, v2; empty: the host's, v1 on a hybrid host).
# v2 on a hybrid host runs the daemons in a mount namespace with cgroup2 at /sys/fs/cgroup, in
# its own dir (/var/lib/slurmiso-sbx-<release>-v2): make test SLURM=26.05 CGROUP=v2
CGROUP ?=
CGROUP_ARG = $(if $(CGROUP),--cgroup $(CGROUP))
V2_SUFFIX = $(if $(filter v2,$(CGROUP)),-v2)
# Extra 'sandbox up' arguments. It refuses a host whose Slurm or munge setup it did not create;
# SANDBOX_UP_ARGS=--force runs anyway once and records it as the sandbox's (README).
SANDBOX_UP_ARGS ?=
export SLURMISO_SANDBOX_SLURM = $(SLURM)
export SLURMISO_SANDBOX_CGROUP = $(CGROUP)
ifneq ($(SLURM),)
export SLURMISO_SANDBOX_DIR ?= /var/lib/slurmiso-sbx-$(SLURM)$(V2_SUFFIX)
else ifneq ($(V2_SUFFIX),)
export SLURMISO_SANDBOX_DIR ?= /var/lib/slurmiso-sandbox$(V2_SUFFIX)
endif

.PHONY: all install sandbox sandbox-down test unit integration demo bench lint clean deb rpm \
	package-test gpu-check

all: test

install:
	$(PIP) install --quiet --disable-pip-version-check -e '.[test]'

sandbox: install
	$(PYTHON) -m slurmiso -v sandbox up $(SLURM_ARG) $(CGROUP_ARG) $(SANDBOX_UP_ARGS)

sandbox-down:
	$(PYTHON) -m slurmiso sandbox down

unit: install
	sh tests/tools/install-promtool.sh
	$(PYTHON) -m pytest tests/unit $(PYTEST_ARGS)

integration: sandbox
	$(PYTHON) -m pytest $(INTEGRATION) $(PYTEST_ARGS)

# One pytest run over everything, so CI's closing line counts all tests: unit, integration and
# the report in a real browser (tests/browser, Chromium). The nvml tests skip (with their
# reason) where no NVIDIA driver is present.
test: sandbox
	sh tests/tools/install-chromium.sh
	sh tests/tools/install-promtool.sh
	$(PYTHON) -m pytest tests $(PYTEST_ARGS)

demo: sandbox
	$(PYTHON) -m slurmiso sandbox demo

# One prepared script, no install step (a GPU session's minutes are few): the checkout's own
# slurmiso, read-only NVML, MPS daemons it starts and stops itself.
gpu-check:
	timeout 480 $(PYTHON) tests/gpu/gpu_check.py --out "$${OUT:-gpu-check-out}"

bench: install
	$(PYTHON) bench/run.py

lint: install
	$(PYTHON) -m ruff check slurmiso slurmiso_sandbox tests bench
	$(PYTHON) -m mypy

deb:
	sh packaging/deb/build.sh

rpm:
	sh packaging/rpm/build.sh

package-test: deb
	bash packaging/test/package-test.sh

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
