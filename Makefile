# kube-dispatch: the two commands are `make demo` and `make test`; the rest is for developers.
# Every target builds or installs what it needs and reuses what is already built.

SHELL := bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

CLUSTER := tests/cluster/cluster.sh
CARGO ?= cargo

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{ printf "  make %-14s %s\n", $$1, $$2 }'

.PHONY: demo
demo: ## Run kube-dispatch on a local control plane (KEEP=1 leaves it running)
	@tests/demo.sh

.PHONY: test
test: ## Everything CI checks: versions, fmt, clippy, all tests against a real API server
	@tests/run-tests.sh

.PHONY: test-skew
test-skew: ## Version skew on the real node: the previous release (deploy/releases) built from its commit, installed with its chart and controllers, upgraded to this tree with helm upgrade while writing, then rolled back to it (~25 min; needs root): lost 0 and concurrent 0
	@tests/skew.sh

.PHONY: test-matrix
test-matrix: ## The API-server-facing suites on the older Kubernetes minors (1.36, 1.35; ~15 min each, plus ~20 min to build each minor once): MINORS="1.35" for one
	@MINORS="$(MINORS)" tests/matrix.sh

.PHONY: chaos
chaos: ## Long chaos run, then the fuzz targets: DURATION=seconds (600), SEED=n (the clock), FAULTS=kinds (all), FUZZ_SECONDS (60)
	@tests/cluster/cluster.sh up >/dev/null
	KD_CHAOS_SECONDS=$${DURATION:-600} KD_CHAOS_SEED=$${SEED:-} KD_CHAOS_FAULTS=$${FAULTS:-} $(CARGO) test --locked -p kube-dispatch-tests --test faults -- --ignored --exact chaos::long_chaos --nocapture
	@$(MAKE) --no-print-directory fuzz

.PHONY: chaos-soak
chaos-soak: ## The short chaos mode over many seeds, a line each and a total: SEEDS=n (10), SEED=first (the clock)
	@tests/cluster/cluster.sh up >/dev/null
	KD_CHAOS_SOAK_SEEDS=$${SEEDS:-10} KD_CHAOS_SEED=$${SEED:-} KD_CHAOS_FAULTS=$${FAULTS:-} $(CARGO) test --locked -p kube-dispatch-tests --test faults -- --ignored --exact chaos::chaos_soak --nocapture

.PHONY: model
model: ## Deep check of the protocol model (model/): ARGS passes flags (see --help), e.g. ARGS="--dispatchers 2 --max-states 20000000"
	$(CARGO) run --locked --release -p kube-dispatch-model -- $${ARGS:-}

.PHONY: model-replay
model-replay: ## A chaos run's faults through the model: REPORT=file (a failing seed's report as make chaos-soak prints it), ARGS as for make model
	@test -n "$(REPORT)" || { echo "model-replay: give REPORT=<file with a chaos report>" >&2; exit 2; }
	$(CARGO) run --locked --release -p kube-dispatch-model -- --replay "$(REPORT)" $${ARGS:---dfs --max-depth 40 --timeout 600}

.PHONY: image
image: ## Build the image kube-dispatch:dev without a registry (buildah, FROM scratch): BUILDER=docker for docker
	@deploy/image.sh --builder $${BUILDER:-buildah}

.PHONY: node-up
node-up: ## Start (or reuse) one real node: kubelet, containerd, runc, kube-scheduler, kube-proxy (needs root)
	@tests/node/node.sh up

.PHONY: node-down
node-down: ## Stop the node and put the machine back (processes, mounts, cgroups, iptables, sysctls)
	@tests/node/node.sh down

.PHONY: e2e
e2e: ## deploy/ on the real node: rolling update, pod deletion, evictions, scaling, with a writer (~5 min)
	@tests/e2e.sh

.PHONY: bench
bench: ## Benchmarks against kube-rs Controller, into its page in bench/results/ (~15 min): OBJECTS, KINDS, REPEATS, LONG=1
	@bench/run.sh

.PHONY: bench-go
bench-go: ## The Go SDK: the controller-runtime controller ported to it against controller-runtime itself (and the Rust SDK), ConfigMaps at 10 000 and 100 000 objects (~15 min), into its page in bench/results/: OBJECTS, REPEATS, VARIANTS
	@GO_SDK=1 bench/run.sh

