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
generate: ## Generate DeepCopy methods and the Dockerfiles (from images/*/image.yaml).
	$(CONTROLLER_GEN) object paths=./api/...
	for spec in $(IMAGE_SPECS); do go run ./hack/images -spec $$spec -dockerfile > $$(dirname $$spec)/Dockerfile; done

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
test: verify ## Run every test: real API server, real netfilter, the real-node cluster, the fuzz targets, and beside them the VM's kernel tests.
	hack/install-deps.sh
	hack/test.sh

.PHONY: test-e2e
test-e2e: ## Run the end-to-end tests (local 3-node cluster, mode switches under traffic); as root.
	hack/install-deps.sh
	KUBEBUILDER_ASSETS="$(ASSETS)" hack/gotest.sh -v ./test/e2e/

.PHONY: fuzz
fuzz: ## Run every Go fuzz target for a bounded number of inputs (about 5 s each; FUZZTIME overrides; make test does this too).
	hack/fuzz.sh

.PHONY: test-real
test-real: ## Run the real-node cluster's test (3 nodes with containerd and kubelet v1.37.2, kube-proxy, a Deployment; test/realcluster); as root.
	hack/install-deps.sh
	hack/realcluster.sh >/dev/null
	hack/gotest.sh -v ./test/realcluster/

.PHONY: test-vm
test-vm: ## Run the kernel-module and IPVS tests in a VM booting Debian's stock kernel.
	hack/vm/run.sh

.PHONY: bench-vm
bench-vm: ## In the test VM (emulated: compare the figures with each other, not with the host's): the IPVS, nftables and iptables backends' benchmarks, and make bench's harness in IPVS mode, kube-proxy v1.37.2 beside the agent at VMBENCH_SIZES (default 1000,5000) Services, written into docs/benchmarks.md.
	status=0; PROXYSHIFT_VM_RUN='^TestIPVSBesideKubeProxy$$' PROXYSHIFT_VM_BENCH="$${PROXYSHIFT_VM_BENCH:-.}" \
	PROXYSHIFT_VM_ENV="PROXYSHIFT_VMBENCH_SIZES=$${VMBENCH_SIZES:-1000,5000} PROXYSHIFT_VMBENCH_CHANGES=100 PROXYSHIFT_VMBENCH_CONNECTS=200 PROXYSHIFT_VMBENCH_SYNC_TIMEOUT=20m PROXYSHIFT_VMBENCH_CHANGE_TIMEOUT=15m PROXYSHIFT_VMBENCH_CHANGE_BUDGET=10m" \
	PROXYSHIFT_VM_TEST_TIMEOUT="$${PROXYSHIFT_VM_TEST_TIMEOUT:-100m}" \
	PROXYSHIFT_VM_MEMORY="$${PROXYSHIFT_VM_MEMORY:-2048}" PROXYSHIFT_VM_TIMEOUT="$${PROXYSHIFT_VM_TIMEOUT:-7200}" hack/vm/run.sh || status=$$?; \
	hack/vm/bench-report.sh docs/benchmarks.md; exit $$status

.PHONY: bench
bench: ## Benchmark the agent beside kube-proxy v1.37.2 (built once from its module), both with their shipped defaults, nftables and iptables, 1k/5k/10k Services, the agent's mode switch at 10k, then the operator at 10k simulated nodes; writes docs/benchmarks.md and its charts; as root. BENCH_FLAGS="-sizes 1000 -modes nftables -operator-nodes 1000"
	@if [ "$$(id -u)" != 0 ]; then echo "make bench needs root: it creates network namespaces and programs netfilter inside them. Run: sudo make bench" >&2; exit 1; fi
	hack/install-deps.sh
	CGO_ENABLED=0 go build -o bin/proxyshift-agent ./cmd/agent
	CGO_ENABLED=0 go build -o bin/proxyshift-operator ./cmd/operator
	go build -o bin/bench ./hack/bench
	bin/bench -kube-proxy "$$(hack/kube-proxy.sh)" -assets "$(ASSETS)" -agent bin/proxyshift-agent -write docs/benchmarks.md $(BENCH_FLAGS)

##@ Build

