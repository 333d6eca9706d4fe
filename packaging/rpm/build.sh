#!/bin/sh
# Build the EL9 RPMs with rpmbuild into dist/rpm, then rpmlint them when it is installed.
# On Debian (apt install rpm rpmlint) the EL9 build dependencies are not in the rpm database,
# so rpmbuild runs with --nodeps and slurm-devel's headers come from libslurm-dev.
# Built this way, not yet installed on EL9 (docs/admin-guide.md).
set -eu
cd "$(dirname "$0")/../.."
TOP=$(pwd)
PY=${PYTHON:-python3}
VERSION=$($PY -c 'import slurmiso; print(slurmiso.__version__)')
R=$TOP/build/rpm
OUT=${OUT:-$TOP/dist/rpm}
rm -rf "$R"; mkdir -p "$R/SOURCES" "$OUT"
$PY setup.py -q sdist -d "$R/SOURCES" >/dev/null 2>&1
rm -rf slurmiso.egg-info
$PY -m pip download -q --no-deps --disable-pip-version-check 'nvidia-ml-py>=11.450' \
    -d "$R/wheels" >/dev/null 2>&1
NVML=$(ls "$R"/wheels/nvidia_ml_py-*.whl | head -1)
cp "$NVML" "$R/SOURCES/"
rb() { rpmbuild -bb --nodeps --define "_topdir $R" --define "upstream_version $VERSION" \
    --define "dist .el9" "$@"; }
rb --define "nvml_wheel $(basename "$NVML")" \
    --define "_unitdir /usr/lib/systemd/system" packaging/rpm/slurmiso.spec >"$R/build.log" 2>&1 \
    || { tail -30 "$R/build.log"; exit 1; }
# SLURM_VERSION_NUMBER 0x160508 -> 22.05
HEX=$(sed -n 's/^#define SLURM_VERSION_NUMBER 0x\([0-9a-fA-F]*\).*/\1/p' \
    /usr/include/slurm/slurm_version.h 2>/dev/null || true)
SERIES=""
[ -n "$HEX" ] && SERIES=$(printf '%d.%02d' "0x${HEX%????}" "0x$(echo "$HEX" | cut -c3-4)")
if [ -n "$SERIES" ]; then
    NEXT=$(echo "$SERIES" | awk -F. '{printf "%d.%02d", $1, $2 + 1}')
    rb --define "slurm_series $SERIES" --define "slurm_next $NEXT" \
        packaging/rpm/slurmiso-spank.spec >"$R/build-spank.log" 2>&1 \
        || { tail -30 "$R/build-spank.log"; exit 1; }
else
    echo "slurmiso-spank: no <slurm/slurm_version.h>; skipped (install slurm-devel)" >&2
fi
find "$R/RPMS" -name '*.rpm' -exec cp {} "$OUT/" \;
ls -1 "$OUT"/*.rpm
if command -v rpmlint >/dev/null 2>&1; then
    rpmlint -r packaging/rpm/rpmlintrc packaging/rpm/*.spec "$OUT"/*.rpm
fi