.PHONY: bench-groups
bench-groups: ## Many controllers on one tier: K = 1, 5, 10 controllers at 10 000 objects against K kube-rs and K controller-runtime (~10 min), into its page in bench/results/: CONTROLLERS, OBJECTS, NAMESPACES (spread over many, e.g. 1000), RING_KEY (name or namespace), MIX=1 (a mix of resources: the controllers spread over ConfigMaps and Records; K = 2, 5, 10)
	@CONTROLLERS=$${CONTROLLERS:-$${MIX:+2,5,10}} CONTROLLERS=$${CONTROLLERS:-1,5,10} bench/run.sh

.PHONY: bench-owners
bench-owners: ## Controllers with children: Records owning 5 ConfigMaps each, at 1 000 and 10 000 owners, the tier (children from the requests, or listed) against kube-rs owns and controller-runtime Owns, writes to owners and to children (~25 min), into its page in bench/results/: CHILDREN, OBJECTS, REPEATS, WRITES, VARIANTS; NAMESPACES=N spreads the owners over N namespaces (section owners-namespaces), with RING_KEY=namespace for server-side sharding
	@CHILDREN=$${CHILDREN:-5} bench/run.sh

.PHONY: bench-index
bench-index: ## Controllers that find their children through an index: Records owning 5 ConfigMaps at 1 000 owners, each reconcile listing its children, controller-runtime's field index and kube-rs's store against the Go SDK's index (dispatch.NewCache) and the Rust SDK's reads::children (~10 min), into its page in bench/results/: CHILDREN, OBJECTS, REPEATS, WRITES, VARIANTS
	@INDEX=1 bench/run.sh

.PHONY: bench-scale
bench-scale: ## A million objects: 100 000 and 1 000 000 ConfigMaps of 300 bytes, one controller on the tier against kube-rs (listing by streaming) and controller-runtime, with every process's memory (~60 min, 24 GiB machine), into its page in bench/results/: OBJECTS, OBJECT_BYTES, REPEATS, WRITES, VARIANTS
	@SCALE=1 bench/run.sh

.PHONY: bench-security
bench-security: ## What TLS and token reviews cost: latency with security off and on, reviews per minute with 1 000 sessions (~4 min), into its page in bench/results/
	$(CARGO) build --profile dist --locked --quiet -p kube-dispatch-bench --bin kube-dispatch-bench
	@tests/cluster/cluster.sh up >/dev/null
	target/dist/kube-dispatch-bench security

.PHONY: bench-hostile
bench-hostile: ## A legitimate controller's write-to-reconcile p50/p99 and losses alone and under each attack of the threat table at its bound, with the dispatcher's peak RSS (~1 min), into its page in bench/results/: REPEATS, WRITES, ATTACKS (e.g. reconnect-storm; the baseline always runs; KD_BENCH_OUT=/tmp/x.md keeps the page)
	$(CARGO) build --profile dist --locked --quiet -p kube-dispatch-dispatcher -p kube-dispatch-bench --bins
	@tests/cluster/cluster.sh up >/dev/null
	target/dist/kube-dispatch-bench hostile $${REPEATS:+--repeats $$REPEATS} $${WRITES:+--writes $$WRITES} $${ATTACKS:+--attacks $$ATTACKS} --command "make bench-hostile$${REPEATS:+ REPEATS=$$REPEATS}$${WRITES:+ WRITES=$$WRITES}$${ATTACKS:+ ATTACKS=$$ATTACKS}"

.PHONY: bench-metrics
bench-metrics: ## What metrics cost a reconcile: throughput and write-to-reconcile p99 with metrics off and on (~3 min), into its page in bench/results/
	$(CARGO) build --profile dist --locked --quiet -p kube-dispatch-bench --bin kube-dispatch-bench
	@tests/cluster/cluster.sh up >/dev/null
	target/dist/kube-dispatch-bench metrics $${OBJECTS:+--objects $$OBJECTS} $${REPEATS:+--repeats $$REPEATS} --command "make bench-metrics$${OBJECTS:+ OBJECTS=$$OBJECTS}$${REPEATS:+ REPEATS=$$REPEATS}"

.PHONY: bench-ceiling
bench-ceiling: ## Scale ceiling: watch events one dispatcher absorbs per core, writes at rising RATES (~2 min), into its page in bench/results/
	$(CARGO) build --profile dist --locked --quiet -p kube-dispatch-dispatcher -p kube-dispatch-loadbalancer -p kube-dispatch-bench --bins
	@tests/cluster/cluster.sh up >/dev/null
	target/dist/kube-dispatch-bench ceiling $${OBJECTS:+--objects $$OBJECTS} $${RATES:+--rates $$RATES} --command "make bench-ceiling$${OBJECTS:+ OBJECTS=$$OBJECTS}$${RATES:+ RATES=$$RATES}"

