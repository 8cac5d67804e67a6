# keyroll — make help lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

IMG ?= keyroll:dev
# Where make image writes the manager image (an OCI archive).
IMAGE_ARCHIVE ?= $(CURDIR)/bin/keyroll-image.tar
# The release the image is labelled with (org.opencontainers.image.version): the nearest tag, or
# the commit in a clone without tags, or 0.0.0-dev outside a Git checkout.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo 0.0.0-dev)
# The image's org.opencontainers.image.source.
IMAGE_SOURCE ?= https://github.com/keyroll/keyroll
# The CA bundle make image copies into the image, where Go's crypto/x509 looks for it (as the
# distroless base of the Dockerfile has it): Debian's ca-certificates package writes it.
CA_BUNDLE ?= /etc/ssl/certs/ca-certificates.crt
GO ?= go
# The Go release keyroll is built and tested with (go.mod's toolchain): a patch release without the
# standard library's known vulnerabilities (test/vulncheck); go fetches it from the module proxy once.
export GOTOOLCHAIN ?= go1.26.11
CONTROLLER_GEN := $(GO) tool controller-gen
# The test ground's binaries (kube-apiserver, etcd, kube-controller-manager, kwok, vault) are linked
# here from a cache outside the checkout; see test/tools/build.sh.
TESTGROUND_BIN ?= $(CURDIR)/test/bin
export KEYROLL_TESTGROUND_BIN := $(TESTGROUND_BIN)
export KUBEBUILDER_ASSETS := $(TESTGROUND_BIN)
# Where make playground writes playground.kubeconfig and playground.env (removed on Ctrl-C), and
# extra flags for it (the playground's test passes --state-file).
PLAYGROUND_DIR ?= $(CURDIR)
PLAYGROUND_FLAGS ?=

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z0-9_-]+:.*##/ {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

##@ Development

HELM_CHART := deploy/helm/keyroll

