#!/bin/sh
# Installs Debian's prometheus (prometheus + promtool) when missing: the rule tests and the
# end-to-end dashboard test run them. Needs root (or sudo); otherwise says what to run.
set -e
if command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "prometheus/promtool missing: run 'apt-get install -y prometheus' as root" >&2
        exit 0
    fi
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
