#!/bin/sh
# promtool (Debian's prometheus package) for tests/unit/test_promtool.py: the exposition the
# agent, monitor and probe write is checked by Prometheus's own linter.
set -e
command -v promtool >/dev/null 2>&1 && exit 0
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends prometheus >/dev/null
command -v promtool >/dev/null
