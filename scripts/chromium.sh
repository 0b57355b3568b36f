#!/usr/bin/env bash
# Installs Debian's Chromium for the console's browser tests (Playwright drives /usr/bin/chromium;
# its own browser download cannot work here). Fails loudly when it cannot be installed.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
    echo "chromium: $(/usr/bin/chromium --version 2>/dev/null || echo present)"
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "chromium: installing Debian's package" >&2
if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq chromium; }; then
    echo "chromium: ERROR: apt-get could not install chromium; the console's browser tests cannot run" >&2
    exit 1
fi
if [ ! -x /usr/bin/chromium ]; then
    echo "chromium: ERROR: the package installed but /usr/bin/chromium is missing" >&2
    exit 1
fi
echo "chromium: $(/usr/bin/chromium --version 2>/dev/null || echo installed)"
