# proxyshift Makefile, in the kubebuilder go/v4 style.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

CONTROLLER_GEN := go tool controller-gen
# The test control plane (kube-apiserver, etcd, kubectl) built from Go modules
# and cached under ~/.cache/proxyshift; hack/controlplane.sh prints its dir.
ASSETS = $(shell hack/controlplane.sh)

.PHONY: all
all: build

##@ Development

.PHONY: manifests
manifests: ## Generate CRDs and RBAC roles from the Go markers.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=proxyshift-operator paths=./controllers/... output:rbac:artifacts:config=config/rbac/operator
	$(CONTROLLER_GEN) rbac:roleName=proxyshift-agent paths=./nodeagent/... output:rbac:artifacts:config=config/rbac/agent

.PHONY: generate
generate: ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: fmt
fmt: ## Run gofmt on the tree.
	gofmt -w $$(git ls-files '*.go')

.PHONY: verify
verify: ## Fail when generated files, formatting or go.mod are stale.
	hack/verify.sh

.PHONY: controlplane
controlplane: ## Build (once) and print the test control plane directory.
	@hack/controlplane.sh

.PHONY: test
test: verify ## Run every test: real API server, real netfilter, then the VM's kernel tests.
	hack/install-deps.sh
	KUBEBUILDER_ASSETS="$(ASSETS)" hack/gotest.sh ./...
	hack/fuzz.sh
	hack/vm/run.sh

.PHONY: test-e2e
test-e2e: ## Run the end-to-end tests (local 3-node cluster, mode switches under traffic); as root.
	hack/install-deps.sh
	KUBEBUILDER_ASSETS="$(ASSETS)" hack/gotest.sh -v ./test/e2e/

.PHONY: fuzz
fuzz: ## Run every Go fuzz target for FUZZTIME each (default 5s; make test does this too).
	hack/fuzz.sh

.PHONY: test-vm
test-vm: ## Run the kernel-module and IPVS tests in a VM booting Debian's stock kernel.
	hack/vm/run.sh

.PHONY: bench-vm
bench-vm: ## Run the IPVS, nftables and iptables benchmarks in the test VM (emulated: compare them with each other, not with the host).
	PROXYSHIFT_VM_RUN='^$$' PROXYSHIFT_VM_BENCH="$${PROXYSHIFT_VM_BENCH:-.}" \
	PROXYSHIFT_VM_MEMORY="$${PROXYSHIFT_VM_MEMORY:-2048}" PROXYSHIFT_VM_TIMEOUT="$${PROXYSHIFT_VM_TIMEOUT:-3600}" hack/vm/run.sh

.PHONY: bench
bench: ## Benchmark the agent beside kube-proxy v1.37.2 (built once from its module), nftables and iptables, 1k/5k/10k Services; writes docs/benchmarks.md; as root. BENCH_FLAGS="-sizes 1000 -modes nftables"
	@if [ "$$(id -u)" != 0 ]; then echo "make bench needs root: it creates network namespaces and programs netfilter inside them. Run: sudo make bench" >&2; exit 1; fi
	hack/install-deps.sh
	CGO_ENABLED=0 go build -o bin/proxyshift-agent ./cmd/agent
	go build -o bin/bench ./hack/bench
	bin/bench -kube-proxy "$$(hack/kube-proxy.sh)" -assets "$(ASSETS)" -agent bin/proxyshift-agent -write docs/benchmarks.md $(BENCH_FLAGS)

##@ Build

.PHONY: build
build: ## Build the operator and the agent into bin/.
	CGO_ENABLED=0 go build -o bin/proxyshift-operator ./cmd/operator
	CGO_ENABLED=0 go build -o bin/proxyshift-agent ./cmd/agent

.PHONY: cluster
cluster: ## Run a local cluster (API server, operator, 3 node namespaces with agents, pods, Services) until Ctrl-C; as root. CLUSTER_FLAGS="-nodes 5 -mode iptables"
	go build -o bin/localcluster ./hack/cluster
	exec bin/localcluster $(CLUSTER_FLAGS)

.PHONY: demo
demo: ## Demo: a local 3-node cluster moved iptables -> nftables -> iptables under traffic, then torn down; as root. DEMO_FLAGS="-no-back -rate 20"
	@if [ "$$(id -u)" != 0 ]; then echo "make demo needs root: it creates network namespaces and programs netfilter inside them. Run: sudo make demo" >&2; exit 1; fi
	hack/install-deps.sh
	go build -o bin/demo ./hack/demo
	exec bin/demo $(DEMO_FLAGS)

.PHONY: run
run: ## Run the operator against the cluster in $KUBECONFIG.
	go run ./cmd/operator --leader-elect=false

##@ Deployment

.PHONY: install
install: manifests ## Install the CRDs into the cluster in $KUBECONFIG.
	kubectl apply -k config/crd

.PHONY: uninstall
uninstall: ## Remove the CRDs from the cluster in $KUBECONFIG.
	kubectl delete -k config/crd --ignore-not-found

.PHONY: deploy
deploy: manifests ## Install everything (CRDs, RBAC, operator, agent) into $KUBECONFIG.
	kubectl apply -k config/default

.PHONY: undeploy
undeploy: ## Remove everything deploy installed.
	kubectl delete -k config/default --ignore-not-found

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-14s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
