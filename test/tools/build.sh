#!/usr/bin/env bash
# Builds the binaries of the keyroll test ground (etcd, kube-apiserver, kube-controller-manager, kwok,
# vault, external-secrets, kubectl, golangci-lint, helm, kube-score, trivy, promtool, olm-validate,
# govulncheck and its database, and for the real node kubelet, kube-proxy, coredns and the ociimage tool) from the tool modules beside this script, into a cache
# outside the checkout, and links them into one directory for the tests (default: test/bin, ignored
# by git).
#
# A binary is cached under a key made of its tool module's go.mod, go.sum and sources, so it is
# built once per machine and never again until that module changes. Progress is printed while a
# build runs, because a cold build takes tens of minutes on two cores.
#
# Usage: test/tools/build.sh [LINK_DIR [TOOL...]]: only the TOOLs named (every one when none is), so
# that a make target builds what it needs and nothing more (make lint: golangci-lint alone).
# Environment: KEYROLL_TOOLS_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/keyroll/tools)
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
link_dir=${1:-$here/../bin}
shift || true
wanted=" $* "
# wanted NAME: the tool was asked for (or every tool was).
wanted() { [[ $wanted == "  " || $wanted == *" $1 "* ]]; }
cache=${KEYROLL_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/keyroll/tools}
mkdir -p "$cache" "$link_dir"
link_dir=$(cd "$link_dir" && pwd)
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

k8s_version=v1.37.2
k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37 -X k8s.io/component-base/version.gitTreeState=clean"

kubectl_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s_version -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=37"

helm_version=v3.22.0
# As helm's Makefile does: the Kubernetes version that helm template and helm lint assume, from the
# client-go the module builds with (v0.37: Kubernetes 1.37).
helm_k8s="-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37"
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/internal/version.gitTreeState=clean $helm_k8s"
kube_score_ldflags="-s -w -X main.version=v1.20.0"
# As trivy's goreleaser.yml builds it: its version without the v (with one, trivy cannot compare it
# with the versions its checks require), and GOEXPERIMENT=jsonv2, as it uses encoding/json/v2.
trivy_ldflags="-s -w -X github.com/aquasecurity/trivy/pkg/version/app.ver=0.74.0"
# As Prometheus's .promu.yml: module v0.316.0 is Prometheus 3.16.0.
promtool_ldflags="-s -w -X github.com/prometheus/common/version.Version=3.16.0"

