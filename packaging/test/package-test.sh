#!/bin/bash
# Install the .debs from dist/deb into clean Debian 12 and 13 roots with NO network, check
# what an admin checks, purge, and compare the root with its state before the install.
# Roots: packaging/test/roots.sh (debootstrap minbase, cached). Run as root: make package-test
# Env: SUITES (default "bookworm trixie"), ROOTS, DEBS (default dist/deb).
set -euo pipefail
cd "$(dirname "$0")/../.."
TOP=$(pwd)
SUITES=${SUITES:-bookworm trixie}
ROOTS=${ROOTS:-/var/cache/slurmiso-dev/roots}
DEBS=${DEBS:-$TOP/dist/deb}
export ROOTS
sh packaging/test/roots.sh $SUITES

fail=0
WORK=""
cleanup() {
    if [ -n "$WORK" ]; then
        umount "$WORK/root/proc" 2>/dev/null || true
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT

ok() { echo "  ok    $1"; }
bad() { echo "  FAIL  $1"; fail=$((fail + 1)); }

# -------------------------------------------------- the wheel, as a pip user installs it
echo "== wheel (venv)"
WORK=$(mktemp -d /var/tmp/slurmiso-pkgtest.XXXXXX)
python3 -m pip wheel -q --no-deps --disable-pip-version-check . -w "$WORK/dist" >/dev/null 2>&1 \
    && ok "pip wheel" || bad "pip wheel"
rm -rf build slurmiso.egg-info
WHEEL=$(ls "$WORK"/dist/slurmiso-*.whl 2>/dev/null | head -1)
python3 - "$WHEEL" <<'PYEOF' && ok "wheel holds config, units, cron, logrotate, spank, LICENSE" \
    || bad "wheel contents"
import sys, zipfile
names = set(zipfile.ZipFile(sys.argv[1]).namelist())
need = ["slurmiso/data/etc/slurmiso.yaml", "slurmiso/data/etc/systemd/slurmiso-monitor.service",
        "slurmiso/data/etc/systemd/slurmiso-agent.service", "slurmiso/data/etc/cron.d/slurmiso-audit",
        "slurmiso/data/etc/logrotate.d/slurmiso", "slurmiso/data/etc/plugstack.conf.d/slurmiso.conf",
        "slurmiso/data/spank/slurmiso_spank.c", "slurmiso/data/job_submit.lua"]
missing = [n for n in need if n not in names]
lic = [n for n in names if n.endswith("/LICENSE") and ".dist-info/" in n]
meta = zipfile.ZipFile(sys.argv[1]).read(next(n for n in names if n.endswith("/METADATA"))).decode()
assert not missing and lic, (missing, lic)
assert "Requires-Dist: prometheus-client" in meta and "pyslurm" not in meta
assert not [n for n in names if n.startswith("slurmiso_sandbox/")], "the wheel ships the sandbox"
PYEOF
python3 -m venv --system-site-packages "$WORK/venv"
"$WORK/venv/bin/pip" install -q --no-deps --disable-pip-version-check "$WHEEL" >/dev/null 2>&1
V=$WORK/venv/bin
"$V/slurmiso" gen config -o "$WORK/slurmiso.yaml" && cmp -s "$WORK/slurmiso.yaml" etc/slurmiso.yaml \
    && ok "gen config = etc/slurmiso.yaml" || bad "gen config"
"$V/slurmiso" gen systemd --dir "$WORK" && grep -q "ExecStart=$V/slurmiso monitor" \
    "$WORK/slurmiso-monitor.service" && ok "gen systemd names $V" || bad "gen systemd"
"$V/slurmiso" gen cron | grep -q "PATH=$V:" && ok "gen cron names $V" || bad "gen cron"
# The sandbox is a development tool: a pip install has none, and says how to get it.
rc=0; out=$("$V/slurmiso" sandbox status 2>&1) || rc=$?
[ "$rc" -eq 6 ] && echo "$out" | grep -q "development tool" \
    && ok "wheel: 'sandbox status' exits 6 naming slurmiso-sandbox" || bad "wheel: sandbox ($rc): $out"
"$V/slurmiso" -c etc/slurmiso.yaml gen slurm-conf --slurm-version 24.11.5 \
    | grep -qx "Prolog=$V/slurmiso-prolog" && test -x "$V/slurmiso-prolog" \
    && ok "gen slurm-conf names $V/slurmiso-prolog, which exists" || bad "gen slurm-conf"
rm -rf "$WORK"; WORK=""

# ------------------------------------------------------------------------ the .debs
if dpkg-deb -c "$DEBS"/slurmiso_*_all.deb | grep -q '\.pyc$'; then
    bad "the .deb ships bytecode"
else
    ok "the .deb ships no bytecode (postinst compiles for the target's Python)"
fi
if dpkg-deb -c "$DEBS"/slurmiso_*_all.deb | grep -q 'slurmiso_sandbox'; then
    bad "the runtime .deb ships the sandbox"
else
    ok "the runtime .deb ships no sandbox (slurmiso-sandbox does)"
fi
SANDBOX_DEB=$(ls "$DEBS"/slurmiso-sandbox_*_all.deb 2>/dev/null | head -1 || true)
[ -n "$SANDBOX_DEB" ] && ok "slurmiso-sandbox built" || bad "no slurmiso-sandbox .deb in $DEBS"

# Every file and directory of the root, with its type and mode, minus what dpkg, man-db and
# the test itself are expected to change.
inventory() {
    chroot "$1" find / -xdev \( -path /proc -o -path /sys -o -path /dev -o -path /tmp \
        -o -path /run -o -path /var/lib/dpkg -o -path /var/log -o -path /var/cache/man \
        -o -path /var/cache/debconf -o -path /var/cache/ldconfig \) -prune \
        -o -printf '%y %m %p\n' | grep -v ' /etc/ld.so.cache$' | LC_ALL=C sort
}

check() {  # check NAME CMD...: run CMD in the root, no network; print and count failures
    local name=$1; shift
    local out
    if out=$(unshare -n chroot "$ROOT" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
            LANG=C.UTF-8 MANWIDTH=80 "$@" 2>&1); then
        echo "  ok    $name"
    else
        echo "  FAIL  $name"; echo "$out" | tail -15 | sed 's/^/        /'; fail=$((fail + 1))
    fi
    LAST=$out
}

for suite in $SUITES; do
    echo "== $suite"
    WORK=$(mktemp -d /var/tmp/slurmiso-pkgtest.XXXXXX)
    ROOT=$WORK/root
    cp -a "$ROOTS/$suite" "$ROOT"
    mount -t proc proc "$ROOT/proc"
    inventory "$ROOT" > "$WORK/before"
    mkdir -p "$ROOT/tmp/debs"
    cp "$DEBS"/slurmiso_*_all.deb "$ROOT/tmp/debs/"
    pkgs="slurmiso"
    spank=$(ls "$DEBS"/slurmiso-spank_*.deb 2>/dev/null | head -1 || true)
    # The spank .deb is built for the host's Slurm series; install it where that series is.
    if [ -n "$spank" ] && chroot "$ROOT" dpkg-query -W "$(dpkg-deb -f "$spank" Depends \
            | grep -o 'libslurm[0-9]*' | head -1)" >/dev/null 2>&1; then
        cp "$spank" "$ROOT/tmp/debs/"; pkgs="slurmiso slurmiso-spank"
    fi
    if [ -n "$spank" ] && [[ $pkgs != *spank* ]]; then
        # Tied to its Slurm series: where that libslurm is absent, dpkg must refuse it.
        cp "$spank" "$ROOT/tmp/spank.deb"
        if unshare -n chroot "$ROOT" dpkg -i /tmp/spank.deb >/dev/null 2>&1; then
            bad "slurmiso-spank for another Slurm series was accepted"
        else
            ok "slurmiso-spank refused: its Slurm series is not installed here"
        fi
        chroot "$ROOT" dpkg --purge slurmiso-spank >/dev/null 2>&1 || true
        rm -f "$ROOT/tmp/spank.deb"
    fi
    check "dpkg -i $pkgs (no network)" sh -c 'dpkg -i /tmp/debs/*.deb'
    check "slurmiso --version" slurmiso --version
    check "check-config /etc/slurmiso/slurmiso.yaml" \
        slurmiso check-config /etc/slurmiso/slurmiso.yaml
    check "slurmiso-prolog --help" sh -c 'slurmiso-prolog --help | grep -q "Slurm Prolog"'
    check "slurmiso-epilog --help" sh -c 'slurmiso-epilog --help | grep -q "Slurm Epilog"'
    check "slurmiso-task-prolog --help" slurmiso-task-prolog --help
    check "slurmiso-oci-gate --help" sh -c 'slurmiso-oci-gate --help | grep -q RunTimeRun'
    check "hook without SLURM_JOB_ID exits 2" sh -c 'slurmiso-prolog; test $? -eq 2'
    check "man 8 slurmiso-prolog" sh -c 'man 8 slurmiso-prolog | grep -q "FAILURE SEMANTICS"'
    check "man slurmiso (every command)" sh -c 'man slurmiso | grep -q "slurmiso gen systemd"'
    check "man 5 slurmiso.yaml" sh -c 'man 5 slurmiso.yaml | grep -q "monitor.dry_run"'
    check "systemd-analyze verify (both units)" systemd-analyze verify \
        /usr/lib/systemd/system/slurmiso-monitor.service \
        /usr/lib/systemd/system/slurmiso-agent.service
    check "gen slurm-conf names /usr/bin" sh -c \
        'slurmiso gen slurm-conf --slurm-version 22.05.8 | grep -qx "Prolog=/usr/bin/slurmiso-prolog"'
    check "prometheus_client importable (agent)" python3 -I -c 'import prometheus_client'
    check "no sandbox with the runtime alone: exit 6, names slurmiso-sandbox" sh -c \
        'out=$(slurmiso sandbox status 2>&1); test $? -eq 6 && echo "$out" | grep -q slurmiso-sandbox'
    if [ -n "$SANDBOX_DEB" ]; then
        mkdir -p "$ROOT/tmp/sandbox-deb"; cp "$SANDBOX_DEB" "$ROOT/tmp/sandbox-deb/"
        check "dpkg -i slurmiso-sandbox (no network)" sh -c 'dpkg -i /tmp/sandbox-deb/*.deb'
        check "sandbox installed: up --help offers --force" sh -c \
            'slurmiso sandbox up --help | grep -q -- --force'
        check "sandbox modules and the demo workload importable" python3 -I -c \
            'import sys; sys.path.insert(0, "/usr/lib/slurmiso/python"); import slurmiso_sandbox.cluster, slurmiso_sandbox.guard, slurmiso_sandbox.demo, os; assert os.path.isfile("/usr/lib/slurmiso/python/slurmiso_sandbox/train_counter.py")'
        pkgs="$pkgs slurmiso-sandbox"
    fi
    if [[ $pkgs == *spank* ]]; then
        check "spank plugin installed" test -f /usr/lib/slurmiso/slurmiso.so
        check "fence plugin installed" test -f /usr/lib/slurmiso/slurmiso_fence.so
    fi
    check "dpkg --purge" sh -c "dpkg --purge $(echo $pkgs | tr ' ' '\n' | tac | tr '\n' ' ')"
    rm -rf "$ROOT/tmp/debs" "$ROOT/tmp/sandbox-deb"
    inventory "$ROOT" > "$WORK/after"
    if diff -u "$WORK/before" "$WORK/after" > "$WORK/diff"; then
        echo "  ok    purge left nothing behind"
    else
        echo "  FAIL  purge left files behind:"; grep '^[-+][^-+]' "$WORK/diff" | head -20
        fail=$((fail + 1))
    fi
    umount "$ROOT/proc"
    rm -rf "$WORK"; WORK=""
done
echo "package-test: $fail failed"
[ "$fail" -eq 0 ]
