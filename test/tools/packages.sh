#!/usr/bin/env bash
# Lists the Go packages of one test tier, for the Makefile:
#   unit         every package outside test/ (fakes, and a redis-server on loopback at most)
#   integration  the packages under test/ with tests whose ground has no real node (a control
#                plane, kwok, Vault, Redis, External Secrets Operator)
#   e2e          the packages under test/ whose ground runs the real node (Node: true), and
#                test/testground, which tests the ground itself
# A package is e2e when one of its Go files asks for the real node; nothing is listed by hand.
set -euo pipefail
cd "$(dirname "$0")/../.."
with_tests='{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}'
case ${1:-} in
unit) go list ./... | grep -v '/test/' ;;
integration | e2e)
	go list -f "$with_tests" ./test/... | while read -r pkg dir; do
		[[ -n $pkg ]] || continue
		if grep -qE 'Node: *true' "$dir"/*.go; then tier=e2e; else tier=integration; fi
		[[ $tier == "$1" ]] && echo "$pkg"
	done
	;;
*)
	echo "usage: $0 unit|integration|e2e" >&2
	exit 2
	;;
esac
