#!/usr/bin/env bash
# Installs the Debian packages keyroll's tests and playground need, when they are missing:
# redis-server and redis-tools (a real Redis on loopback ports, and the Redis of the real node's
# image; not started as a service here), and for the real node containerd, runc, the CNI plugins,
# busybox-static (the Redis image's shell), iptables and conntrack (kube-proxy), iproute2 (the
# node's bridge), gcc and libc6-dev (the static pause program), curl (the image of the chart's helm
# test pod), and ca-certificates (the CA bundle that make image copies into the manager image).
#
# Usage: test/tools/install-deps.sh [redis]: with redis, only redis-server and redis-tools (what
# make unit and make integration need; no real node).
set -euo pipefail
only=${1:-}
missing=()
need() { # need PACKAGE TEST...: the package is missing when the test fails
	local pkg=$1
	shift
	"$@" >/dev/null 2>&1 || missing+=("$pkg")
}
need redis-server command -v redis-server
need redis-tools command -v redis-cli
if [[ $only != redis ]]; then
	need containerd command -v containerd
	need runc command -v runc
	need containernetworking-plugins test -x /usr/lib/cni/bridge
	need busybox-static bash -c "dpkg-query -W -f='\${Status}' busybox-static | grep -q 'install ok installed'"
	need iptables command -v iptables
	need conntrack command -v conntrack
	need iproute2 command -v ip
	need gcc command -v gcc
	need libc6-dev test -f /usr/lib/x86_64-linux-gnu/libc.a
	need curl command -v curl
	need ca-certificates test -s /etc/ssl/certs/ca-certificates.crt
fi
if ((${#missing[@]} == 0)); then
	exit 0
fi
echo "[deps] installing ${missing[*]}"
sudo=""
if [[ $(id -u) != 0 ]]; then sudo=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# The packages start system-wide servers where a service manager runs (Redis on port 6379,
# containerd); the tests start their own, on free ports and with their own configuration.
if command -v systemctl >/dev/null; then
	for svc in redis-server containerd; do
		if systemctl is-active --quiet "$svc" 2>/dev/null; then $sudo systemctl stop "$svc" || true; fi
	done
fi
echo "[deps] installed ${missing[*]}"