.PHONY: build
build: ## Build the operator, the agent and the kubectl plugin (kubectl-proxyshift) into bin/.
	CGO_ENABLED=0 go build -o bin/proxyshift-operator ./cmd/operator
	CGO_ENABLED=0 go build -o bin/proxyshift-agent ./cmd/agent
	CGO_ENABLED=0 go build -o bin/kubectl-proxyshift ./cmd/kubectl-proxyshift

.PHONY: cluster
cluster: ## Run a local cluster (API server, operator, 3 node namespaces with agents, pods, Services) until Ctrl-C; as root. CLUSTER_FLAGS="-nodes 5 -mode iptables"
	go build -o bin/localcluster ./hack/cluster
	exec bin/localcluster $(CLUSTER_FLAGS)

.PHONY: cluster-real
cluster-real: ## Run the real-node cluster (control plane, 3 nodes with containerd and kubelet v1.37.2, kube-proxy, a Deployment) until Ctrl-C; as root. CLUSTER_REAL_FLAGS="-nodes 2"
	@if [ "$$(id -u)" != 0 ]; then echo "make cluster-real needs root: it creates network, mount and PID namespaces and cgroups. Run: sudo make cluster-real" >&2; exit 1; fi
	hack/install-deps.sh
	hack/realcluster.sh >/dev/null
	go build -o bin/cluster-real ./hack/cluster-real
	exec bin/cluster-real $(CLUSTER_REAL_FLAGS)

.PHONY: demo
demo: ## Demo on real kubelets: kube-proxy (iptables) -> proxyshift nftables -> kube-proxy under traffic, node by node, then torn down; as root. DEMO_FLAGS="-no-back -rate 20"
	@if [ "$$(id -u)" != 0 ]; then echo "make demo needs root: it runs kubelets and containerd in network namespaces. Run: sudo make demo" >&2; exit 1; fi
	hack/install-deps.sh
	hack/realcluster.sh >/dev/null
	go build -o bin/demo ./hack/demo
	exec bin/demo $(DEMO_FLAGS)

.PHONY: demo-lab
demo-lab: ## Demo in the namespace lab (agents as processes, no kubelets): iptables -> nftables -> iptables under traffic; as root. DEMO_LAB_FLAGS="-no-back -rate 20"
	@if [ "$$(id -u)" != 0 ]; then echo "make demo-lab needs root: it creates network namespaces and programs netfilter inside them. Run: sudo make demo-lab" >&2; exit 1; fi
	hack/install-deps.sh
	go build -o bin/demo-lab ./hack/demo-lab
	exec bin/demo-lab $(DEMO_LAB_FLAGS)

.PHONY: run
run: ## Run the operator against the cluster in $KUBECONFIG.
	go run ./cmd/operator --leader-elect=false

##@ Images

# The images: images/<name>/image.yaml says what goes into each; `make
# images` builds them with hack/images (no Docker, no registry) as OCI
# archives under bin/images/, named as config/ refers to them. Every file is
# dated at the commit, so a rebuild of the same commit gives the same digest.
IMAGE_SPECS := images/operator/image.yaml images/agent/image.yaml
REGISTRY ?= ghcr.io/proxyshift
TAG ?= dev
IMG_OPERATOR ?= $(REGISTRY)/proxyshift-operator:$(TAG)
IMG_AGENT ?= $(REGISTRY)/proxyshift-agent:$(TAG)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
export SOURCE_DATE_EPOCH

.PHONY: images
images: ## Build bin/images/proxyshift-{operator,agent}.oci.tar (import: ctr -n k8s.io images import FILE); prints their digests.
	hack/install-deps.sh
	go build -o bin/images-tool ./hack/images
	bin/images-tool -spec images/operator/image.yaml -ref $(IMG_OPERATOR) -out bin/images/proxyshift-operator.oci.tar
	bin/images-tool -spec images/agent/image.yaml -ref $(IMG_AGENT) -out bin/images/proxyshift-agent.oci.tar

.PHONY: docker-build
docker-build: ## Build the images with Docker instead (same contents; the generated images/*/Dockerfile). IMG_OPERATOR=... IMG_AGENT=...
	docker build -f images/operator/Dockerfile -t $(IMG_OPERATOR) .
	docker build -f images/agent/Dockerfile -t $(IMG_AGENT) .

.PHONY: docker-push
docker-push: ## Push the images docker-build built.
	docker push $(IMG_OPERATOR)
	docker push $(IMG_AGENT)

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
