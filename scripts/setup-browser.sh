#!/usr/bin/env bash
# Installs Debian's `chromium` and `chromium-driver` for the browser test (tests/server_browser.rs)
# when /usr/bin/chromium or /usr/bin/chromedriver is missing. Needs root (or sudo) and apt-get.
# DAGLOOP_SKIP_BROWSER=1 makes the test print SKIPPED instead when they are missing.
set -euo pipefail
if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then
    exit 0
fi
command -v apt-get >/dev/null || {
    echo "setup-browser.sh: apt-get is required to install chromium and chromium-driver" >&2
    exit 1
}
SUDO=""
if [ "$(id -u)" != "0" ]; then
    command -v sudo >/dev/null || { echo "setup-browser.sh: run as root (or install sudo)" >&2; exit 1; }
    SUDO="sudo"
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >&2
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver >&2
