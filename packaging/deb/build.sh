#!/bin/sh
# Build the Debian packages from this tree with dpkg-deb (no debhelper needed):
#   dist/deb/slurmiso_<v>-1_all.deb                 Python code, hooks, units, cron, man pages
#   dist/deb/slurmiso-sandbox_<v>-1_all.deb         the test cluster (slurmiso_sandbox): a
#       development tool, kept out of the runtime package (admin guide, section 13)
#   dist/deb/slurmiso-spank_<v>-1+slurm<X.Y>_<arch>.deb   the SPANK plugin, built against the
#       installed libslurm-dev and depending on exactly that Slurm release series
# Layout (docs/admin-guide.md, "What the packages install"):
#   /usr/lib/slurmiso/python/   slurmiso (+ pynvml from nvidia-ml-py, not in Debian main)
#   /usr/bin/slurmiso{,-prolog,-epilog,-task-prolog}   launchers: /usr/bin/python3 -I
#   /etc/slurmiso/slurmiso.yaml, /etc/cron.d/slurmiso-audit, /etc/logrotate.d/slurmiso (conffiles)
#   /usr/lib/systemd/system/slurmiso-{monitor,agent}.service, man pages, bash completion
#   /usr/lib/slurmiso/slurmiso.so, slurmiso_fence.so (slurmiso-spank)
#   /usr/lib/slurmiso/python/slurmiso_sandbox/   (slurmiso-sandbox)
# Building fetches nvidia-ml-py once (or set NVML_WHEEL=path/to/nvidia_ml_py-*.whl);
# installing the result needs no network.
set -eu
cd "$(dirname "$0")/../.."
TOP=$(pwd)
OUT=${OUT:-$TOP/dist/deb}
WORK=$TOP/build/deb
PY=${PYTHON:-python3}
VERSION=$($PY -c 'import slurmiso; print(slurmiso.__version__)')
DEBREV=${DEBREV:-1}
MAINT="slurmiso maintainers <slurmiso@localhost>"
rm -rf "$WORK"; mkdir -p "$WORK" "$OUT"

# ------------------------------------------------------------------------------- slurmiso
P=$WORK/slurmiso
LIB=$P/usr/lib/slurmiso/python
if [ -z "${NVML_WHEEL:-}" ]; then
    $PY -m pip download -q --no-deps --disable-pip-version-check 'nvidia-ml-py>=11.450' \
        -d "$WORK/wheels" >/dev/null 2>&1
    NVML_WHEEL=$(ls "$WORK"/wheels/nvidia_ml_py-*.whl | head -1)
