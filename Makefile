# Loom's development loop: make generate manifests lint test.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

TOOLS := hack/tools/build.sh
CONTROLLER_GEN = $(shell $(TOOLS) controller-gen)/controller-gen
GOLANGCI_LINT = $(shell $(TOOLS) golangci-lint)/golangci-lint
HELM = $(shell $(TOOLS) helm)/helm
GO_TEST_FLAGS ?=
BIN := bin
# The version stamped into the binary (loom version, the first log line, the
# loom.dev/crd-version annotation on the CRDs the manager applies).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/loom-dev/loom/internal/manager.buildVersion=$(VERSION)

EXTERNAL_CRDS := config/crd/external
# The GPU rules evaluated by Prometheus's own engine: a test-only module, so
# that Prometheus's dependencies stay out of Loom's go.mod.
RULETEST := controllers/monitoring/assets/ruletest
MONITORING_CRDS := podmonitors servicemonitors prometheusrules prometheuses prometheusagents

.PHONY: help
help: ## List targets.
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

##@ Run

.PHONY: demo
demo: build ## Run Loom on a local simulated GPU cluster until Ctrl-C.
	go build -o $(BIN)/loom-demo ./e2e/cmd/demo
	exec $(BIN)/loom-demo --loom $(BIN)/loom

.PHONY: bench
bench: tools ## Loom vs KubeRay v1.5.0 (CLUSTERS RayClusters, default 100, on NODES nodes, default as many) and vs Training Operator v1.8.1 and the floor (a PODS-pod gang, default 512; JOBS concurrent 1+7 jobs, default 20), REPS repetitions (default 3); one table of ratios; then 500 waiting TrainingJobs while GPUs churn.
	go run ./e2e/cmd/bench compare --clusters $(or $(CLUSTERS),100) --nodes $(or $(NODES),0) --gang-pods $(or $(PODS),512) --jobs $(or $(JOBS),20) --reps $(or $(REPS),3)
	go run ./e2e/cmd/bench pending

.PHONY: bench-pending
bench-pending: ## 500 TrainingJobs waiting for GPUs while others finish and start: the manager's writes per minute.
	go run ./e2e/cmd/bench pending

.PHONY: bench-fleet
bench-fleet: tools ## The fleet benchmark: NODES simulated GPU nodes (default 1000, 10,000 pods; 5000 needs a bigger machine), gang, jobs, RayClusters, idle; one table (~7 min).
	go run ./e2e/cmd/bench fleet --nodes $(or $(NODES),1000)

.PHONY: bench-gpu-stack
bench-gpu-stack: ## ClusterPolicy apply-to-Ready and API requests on NODES simulated GPU nodes (default 500).
	go run ./e2e/cmd/bench gpu-stack --nodes $(or $(NODES),500)

.PHONY: bench-raycluster
bench-raycluster: ## CLUSTERS RayClusters × 4 pods (default 100): time to all ready, manager peak RSS and writes.
	go run ./e2e/cmd/bench raycluster --clusters $(or $(CLUSTERS),100)

.PHONY: bench-training
bench-training: ## Pods/s creating a PODS-pod TrainingJob gang (default 512) at Loom's and client-go's client limits.
	go run ./e2e/cmd/bench gang --pods $(or $(PODS),512) --nodes $$(( ($(or $(PODS),512) + 7) / 8 ))

##@ Build

.PHONY: build
build: kubectl-loom ## Build the loom (manager) and loom-node-agent binaries and the kubectl loom plugin into bin/.
	CGO_ENABLED=0 go build -ldflags "$(LDFLAGS)" -o $(BIN)/loom ./cmd/manager
	CGO_ENABLED=1 go build -ldflags "$(LDFLAGS)" -o $(BIN)/loom-node-agent ./cmd/node-agent

.PHONY: kubectl-loom
kubectl-loom: ## Build the kubectl plugin into bin/kubectl-loom (put bin/ on PATH for `kubectl loom`).
	go build -o $(BIN)/kubectl-loom ./cmd/kubectl-loom

.PHONY: tools
tools: ## Build every pinned tool into the cache (once per version).
	$(TOOLS) kube kwok helm controller-gen golangci-lint prometheus-operator kueue kuberay training-operator >/dev/null

##@ Generate

.PHONY: generate
generate: ## Generate deepcopy code from the API types.
	@if [ -d apis ]; then $(CONTROLLER_GEN) object paths=./apis/...; fi

