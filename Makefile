# nomad-gpu: GPU scheduling for HashiCorp Nomad.
SHELL := /bin/bash
.DEFAULT_GOAL := help

TOOLS_DIR ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/nomad-gpu/tools
export TOOLS_DIR
BIN_DIR   := bin
GO        ?= go
PROTO_DIR := device-plugin/proto
PROTOS    := $(wildcard $(PROTO_DIR)/*/*.proto)
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.5.1
STATICCHECK_VERSION        := v0.8.2
DEMO_DIR  ?= $(CURDIR)/.demo
# go-nvml's cgo bindings warn about every deprecated NVML call.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
TEST_TIMEOUT ?= 30m
# Integration tests run side by side: each mostly waits on its agents (the
# suite averages about 1.2 of 2 cores; 4 at a time: 4m48s, 3: 5m40s+). 6 at a
# time took the integration package from 297-330 s to 238 s on a slower
# machine, but a full run failed at 6 and at 5: the load exposed races.
TEST_PARALLEL ?= 4

.PHONY: help
help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

.PHONY: build
build: ## Build nomad-device-gpu and gpu-broker into bin/
	$(GO) build -trimpath -ldflags "-X github.com/nomad-gpu/nomad-gpu/internal/version.Commit=$$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
	  -o $(BIN_DIR)/ ./cmd/...

.PHONY: release
release: ## Release VERSION=x.y.z into dist/: zips, .deb and .rpm for linux/amd64 and arm64, SHA256SUMS (reproducible; arm64 needs gcc-aarch64-linux-gnu)
	VERSION=$(VERSION) ./scripts/release.sh

# -vet=off: lint runs all of go vet on every package; go test's own vet
# repeated it beside the integration package (make test's CPU, user and
# system: 699 s with it, 507 s without, on 2 cores).
TEST_FLAGS = -race -count=1 -vet=off -timeout $(TEST_TIMEOUT) -parallel $(TEST_PARALLEL) -skip '^(TestSoak|TestSimToReal)$$'
# The broker's integration package is the longest by far (about 5 minutes,
# at about 1 of 2 cores alone): it starts at once, in a go test of its own, while
# lint and the other packages take the rest of the machine beside it, not
# before it or after it in go test's package order.
INTEGRATION := ./broker/integration/
# Through a variable: make -n runs recipe lines that name $(MAKE) itself.
SUBMAKE = $(MAKE) --no-print-directory

.PHONY: test
test: tools ## Lint and unit tests beside the integration tests (real Nomad and Consul, built by `make tools` first); the soak is `make soak`
	@$(GO) test $(TEST_FLAGS) $(INTEGRATION) & integ=$$!; rc=0; \
	  { $(SUBMAKE) lint && \
	    $(GO) test $(TEST_FLAGS) $$($(GO) list ./... | grep -v '/broker/integration$$'); } || rc=1; \
	  wait $$integ || rc=1; exit $$rc

.PHONY: test-unit
test-unit: ## Unit tests only (no agents)
	$(GO) test -race -count=1 -short ./...

.PHONY: lint
lint: ## gofmt, go vet and staticcheck
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$')); \
	  if [ -n "$$out" ]; then echo "gofmt would change: $$out"; exit 1; fi
	$(GO) vet ./...
	@[ -x $(TOOLS_DIR)/bin/staticcheck ] || GOBIN=$(TOOLS_DIR)/bin $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(TOOLS_DIR)/bin/staticcheck ./...

# Each fuzz target, as package:target. `make test` runs their seed corpora.
FUZZ_TARGETS := ./broker/nomadjob:FuzzReadRequest ./internal/jsondoc:FuzzParseReadsAsEncodingJSON ./broker/server:FuzzHandler ./broker/policyhcl:FuzzParse ./broker/config:FuzzLoad \
  ./device-plugin/plugin:FuzzDecodeConfig ./device-plugin/fake:FuzzStateFile ./broker/cluster:FuzzCutAllocationJobs
FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Fuzz every target for FUZZTIME each (default 30s)
	@for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; echo "== $$name ($$pkg, $(FUZZTIME))"; \
	  $(GO) test $$pkg -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

SOAK_DURATION ?= 5m

.PHONY: soak
soak: tools ## The soak test alone, for SOAK_DURATION (default 5m; CI runs it for 1m after `make test`)
	SOAK_DURATION=$(SOAK_DURATION) $(GO) test -race -count=1 -timeout 60m -run '^TestSoak$$' -v ./broker/integration/

.PHONY: gpu-check
gpu-check: build ## On a machine with an NVIDIA GPU and its driver: the plugin driven as Nomad would, with no Nomad (fingerprint, 10s of stats, health, a reservation); its raw output kept in docs/gpu-runs/
	@mkdir -p docs/gpu-runs
	@out=docs/gpu-runs/$$(date -u +%Y-%m-%dT%H%M%SZ)-$$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr -c 'A-Za-z0-9.\n-' '-' | tr -d '\n' || true).txt; \
	  { echo "# make gpu-check, $$(date -u), $$(uname -srm)"; nvidia-smi 2>&1 || true; bin/nomad-device-gpu check -backend nvml -stats 10s 2>&1; echo "# exit $$?"; } | tee "$$out"; \
	  echo "raw output kept in $$out: commit it beside the docs that quote it"; grep -q '^# exit 0$$' "$$out"

.PHONY: sim-check
sim-check: tools ## The simulator against a real cluster: one trace replayed on Nomad + Consul + the broker and in the simulator, compared (minutes; SIM_CHECK_POLICY=DIR checks another policy)
	SIM_CHECK_OUT=$(or $(SIM_CHECK_OUT),$(CURDIR)/sim-check.md) SIM_CHECK_POLICY=$(if $(SIM_CHECK_POLICY),$(abspath $(SIM_CHECK_POLICY))) $(GO) test -count=1 -timeout 30m -run '^TestSimToReal$$' -v ./broker/integration/

.PHONY: sim-grid
sim-grid: build ## The simulator on the grid the goals are held on: Philly at loads 0.9-1.2 and two seeds, Helios 1.2, a mixed and a small cluster (SIM_GRID_JOBS, default 100000; SIM_GRID_POLICY=DIR another policy; minutes)
	scripts/sim-grid.sh $(BIN_DIR)/gpu-broker $(or $(SIM_GRID_JOBS),100000)

.PHONY: bench
bench: ## Benchmarks, side by side with ratios to each group's baseline
	@$(GO) test -run '^$$' -bench . -benchmem -benchtime $(or $(BENCHTIME),1s) \
	  $$($(GO) list ./... | grep -v /integration) | awk -f scripts/benchtable.awk | grep -v '^\(ok\|PASS\)'
	@# Against real agents: a fixed count, since each run starts its own cluster;
	@# the queue's drain and a submission into a long queue are one measurement each.
	@$(GO) test -run '^$$' -bench 'BenchmarkRegister$$' -benchtime $(or $(AGENT_BENCHTIME),300x) ./broker/integration/ | awk -f scripts/benchtable.awk
	@$(GO) test -run '^$$' -bench 'BenchmarkQueueAdmission$$' -benchtime 1x ./broker/integration/ | awk -f scripts/benchtable.awk
	@$(GO) test -run '^$$' -bench 'BenchmarkQueuedSubmission$$' -benchtime 1x ./broker/integration/ | awk -f scripts/benchtable.awk
	@# 10,000 queued jobs of 20 KB behind two brokers: memory, idle cores, a submission, a failover.
	@$(GO) test -run '^$$' -bench 'BenchmarkLongQueue$$' -benchtime 1x ./broker/integration/ | awk -f scripts/benchtable.awk
	@# The drain once Nomad answers again after 20 s of 500s, for 8 and 1,000 entries.
	@$(GO) test -run '^$$' -bench 'BenchmarkQueueRecovery$$' -benchtime 1x ./broker/integration/ | awk -f scripts/benchtable.awk
	@# The same drain into two federated regions, the jobs leaving the region to the broker.
	@$(GO) test -run '^$$' -bench 'BenchmarkQueueAdmissionTwoRegions$$' -benchtime 1x ./broker/integration/ | awk -f scripts/benchtable.awk
	@# NVLink islands: multi-GPU allocations spanning islands, without and with island_groups.
	@$(GO) test -run '^$$' -bench 'BenchmarkIslandSpanning$$' -benchtime 1x ./device-plugin/integration/ | awk -f scripts/benchtable.awk
	@# The simulator at its goal's size: 10,000 GPUs, 1,000,000 jobs.
	@SIM_BENCH_JOBS=1000000 $(GO) test -run '^$$' -bench 'BenchmarkSimulate$$' -benchtime 1x ./broker/sim/ | awk -f scripts/benchtable.awk

.PHONY: demo
demo: tools build ## Local Consul + Nomad (2 clients x 8 simulated H100) with the plugin
	DEMO_DIR=$(DEMO_DIR) ./scripts/demo.sh up

.PHONY: demo-down
demo-down: ## Stop the demo and remove everything it left
	DEMO_DIR=$(DEMO_DIR) ./scripts/demo.sh down

.PHONY: tools
tools: ## Build Nomad v1.6.3, Consul v1.16.3 and OpenTofu v1.12.6 from the Go module proxy into TOOLS_DIR (once per machine)
	./scripts/build-tools.sh all

.PHONY: proto-tools
proto-tools:
	@command -v protoc >/dev/null || { echo "protoc is missing: apt-get install protobuf-compiler"; exit 1; }
	GOBIN=$(TOOLS_DIR)/bin $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(TOOLS_DIR)/bin $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)

.PHONY: proto
proto: proto-tools ## Regenerate the Go code of the plugin protocol and check wire compatibility
	PATH=$(TOOLS_DIR)/bin:$$PATH protoc -I$(PROTO_DIR) -I/usr/include \
	  --go_out=$(PROTO_DIR) --go_opt=paths=source_relative \
	  --go-grpc_out=$(PROTO_DIR) --go-grpc_opt=paths=source_relative \
	  $(patsubst $(PROTO_DIR)/%,%,$(PROTOS))
	@if [ -x ../shared/protocheck/check.sh ]; then \
	  bash ../shared/protocheck/check.sh $(PROTO_DIR) $(PROTOS) && echo "proto: wire-compatible with Nomad v1.6"; fi
