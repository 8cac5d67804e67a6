#!/usr/bin/env bash
# Installs the Debian packages keyroll's tests and playground need, when they are missing:
# redis-server (a real Redis on loopback ports; not started as a service here).
set -euo pipefail
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
if ((${#missing[@]} == 0)); then
	exit 0
fi
echo "[deps] installing ${missing[*]}"
sudo=""
if [[ $(id -u) != 0 ]]; then sudo=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The package starts a system-wide server on port 6379; the tests start their own on free ports.
if command -v systemctl >/dev/null && systemctl is-active --quiet redis-server 2>/dev/null; then
	$sudo systemctl stop redis-server || true
fi
echo "[deps] installed ${missing[*]}"