fi
PYTHON=$PY sh packaging/stage.sh "$P" "$NVML_WHEEL"
install -d "$P/usr/share/doc/slurmiso"
install -m 0644 README.md docs/*.md "$P/usr/share/doc/slurmiso/"
$PY packaging/deb/copyright.py "$LIB/pynvml.py" > "$P/usr/share/doc/slurmiso/copyright"
printf 'slurmiso (%s-%s) unstable; urgency=medium\n\n  * Package build from the source tree.\n\n -- %s  %s\n' \
    "$VERSION" "$DEBREV" "$MAINT" "$(date -R -d @${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)})" \
    | gzip -9n > "$P/usr/share/doc/slurmiso/changelog.Debian.gz"
cp -r packaging/deb/slurmiso/DEBIAN "$P/DEBIAN"
SIZE=$(du -sk --exclude=DEBIAN "$P" | cut -f1)
sed -e "s/@VERSION@/$VERSION-$DEBREV/" -e "s/@SIZE@/$SIZE/" -e "s/@MAINT@/$MAINT/" \
    packaging/deb/slurmiso/DEBIAN/control > "$P/DEBIAN/control"
find "$P" -type d -exec chmod 0755 {} +
find "$P" -type f ! -path '*/DEBIAN/*' ! -perm -u+x -exec chmod 0644 {} +
chmod 0755 "$P"/DEBIAN/postinst "$P"/DEBIAN/prerm "$P"/DEBIAN/postrm
dpkg-deb --root-owner-group -Zxz --build "$P" "$OUT/slurmiso_${VERSION}-${DEBREV}_all.deb" >/dev/null
echo "built $OUT/slurmiso_${VERSION}-${DEBREV}_all.deb"

# ----------------------------------------------------------------------- slurmiso-sandbox
X=$WORK/slurmiso-sandbox
install -d "$X/usr/lib/slurmiso/python/slurmiso_sandbox" "$X/usr/share/doc/slurmiso-sandbox"
install -m 0644 slurmiso_sandbox/*.py slurmiso_sandbox/*.c "$X/usr/lib/slurmiso/python/slurmiso_sandbox/"
$PY packaging/deb/copyright.py > "$X/usr/share/doc/slurmiso-sandbox/copyright"
printf 'slurmiso-sandbox (%s-%s) unstable; urgency=medium\n\n  * Package build from the source tree.\n\n -- %s  %s\n' \
    "$VERSION" "$DEBREV" "$MAINT" "$(date -R -d @${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)})" \
    | gzip -9n > "$X/usr/share/doc/slurmiso-sandbox/changelog.Debian.gz"
cp -r packaging/deb/slurmiso-sandbox/DEBIAN "$X/DEBIAN"
SIZE=$(du -sk --exclude=DEBIAN "$X" | cut -f1)
sed -e "s/@VERSION@/$VERSION-$DEBREV/g" -e "s/@SIZE@/$SIZE/" -e "s/@MAINT@/$MAINT/" \
    packaging/deb/slurmiso-sandbox/DEBIAN/control > "$X/DEBIAN/control"
find "$X" -type d -exec chmod 0755 {} +
find "$X" -type f ! -path '*/DEBIAN/*' -exec chmod 0644 {} +
chmod 0755 "$X"/DEBIAN/postinst "$X"/DEBIAN/prerm
dpkg-deb --root-owner-group -Zxz --build "$X" \
    "$OUT/slurmiso-sandbox_${VERSION}-${DEBREV}_all.deb" >/dev/null
echo "built $OUT/slurmiso-sandbox_${VERSION}-${DEBREV}_all.deb"

# ------------------------------------------------------------------------- slurmiso-spank
if [ -n "${SKIP_SPANK:-}" ]; then exit 0; fi
SLURM_DEV=$(dpkg-query -W -f='${Version}' libslurm-dev 2>/dev/null || true)
if [ -z "$SLURM_DEV" ]; then
    echo "slurmiso-spank: libslurm-dev is not installed; skipped (apt install libslurm-dev)" >&2
    exit 0
fi
SERIES=$(echo "$SLURM_DEV" | sed -E 's/^([0-9]+)\.([0-9]+).*/\1.\2/')
NEXT=$(echo "$SERIES" | awk -F. '{printf "%d.%02d", $1, $2 + 1}')
LIBPKG=$(dpkg-query -W -f='${Package}\n' 'libslurm[0-9]*' 2>/dev/null | grep -E '^libslurm[0-9]+$' | head -1)
ARCH=$(dpkg --print-architecture)
S=$WORK/slurmiso-spank
make -s -C spank clean all
install -D -m 0644 spank/slurmiso.so "$S/usr/lib/slurmiso/slurmiso.so"
install -D -m 0644 spank/slurmiso_fence.so "$S/usr/lib/slurmiso/slurmiso_fence.so"
make -s -C spank clean
install -d "$S/usr/share/doc/slurmiso-spank"
$PY packaging/deb/copyright.py > "$S/usr/share/doc/slurmiso-spank/copyright"
printf 'slurmiso-spank (%s-%s+slurm%s) unstable; urgency=medium\n\n  * Built against libslurm-dev %s.\n\n -- %s  %s\n' \
    "$VERSION" "$DEBREV" "$SERIES" "$SLURM_DEV" "$MAINT" "$(date -R)" \
    | gzip -9n > "$S/usr/share/doc/slurmiso-spank/changelog.Debian.gz"
mkdir -p "$S/DEBIAN"
SIZE=$(du -sk "$S" | cut -f1)
sed -e "s/@VERSION@/$VERSION-$DEBREV+slurm$SERIES/" -e "s/@SIZE@/$SIZE/" -e "s/@MAINT@/$MAINT/" \
    -e "s/@ARCH@/$ARCH/" -e "s/@LIBPKG@/$LIBPKG/g" -e "s/@SERIES@/$SERIES/g" \
    -e "s/@NEXT@/$NEXT/g" -e "s/@SLURM_DEV@/$SLURM_DEV/" \
    packaging/deb/slurmiso-spank/control > "$S/DEBIAN/control"
find "$S" -type d -exec chmod 0755 {} +
dpkg-deb --root-owner-group -Zxz --build "$S" \
    "$OUT/slurmiso-spank_${VERSION}-${DEBREV}+slurm${SERIES}_${ARCH}.deb" >/dev/null
echo "built $OUT/slurmiso-spank_${VERSION}-${DEBREV}+slurm${SERIES}_${ARCH}.deb"