.PHONY: bench-shards
bench-shards: ## Server-side sharding: the ring keyed by namespace against the ring keyed by name on NAMESPACES namespaces of OBJECTS ConfigMaps (default 1000 x 100, ~15 min), into its page in bench/results/
	$(CARGO) build --profile dist --locked --quiet -p kube-dispatch-dispatcher -p kube-dispatch-loadbalancer -p kube-dispatch-bench --bins
	@tests/cluster/cluster.sh up >/dev/null
	target/dist/kube-dispatch-bench shards $${NAMESPACES:+--namespaces $$NAMESPACES} $${OBJECTS:+--objects $$OBJECTS} $${WRITES:+--writes $$WRITES} --command "make bench-shards$${NAMESPACES:+ NAMESPACES=$$NAMESPACES}$${OBJECTS:+ OBJECTS=$$OBJECTS}$${WRITES:+ WRITES=$$WRITES}"

.PHONY: bench-daily
bench-daily: ## A controller's own rollout and a rolling upgrade of the tier under it, each controller as it runs in production: kube-rs with a cold standby, controller-runtime under leader election with a cold and a warm standby (EnableWarmup), the tier with a standby load balancer and two replicas (~15 min), into its page in bench/results/: OBJECTS, CHILDREN (each object a Record owning that many ConfigMaps), REPEATS, SHAPES
	$(CARGO) build --profile dist --locked --quiet -p kube-dispatch-dispatcher -p kube-dispatch-loadbalancer -p kube-dispatch-bench --bins
	@tests/cluster/cluster.sh up >/dev/null
	target/dist/kube-dispatch-bench daily --controller-runtime "$$(bench/controller-runtime/build.sh)" $${OBJECTS:+--objects $$OBJECTS} $${CHILDREN:+--children $$CHILDREN} $${REPEATS:+--repeats $$REPEATS} $${SHAPES:+--shapes $$SHAPES} --command "make bench-daily$${OBJECTS:+ OBJECTS=$$OBJECTS}$${CHILDREN:+ CHILDREN=$$CHILDREN}$${REPEATS:+ REPEATS=$$REPEATS}$${SHAPES:+ SHAPES=$$SHAPES}"

.PHONY: bench-core
bench-core: ## Micro-benchmark of the dispatch core (requests/s per core, bytes per key)
	$(CARGO) bench -p kube-dispatch-core --bench dispatch_core

.PHONY: release-assets
release-assets: ## The archive of the static dispatcher and load balancer, with its SHA-256, that the Go SDK's dispatchtest fetches from a release (deploy/release-assets.sh): PROFILE (dist)
	@deploy/release-assets.sh --profile $${PROFILE:-dist}

.PHONY: publish-check
publish-check: ## cargo publish --dry-run of the crates a controller needs (the SDK, its wire and telemetry crates, and kube-dispatch-testing with the dispatcher it runs), each packaged and built alone (~5 min)
	$(CARGO) publish --dry-run --locked -p kube-dispatch-proto -p kube-dispatch-telemetry -p kube-dispatch-controller \
		-p kube-dispatch-core -p kube-dispatch-server -p kube-dispatch-dispatcher -p kube-dispatch-testing

.PHONY: binaries
binaries: ## Build (once) kube-apiserver, kube-controller-manager, kubectl, etcd, kubelet, kube-scheduler, kube-proxy
	@tests/cluster/build-binaries.sh

.PHONY: cluster-up
cluster-up: ## Start (or reuse) the local control plane; prints the kubeconfig path
	@$(CLUSTER) up

.PHONY: cluster-down
cluster-down: ## Stop the local control plane; leaves no process or port behind
	@$(CLUSTER) down

.PHONY: cluster-status
cluster-status: ## Say whether the local control plane is running
	@$(CLUSTER) status

.PHONY: protobuf-table
protobuf-table: ## Write the dispatcher's table of the Kubernetes types' protobuf and JSON forms (dispatcher/src/watch/protobuf/table.txt) from the k8s.io/api that dispatcher/k8s-protobuf/go.mod pins
	cd dispatcher/k8s-protobuf && go run . > ../src/watch/protobuf/table.txt

.PHONY: fmt
fmt: ## Format the Rust code
	$(CARGO) fmt --all

.PHONY: lint
lint: ## cargo fmt --check and clippy with warnings as errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings

.PHONY: fuzz
fuzz: ## Fuzz request decoding and the work queue: FUZZ_SECONDS per target (60); needs nightly
	@command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	cd fuzz && for target in requests queue; do \
	  $(CARGO) +nightly fuzz run $$target -- -max_total_time=$${FUZZ_SECONDS:-60} -rss_limit_mb=2048 || exit 1; \
	done
