# idemgate — make help lists the targets.
SHELL := /usr/bin/env bash
export PATH := /usr/local/go/bin:$(PATH)

GO           ?= go
BIN_DIR      ?= bin
VERSION      ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS      := -s -w -X github.com/idemgate/idemgate/cmd/idemgate/mainlib.Version=$(VERSION)
GO_TEST_ARGS ?=
# make test requires the services it starts: a missing one fails instead of skipping.
TEST_ENV     := IDEMGATE_REQUIRE_SERVICES=1
# The one pin of the Envoy version: .envoy-version (read by .ci/envoy.sh, the
# tests and the image tags' check).
ENVOY_VERSION := $(shell cat .envoy-version)
# ENVOY = the pinned Envoy's absolute path, installed into .envoy/ when missing.
ENVOY         = $$(.ci/envoy.sh)
STATICCHECK_VERSION := v0.8.2

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/idemgate (static, CGO off).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/idemgate ./cmd/idemgate

.PHONY: demo
demo: ## Run the demo: the pinned Envoy on 127.0.0.1:8080 in front of idemgate serve (memory store) and the demo payments API; prints curl commands.
	@# Envoy is installed (once, with a progress line) while the two binaries build.
	@# Built rather than `go run`, which exits 1 after Ctrl-C even when the demo
	@# stopped cleanly. idemgate-demo runs bin/idemgate and Envoy as its children.
	@envoy_out=$$(mktemp) && { .ci/envoy.sh >"$$envoy_out" & envoy_pid=$$!; } && \
	  CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/ ./cmd/idemgate ./cmd/idemgate-demo; built=$$?; \
	  wait $$envoy_pid; installed=$$?; envoy=$$(cat "$$envoy_out"); rm -f "$$envoy_out"; \
	  [ $$built -eq 0 ] && [ $$installed -eq 0 ] || exit 1; \
	  exec $(BIN_DIR)/idemgate-demo --envoy "$$envoy" --idemgate $(BIN_DIR)/idemgate

.PHONY: envoy
envoy: ## Install Envoy $(ENVOY_VERSION) (.envoy-version) into .envoy/ unless ENVOY_BIN or a pinned envoy on PATH is found.
	@bin=$(ENVOY) && echo "envoy: $$bin"

.PHONY: services
services: ## Make sure Redis and PostgreSQL answer on the test addresses (starts throwaway ones if not).
	@.ci/services.sh

.PHONY: test
test: services envoy test-monitoring ## Run every test (unit, integration, e2e through real Envoy) with the race detector.
	ENVOY_BIN=$(ENVOY) $(TEST_ENV) $(GO) test -race -count=1 -timeout 45m $(GO_TEST_ARGS) ./...

SEED     ?= 15
DURATION ?= 2m
.PHONY: chaos
chaos: services envoy ## Seeded chaos run through real Envoy and 3 idemgate replicas (SEED=15 DURATION=2m, split between both upstream modes); prints its report.
	ENVOY_BIN=$(ENVOY) $(TEST_ENV) $(GO) test -count=1 -v -run '^TestChaos$$' -timeout 3h ./e2e/chaos/ \
		-args -chaos.seed=$(SEED) -chaos.duration=$(DURATION)

.PHONY: test-monitoring
test-monitoring: ## deploy/monitoring offline (own Go module): promtool check/test rules and a mutation of each alert, the dashboard against Grafana's schema, PromQL parsing, runbook sections, the k8s copies.
	cd deploy/monitoring/check && $(GO) test -count=1 ./...

# make soak's DURATION defaults to 20m (chaos's DURATION default does not apply).
SOAK_DURATION = $(if $(filter file undefined,$(origin DURATION)),20m,$(DURATION))
SOAK_TIMEOUT ?= 3h
.PHONY: soak
soak: services envoy ## Soak (DURATION=20m): chaos agents at a steady rate with periodic faults; fails if idemgate's RSS, goroutines, fds, PostgreSQL connections or Redis memory grow after warm-up; writes docs/soak/.
	ENVOY_BIN=$(ENVOY) $(TEST_ENV) $(GO) test -tags soak -count=1 -v -run '^TestSoak$$' -timeout $(SOAK_TIMEOUT) ./e2e/soak/ \
		-args -soak.duration=$(SOAK_DURATION) -soak.out=$(CURDIR)/docs/soak

.PHONY: test-mesh
test-mesh: services envoy ## The control planes judge k8s/: Envoy Gateway standalone, Istio's generator + istioctl analyze, kubectl-validate (tools built once into .mesh/).
	ENVOY_BIN=$(ENVOY) k8s/mesh/run.sh

.PHONY: test-race
test-race: test ## Same as test: the suite always runs with -race.

.PHONY: test-short
test-short: ## Unit tests only (no services needed).
	$(GO) test -short -count=1 $(GO_TEST_ARGS) ./...

.PHONY: bench
bench: services envoy build ## Micro-benchmarks, then the load benchmarks (ext_proc level, then through the pinned Envoy) that write BENCHMARKS.md; about 27 minutes on 2 cores.
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 1s ./fingerprint/... ./state/... ./extproc/...
	ENVOY_BIN=$(ENVOY) $(GO) run ./e2e/loadgen -out BENCHMARKS.md

RECORDS ?= 10000000
.PHONY: bench-retention
bench-retention: services ## Removing a day of records out of RECORDS (default 10M): row-by-row sweeper vs partition drop (time, WAL, confirm latency) and bytes per record; writes its section of BENCHMARKS.md. Not part of make test (minutes, gigabytes).
	$(GO) run ./e2e/retentionbench -records $(RECORDS) -out BENCHMARKS.md

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 60s); the binding rule's for BINDING_FUZZTIME (default 5m).
	$(GO) test ./fingerprint -run '^$$' -fuzz '^FuzzVerify$$' -fuzztime $${FUZZTIME:-60s}
	$(GO) test ./fingerprint -run '^$$' -fuzz '^FuzzCanonicalize$$' -fuzztime $${FUZZTIME:-60s}
	$(GO) test ./fingerprint -run '^$$' -fuzz '^FuzzBinding$$' -fuzztime $${BINDING_FUZZTIME:-5m}

.PHONY: lint
lint: ## go vet, the encoding/json import guard, gofmt, staticcheck (pinned) and `go mod tidy` leaving go.mod/go.sum unchanged.
	$(GO) vet ./...
	$(GO) test -run 'TestEncodingJSONStaysOffTheRequestPath' ./internal/jsonx/
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	GOFLAGS=-mod=mod $(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	@tmp=$$(mktemp -d); cp go.mod go.sum "$$tmp"/; GOFLAGS=-mod=mod $(GO) mod tidy; \
	 if ! cmp -s go.mod "$$tmp/go.mod" || ! cmp -s go.sum "$$tmp/go.sum"; then \
	   echo "go mod tidy changed go.mod/go.sum: run it and commit the result"; cp "$$tmp"/go.mod "$$tmp"/go.sum .; rm -rf "$$tmp"; exit 1; fi; \
	 rm -rf "$$tmp"

.PHONY: check-config
check-config: ## Validate every idemgate config shipped in the repository (secrets named, not read).
	@for f in $$(git ls-files '*idemgate.yaml' | grep -v testdata); do \
		$(GO) run ./cmd/idemgate check-config --offline --config $$f >/dev/null || exit 1; echo "ok   $$f"; done

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN_DIR)
