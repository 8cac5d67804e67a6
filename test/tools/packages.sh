#!/usr/bin/env bash
# Lists the Go packages of one test tier, for the Makefile:
#   unit         every package outside test/ (fakes, and a redis-server on loopback at most)
#   integration  the packages under test/ with tests whose ground has no real node (a control
#                plane, kwok, Vault, Redis, External Secrets Operator)
#   e2e          the packages under test/ whose ground runs the real node (Node: true)
#   own-node     of those, the ones that start a real node of their own rather than work on a
#                shared ground (test/framework's OwnGround, or testground.Start(T) with a node):
#                only one real node runs on a machine, so they cannot run beside the shared one
#   alone        the packages under test/ whose measurements need the machine to themselves
#                (test/framework's Alone): they run after every other package
# A package's tier is read from its Go files; nothing is listed by hand.
set -euo pipefail
cd "$(dirname "$0")/../.."
with_tests='{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}} {{.Dir}}{{end}}'
own_node='(Start(T)?\((t, )?(testground\.)?Options\{[^}]*Node: *true)|OwnGround: *true'
case ${1:-} in
unit) go list ./... | grep -v '/test/' ;;
alone)
	go list -f "$with_tests" ./test/... | while read -r pkg dir; do
		[[ -n $pkg ]] && grep -qE 'Alone: *true' "$dir"/*.go && echo "$pkg"
	done
	;;
integration | e2e | own-node)
	go list -f "$with_tests" ./test/... | while read -r pkg dir; do
		[[ -n $pkg ]] || continue
		if ! grep -qE 'Node: *true' "$dir"/*.go; then
			tier=integration
		elif [[ $1 == own-node ]] && grep -qE "$own_node" "$dir"/*.go; then
			tier=own-node
		else
			tier=e2e
		fi
		[[ $tier == "$1" || ($1 == e2e && $tier == own-node) ]] && echo "$pkg"
	done
	;;
*)
	echo "usage: $0 unit|integration|e2e|own-node|alone" >&2
	exit 2
	;;
esac
