#!/usr/bin/env bash
# Regenerates the CRDs, RBAC, OLM bundle and deepcopy code from what is staged (the git index), in a temporary
# copy, and fails when that changes a generated file: unstaged edits of the working tree neither
# hide nor cause a difference. make test runs it (make verify-generated).
set -euo pipefail
top=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$top"
git checkout-index -a --prefix="$tmp/index/"
cp -a "$tmp/index" "$tmp/regen"
(cd "$tmp/regen" && make -s manifests generate >/dev/null)
stale=0
for d in apis deploy bundle bundle.Dockerfile; do
	if ! diff -r -q -N "$tmp/index/$d" "$tmp/regen/$d" >/dev/null 2>&1; then
		[[ $stale == 1 ]] || echo "Generated files are out of date; run 'make manifests generate' and commit (git add) them:"
		stale=1
		diff -r -q -N "$tmp/index/$d" "$tmp/regen/$d" || true
	fi
done
[[ $stale == 0 ]] || exit 1
echo "Generated files are current."