log() { printf '[testground %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# key MODULE_DIR EXTRA: a short hash of the tool module's files and the build flags (a GOEXPERIMENT
# among them, without changing the key of a tool built without one).
key() {
	(cd "$here/$1" && cat go.mod go.sum ./*.go 2>/dev/null; echo "$2") | sha256sum | cut -c1-16
}

# build NAME MODULE_DIR PACKAGE LDFLAGS: builds one binary unless the cache already holds it.
# GOEXPERIMENT=... build ... builds with that experiment.
build() {
	local name=$1 mod=$2 pkg=$3 ldflags=$4
	wanted "$name" || return 0
	local dir="$cache/$name-$(key "$mod" "$pkg $ldflags${GOEXPERIMENT:+ GOEXPERIMENT=$GOEXPERIMENT}")"
	if [[ -x "$dir/$name" ]]; then
		log "$name: cached ($dir)"
	else
		log "$name: building from test/tools/$mod (this takes a while on a cold cache)"
		local start=$SECONDS tmp
		tmp=$(mktemp -d "$cache/.build-$name.XXXXXX")
		(
			while sleep 60; do log "$name: still building ($(((SECONDS - start) / 60)) min)"; done
		) &
		local ticker=$!
		if ! (cd "$here/$mod" && go build -trimpath -ldflags "$ldflags" -o "$tmp/$name" "$pkg"); then
			kill "$ticker" 2>/dev/null || true
			rm -rf "$tmp"
			log "$name: build FAILED"
			return 1
		fi
		kill "$ticker" 2>/dev/null || true
		rm -rf "$dir"
		mv "$tmp" "$dir"
		log "$name: built in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s"
	fi
	ln -sfn "$dir/$name" "$link_dir/$name"
	prune "$name" "$dir"
}

# prune NAME KEEP: marks KEEP as used now and removes NAME's other cache entries (those of earlier
# tool modules or build flags) that no build has used for two days. Without it the cache grows by a
# binary each time a tool module changes, and a long-lived machine (CI's) runs out of disk.
prune() {
	local name=$1 keep=$2 old
	touch "$keep"
	for old in "$cache/$name"-????????????????; do
		[[ -e $old && $old != "$keep" ]] || continue
		if [[ -z $(find "$old" -maxdepth 0 -mmin -2880) ]]; then
			rm -rf "$old"
			log "$name: removed an entry no build has used for two days ($old)"
		fi
	done
}

# Two lanes of about the same CPU time keep both cores busy and stay within memory (Vault peaks at
# about 4.7 GB at link, External Secrets at 2.6 GB, kube-apiserver at 2.4 GB, trivy and promtool
# at 3.3 GB). Measured CPU-minutes: vault 37, kwok 6, kubectl 3, helm 4, kube-score 2, coredns 3,
# ociimage 1, promtool 13 | etcd 3, kube-apiserver 20, kube-controller-manager 7,
# external-secrets 20, golangci-lint, trivy 21; kubelet and kube-proxy share most of their
# packages with the API server. (trivy and promtool were measured while two other builds ran.)
lane1() {
	build vault vault . "-s -w"
	build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w"
	kwok_stages
	build kubectl kubectl . "$kubectl_ldflags"
	build coredns coredns . "-s -w"
	build ociimage ociimage . "-s -w"
	build helm helm helm.sh/helm/v3/cmd/helm "$helm_ldflags"
	build kube-score kubescore github.com/zegl/kube-score/cmd/kube-score "$kube_score_ldflags"
	build promtool promtool github.com/prometheus/prometheus/cmd/promtool "$promtool_ldflags"
	build olm-validate olm . "-s -w"
	build govulncheck vuln golang.org/x/vuln/cmd/govulncheck "-s -w"
	build vulndb-index vuln golang.org/x/vulndb/cmd/indexdb "-s -w"
	vulndb
}
lane2() {
	build etcd etcd . "-s -w"
	build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver "$k8s_ldflags"
	build kube-controller-manager kube k8s.io/kubernetes/cmd/kube-controller-manager "$k8s_ldflags"
	build kubelet kube k8s.io/kubernetes/cmd/kubelet "$k8s_ldflags"
	build kube-proxy kube k8s.io/kubernetes/cmd/kube-proxy "$k8s_ldflags"
	build external-secrets eso . "-s -w"
	build golangci-lint lint github.com/golangci/golangci-lint/v2/cmd/golangci-lint "-s -w"
	GOEXPERIMENT=jsonv2 build trivy trivy github.com/aquasecurity/trivy/cmd/trivy "$trivy_ldflags"
}

# vulndb: Go's vulnerability database for govulncheck (-db file://...), indexed from the OSV reports
# of the golang.org/x/vulndb module that test/tools/vuln pins, and kept beside the index tool.
vulndb() {
	wanted vulndb-index || return 0
	local dir src
	dir="$cache/vulndb-$(key vuln vulndb)"
	if [[ ! -d "$dir" ]]; then
		src=$(cd "$here/vuln" && go list -m -f '{{.Dir}}' golang.org/x/vulndb)
		rm -rf "$dir.tmp"
		"$link_dir/vulndb-index" -vulns "$src/data/osv" -out "$dir.tmp"
		mv "$dir.tmp" "$dir"
		log "vulndb: indexed from golang.org/x/vulndb ($dir)"
	fi
	ln -sfn "$dir" "$link_dir/vulndb"
	prune vulndb "$dir"
}

# kwok refuses to start without stages: take the "fast" node and pod stages from the kwok module
# the binary was built from, and keep them beside it.
kwok_stages() {
	wanted kwok || return 0
	local kwok_dir dir
	kwok_dir=$(dirname "$(readlink "$link_dir/kwok")")
	dir="$kwok_dir/stages"
	if [[ ! -d "$dir" ]]; then
		local src
		src=$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
		mkdir -p "$dir.tmp"
		cp "$src/node/fast/node-initialize.yaml" "$src/pod/fast/pod-ready.yaml" "$src/pod/fast/pod-delete.yaml" "$dir.tmp/"
		chmod u+w "$dir.tmp"/*
		mv "$dir.tmp" "$dir"
	fi
	ln -sfn "$dir" "$link_dir/kwok-stages"
}

start=$SECONDS
lane1 & p1=$!
lane2 & p2=$!
status=0
wait "$p1" || status=1
wait "$p2" || status=1
if ((status != 0)); then
	log "some test-ground binaries failed to build"
	exit 1
fi
log "test-ground binaries ready in $link_dir ($(((SECONDS - start) / 60)) min; $(df -BG --output=avail "$cache" | tail -1 | tr -d ' ') of disk free beside the cache)"
