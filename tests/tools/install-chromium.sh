#!/bin/sh
# Install Debian's headless-capable Chromium for the audit report's screenshot test
# (tests/browser/test_audit_html_browser.py). Idempotent: does nothing when it is already there.
# Called by 'make test'; needs root (apt-get) the first time.
set -eu
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-chromium: chromium is missing and this is not root; the screenshot test" \
         "will fail until 'apt-get install -y chromium' is run" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
