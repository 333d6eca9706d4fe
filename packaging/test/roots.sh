#!/bin/sh
# Clean Debian roots for the package test, made once and cached:
#   /var/cache/slurmiso-dev/roots/<suite>   (debootstrap --variant=minbase, ~35 s each)
# They hold only what a site's nodes already have from the Debian archive: python3 and the
# three Python libraries the slurmiso package depends on, systemd (for systemd-analyze),
# man-db, and for bookworm libslurm38 (the Slurm 22.05 the slurmiso-spank .deb built here
# links against). Our own .debs are then installed in a copy with no network at all.
# Usage: roots.sh SUITE...   (env MIRROR, ROOTS)
set -eu
ROOTS=${ROOTS:-/var/cache/slurmiso-dev/roots}
MIRROR=${MIRROR:-}  # empty: debootstrap's own default mirror
BASE_PKGS=python3,python3-yaml,python3-psutil,python3-prometheus-client,systemd,man-db
mkdir -p "$ROOTS"
if ! command -v debootstrap >/dev/null 2>&1; then  # a fresh CI machine: install it first
    apt-get update -qq && apt-get install -y -qq --no-install-recommends debootstrap >/dev/null
fi
for suite in "$@"; do
    root="$ROOTS/$suite"
    if [ -f "$root/.slurmiso-root-ok" ]; then
        echo "roots: $suite: cached at $root"
        continue
    fi
    rm -rf "$root" "$root.tmp"
    extra=""
    [ "$suite" = bookworm ] && extra=",libslurm38"
    echo "roots: $suite: debootstrap --variant=minbase into $root"
    debootstrap --variant=minbase --include="$BASE_PKGS$extra" "$suite" "$root.tmp" ${MIRROR:+"$MIRROR"} \
        > "$ROOTS/$suite.log" 2>&1 || { tail -20 "$ROOTS/$suite.log"; exit 1; }
    chroot "$root.tmp" apt-get clean
    touch "$root.tmp/.slurmiso-root-ok"
    mv "$root.tmp" "$root"
done