.PHONY: manifests
manifests: ## Generate CRDs and RBAC into the chart, and the third-party CRDs tests install.
	rm -rf charts/loom/crds charts/loom/files/rbac charts/loom/files/rbac-agent
	@if [ -d apis ]; then $(CONTROLLER_GEN) crd:generateEmbeddedObjectMeta=true paths=./apis/... output:crd:dir=charts/loom/crds; fi
	go run ./hack/crdtrim charts/loom/crds/training.loom.dev_trainingjobs.yaml
	$(CONTROLLER_GEN) rbac:roleName=loom-manager paths=./internal/manager/... paths=./controllers/... output:rbac:dir=charts/loom/files/rbac
	$(CONTROLLER_GEN) rbac:roleName=loom-node-agent paths=./internal/agent/... output:rbac:dir=charts/loom/files/rbac-agent
	cp charts/loom/values.yaml charts/loom/files/values.yaml
	rm -rf $(EXTERNAL_CRDS) && mkdir -p $(EXTERNAL_CRDS)
	$(CONTROLLER_GEN) crd:maxDescLen=0 paths=volcano.sh/apis/pkg/apis/scheduling/v1beta1 output:crd:dir=$(EXTERNAL_CRDS)
	tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
		$(CONTROLLER_GEN) crd:maxDescLen=0 paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 \
			paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1alpha1 output:crd:dir=$$tmp && \
		for k in $(MONITORING_CRDS); do cp $$tmp/monitoring.coreos.com_$$k.yaml $(EXTERNAL_CRDS)/; done
	cp "$$(go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)/config/crd/bases/ray.io_rayclusters.yaml" $(EXTERNAL_CRDS)/
	cp "$$(go list -m -f '{{.Dir}}' github.com/ray-project/kuberay/ray-operator)/config/crd/bases/ray.io_rayjobs.yaml" $(EXTERNAL_CRDS)/
	chmod 644 $(EXTERNAL_CRDS)/*.yaml
	rm -rf internal/manager/crds controllers/raycluster/crd controllers/rayjob/crd
	go run ./hack/crdpack -pkg manager -out internal/manager/crdhash_generated.go -dir internal/manager/crds charts/loom/crds/*.yaml
	go run ./hack/crdpack -pkg raycluster -out controllers/raycluster/crdhash_generated.go -dir controllers/raycluster/crd $(EXTERNAL_CRDS)/ray.io_rayclusters.yaml
	go run ./hack/crdpack -pkg rayjob -out controllers/rayjob/crdhash_generated.go -dir controllers/rayjob/crd $(EXTERNAL_CRDS)/ray.io_rayjobs.yaml

.PHONY: verify
verify: generate manifests ## Fail when generated files or go.mod are stale.
	go mod tidy && (cd hack/tools && go mod tidy) && (cd hack/tools/prometheus-operator && go mod tidy) && (cd $(RULETEST) && go mod tidy)
	@if [ -n "$$(git status --porcelain -- . )" ]; then \
		echo "generated files are stale; run 'make generate manifests' and 'go mod tidy', then commit:"; \
		git status --porcelain -- .; git --no-pager diff --stat; exit 1; fi

##@ Check

.PHONY: fmt
fmt: ## gofmt the tree.
	gofmt -s -w $$(git ls-files --cached --others --exclude-standard '*.go' | grep -v zz_generated)

.PHONY: vet
vet: ## go vet.
	go vet ./...

.PHONY: lint
lint: ## golangci-lint (includes import-direction rules).
	$(GOLANGCI_LINT) run ./...
	cd $(RULETEST) && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...

# The fuzz targets of the pure functions, as package:target; `make test`
# runs each briefly (FUZZTIME), `make fuzz` for longer. Crashers found are
# kept under the package's testdata/fuzz and replayed by every go test.
FUZZ_TARGETS := ./controllers/nodelabels:FuzzLabels ./internal/gang:FuzzPodRequests \
	./controllers/training:FuzzDecide ./controllers/raycluster:FuzzDecide \
	./controllers/clusterpolicy:FuzzDesired ./controllers/driverupgrade:FuzzNext \
	./apis/gpu/v1alpha1:FuzzLabelSelectorPattern
# A count of inputs, not a duration: with a duration, Go 1.26's fuzzing
# coordinator can fail a target with a bare "context deadline exceeded" at
# the deadline on a busy machine (go.dev/issue/75804, fixed in Go 1.27); a
# count has no deadline to race. `make fuzz FUZZTIME=60s` still works.
FUZZTIME ?= 3000x

.PHONY: test
test: tools ## Every tier: unit, integration (envtest), end to end (simulated cluster), and a short fuzz run.
	KUBEBUILDER_ASSETS="$$($(TOOLS) kube)" go test $(GO_TEST_FLAGS) -timeout 40m ./...
	cd $(RULETEST) && go test $(GO_TEST_FLAGS) ./...
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(FUZZTIME)

.PHONY: fuzz
fuzz: ## Fuzz every pure decision function for FUZZTIME each (default 3000x, inputs; try FUZZTIME=60s).
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$pkg $$fn ($(FUZZTIME))"; \
		KUBEBUILDER_ASSETS="$$($(TOOLS) kube)" go test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; done

.PHONY: test-unit
test-unit: ## Unit and integration tests only (skips e2e/).
	KUBEBUILDER_ASSETS="$$($(TOOLS) kube)" go test $(GO_TEST_FLAGS) $$(go list ./... | grep -v /e2e)
	cd $(RULETEST) && go test $(GO_TEST_FLAGS) ./...

.PHONY: e2e
e2e: tools build ## End-to-end tests only.
	go test $(GO_TEST_FLAGS) -timeout 40m ./e2e/... -v -count=1
