#!/usr/bin/env bash
# Regenerates the CRDs, RBAC and deepcopy code from what is staged (the git index), in a temporary
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
if ! diff -r -q "$tmp/index/apis" "$tmp/regen/apis" >/dev/null || ! diff -r -q "$tmp/index/deploy" "$tmp/regen/deploy" >/dev/null; then
	echo "Generated files are out of date; run 'make manifests generate' and commit (git add) them:"
	diff -r -q "$tmp/index/apis" "$tmp/regen/apis" || true
	diff -r -q "$tmp/index/deploy" "$tmp/regen/deploy" || true
	exit 1
fi
echo "Generated files are current."