.PHONY: manifests
manifests: ## Generate the CRDs (deploy/crd) and RBAC (deploy/rbac) from the markers, copy them, with the admission policies and the alerts, into the Helm chart, and write the OLM bundle.
	$(CONTROLLER_GEN) crd paths=./apis/... output:crd:artifacts:config=deploy/crd
	test/tools/crd-conversion.sh deploy/crd/keyroll.dev_*.yaml
	$(CONTROLLER_GEN) rbac:roleName=keyroll-manager "paths={./controllers/...,./}" output:rbac:artifacts:config=deploy/rbac
	rm -f $(HELM_CHART)/crds/*.yaml
	cp deploy/crd/keyroll.dev_*.yaml $(HELM_CHART)/crds/
	cp deploy/rbac/role.yaml deploy/rbac/metrics_reader_role.yaml deploy/rbac/admission_policies.yaml $(HELM_CHART)/files/rbac/
	cp deploy/monitoring/alerts.yaml $(HELM_CHART)/files/monitoring/
	$(GO) run ./test/bundle

.PHONY: bundle
bundle: ## Write the OLM bundle (bundle/, bundle.Dockerfile) from deploy/default, the samples and the chart's metadata (make manifests does it too).
	$(GO) run ./test/bundle

.PHONY: generate
generate: ## Generate the deepcopy functions of the API types.
	$(CONTROLLER_GEN) object paths=./apis/...

.PHONY: verify-generated
verify-generated: ## Fail when regenerating the CRDs, RBAC or deepcopy code from the staged files changes one.
	test/tools/verify-generated.sh

.PHONY: fmt
fmt: ## Format the Go code.
	$(GO) fmt ./...

.PHONY: layout
layout: ## Print the packages: what each is for (its package comment) and what of ours it may import (controllers/layout_test.go).
	@$(GO) test ./controllers -run '^TestEveryPackageSaysWhatItIsFor$$' -count=1 -v | grep '^|'

.PHONY: vet
vet: ## Run go vet.
	$(GO) vet ./...

.PHONY: lint
lint: ## Run golangci-lint (.golangci.yml: vet, staticcheck, unused, errcheck, goimports, logr checks); builds golangci-lint alone.
	test/tools/build.sh $(TESTGROUND_BIN) golangci-lint
	$(TESTGROUND_BIN)/golangci-lint run --allow-parallel-runners ./...

##@ Test

# The test tiers (test/tools/packages.sh lists their packages) and the test-ground binaries each
# needs; the tool cache builds only those.
UNIT_PACKAGES = $(shell test/tools/packages.sh unit)
INTEGRATION_PACKAGES = $(shell test/tools/packages.sh integration)
E2E_PACKAGES = $(shell test/tools/packages.sh e2e)
INTEGRATION_TOOLS := etcd kube-apiserver kube-controller-manager kwok vault external-secrets kubectl helm kube-score trivy promtool olm-validate govulncheck vulndb-index
E2E_TOOLS := $(INTEGRATION_TOOLS) kubelet kube-proxy coredns ociimage

# make test runs every package but those with a real node of their own under test/sharedground:
# one test ground (control plane, real node, kwok, Vault, Redis, External Secrets Operator) that
# the packages work on at once, each in namespaces and Vault roles of its own; then the packages
# that start a real node of their own, one after another (the machine has one real node); then
# those whose timings need the machine to themselves (test/isolation).
OWN_NODE_PACKAGES = $(shell test/tools/packages.sh own-node)
ALONE_PACKAGES = $(shell test/tools/packages.sh alone)
SHARED_PACKAGES = $(filter-out $(OWN_NODE_PACKAGES) $(ALONE_PACKAGES),$(shell $(GO) list ./...))
# How many test binaries run at once on the shared ground: most of their time is spent waiting
# (leases, tokens, pods), not computing.
TEST_PARALLEL ?= 8

.PHONY: deps
deps: ## Install what the tests need (Debian packages) and build the test ground (cached).
	test/tools/install-deps.sh
	test/tools/build.sh $(TESTGROUND_BIN)

.PHONY: testground
testground: ## Build the test-ground binaries, or reuse the cached ones.
	test/tools/build.sh $(TESTGROUND_BIN)

.PHONY: unit
unit: ## The fast tier: every package outside test/, with fakes and a redis-server on loopback at most; no test ground.
	test/tools/install-deps.sh redis
	$(GO) test -race -count=1 -skip '^TestIntegration' $(UNIT_PACKAGES)

.PHONY: integration
integration: ## The control-plane tier: the packages under test/ whose ground has no real node, and vault's TestIntegration tests.
	test/tools/install-deps.sh redis
	test/tools/build.sh $(TESTGROUND_BIN) $(INTEGRATION_TOOLS)
	$(GO) test -race -count=1 -timeout 30m -run '^TestIntegration' ./vault/
	$(GO) test -race -count=1 -timeout 30m $(INTEGRATION_PACKAGES)

.PHONY: e2e
e2e: ## The real-node tier: the packages under test/ whose ground runs the real node (pods of Redis, consumers, the manager), on one shared ground as in make test.
	test/tools/install-deps.sh
	test/tools/build.sh $(TESTGROUND_BIN) $(E2E_TOOLS)
	$(GO) run ./test/sharedground -- $(GO) test -race -count=1 -p $(TEST_PARALLEL) -timeout 40m $(filter-out $(OWN_NODE_PACKAGES),$(E2E_PACKAGES))
	$(GO) test -race -count=1 -timeout 40m $(OWN_NODE_PACKAGES)

.PHONY: test-e2e
test-e2e: integration e2e ## Every test under test/ (the integration and e2e tiers).

.PHONY: test
test: deps lint verify-generated ## The whole test suite (what CI runs): every tier with -race; most packages at once on one shared test ground.
	$(GO) run ./test/sharedground -- $(GO) test -race -count=1 -p $(TEST_PARALLEL) -timeout 40m $(SHARED_PACKAGES)
	$(GO) test -race -count=1 -timeout 40m $(OWN_NODE_PACKAGES)
	$(GO) test -race -count=1 -timeout 30m $(ALONE_PACKAGES)

# The tests behind docs/reliability.md's "Long and messy rollouts" rows.
RELIABILITY_ROLLOUTS = ^(TestSupersededLeaseOutlivesALongRollout|TestTerminatingConsumerPodsAreWaitedFor|TestTokenEndingDuringRolloutReplacesInTime|TestExternalSecretRevokedOutsideIsCutOff|TestExternalSecretLedgerStaysWithinBounds|TestExternalSecretConnectionChangeRevokesThroughTheOld)$$

.PHONY: reliability
reliability: deps ## Run the fault matrix (test/faults) and the isolation test (test/isolation) and write their measured outcomes into docs/reliability.md.
	KEYROLL_RELIABILITY_DOC=$(CURDIR)/docs/reliability.md $(GO) test -count=1 -timeout 30m -v ./test/faults/ ./test/isolation/
	KEYROLL_RELIABILITY_DOC=$(CURDIR)/docs/reliability.md $(GO) run ./test/sharedground -- $(GO) test -count=1 -timeout 30m -v \
		-run '$(RELIABILITY_ROLLOUTS)' ./test/dataplane/ ./test/tokens/ ./test/integration/

.PHONY: bench-scale
bench-scale: deps ## Run only the scale suite (test/scale: issue at 100, 300, 1,000 clusters, busy cluster, steady state, isolation, side by side with ESO) and write its tables and plot into docs/.
	KEYROLL_PERFORMANCE_DOC=$(CURDIR)/docs/performance.md KEYROLL_PERFORMANCE_PLOT=$(CURDIR)/docs/performance.png \
		$(GO) test -run '^$$' -bench . -benchtime=1x -timeout 120m ./test/scale/

.PHONY: bench
bench: deps ## Run the benchmarks and report their numbers.
	$(GO) test -run '^$$' -bench . -benchmem -timeout 150m ./...

##@ Build and run

.PHONY: build
build: ## Build the manager binary into bin/keyroll.
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/keyroll .

.PHONY: plugin
plugin: ## Build the kubectl plugin into bin/kubectl-keyroll (put it on PATH: kubectl keyroll ...).
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/kubectl-keyroll ./cmd/kubectl-keyroll

.PHONY: run
run: ## Run the manager against the cluster of the current kubeconfig.
	$(GO) run . --leader-elect=false

.PHONY: image
image: ## Build the manager image $(IMG) as an OCI archive (bin/keyroll-image.tar) without Docker: the static binary and a CA bundle, non-root.
	@test -s $(CA_BUNDLE) || { echo "make image: no CA bundle at $(CA_BUNDLE), which the image needs to verify a Vault server's certificate: install Debian's ca-certificates (test/tools/install-deps.sh does), or set CA_BUNDLE to a PEM bundle" >&2; exit 1; }
	rm -rf bin/image-rootfs && mkdir -p bin/image-rootfs/tmp bin/image-rootfs/etc/ssl/certs && chmod 1777 bin/image-rootfs/tmp
	cp $(CA_BUNDLE) bin/image-rootfs/etc/ssl/certs/ca-certificates.crt && chmod 0644 bin/image-rootfs/etc/ssl/certs/ca-certificates.crt
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > bin/image-rootfs/etc/passwd
	printf 'root:x:0:\nnonroot:x:65532:\n' > bin/image-rootfs/etc/group
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/image-rootfs/keyroll .
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o bin/image-rootfs/keyroll-probe ./cmd/keyroll-probe
	$(GO) -C test/tools/ociimage build -trimpath -o $(CURDIR)/bin/ociimage .
	bin/ociimage -rootfs bin/image-rootfs -name $(IMG) -o $(IMAGE_ARCHIVE) \
		-entrypoint '["/keyroll"]' -user 65532:65532 \
		-label org.opencontainers.image.title=keyroll \
		-label org.opencontainers.image.description="The keyroll operator: Redis with credentials from Vault, rotated without downtime" \
		-label org.opencontainers.image.revision=$$(git rev-parse HEAD 2>/dev/null || echo unknown) \
		-label org.opencontainers.image.source=$(IMAGE_SOURCE) \
		-label org.opencontainers.image.version=$(VERSION)
	@echo "wrote $(IMAGE_ARCHIVE) ($(IMG)); import it with: ctr -n k8s.io images import $(IMAGE_ARCHIVE)"

.PHONY: docker-build
docker-build: ## Build the manager image (needs a Docker engine).
	docker build -t $(IMG) --build-arg VERSION=$(VERSION) --build-arg REVISION=$$(git rev-parse HEAD 2>/dev/null || echo unknown) .

##@ Deployment

.PHONY: install
install: ## Install the CRDs into the cluster of the current kubeconfig.
	kubectl apply -k deploy/crd

.PHONY: uninstall
uninstall: ## Remove the CRDs from the cluster.
	kubectl delete -k deploy/crd

.PHONY: deploy
deploy: ## Install CRDs, RBAC and the manager (kubectl apply -k deploy/default).
	kubectl apply -k deploy/default

.PHONY: undeploy
undeploy: ## Remove what deploy installed.
	kubectl delete -k deploy/default

##@ Playground

# What the playground runs, and kubectl and vault for the tour.
PLAYGROUND_TOOLS := etcd kube-apiserver kube-controller-manager kubelet kube-proxy coredns ociimage vault external-secrets kubectl

.PHONY: playground
playground: ## Run keyroll against a real local control plane, Vault and Redis, with the samples applied.
	test/tools/install-deps.sh
	test/tools/build.sh $(TESTGROUND_BIN) $(PLAYGROUND_TOOLS)
	$(GO) run ./test/playground --kubeconfig-out=$(PLAYGROUND_DIR)/playground.kubeconfig $(PLAYGROUND_FLAGS)
