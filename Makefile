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

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*##/ {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build bin/idemgate (static, CGO off).
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/idemgate ./cmd/idemgate

.PHONY: demo
demo: build ## Run the one-process demo (memory store, payments upstream, Envoy-faithful front on 127.0.0.1:8080).
	@# Built first rather than `go run`, which exits 1 after Ctrl-C even when the demo stopped cleanly.
	$(BIN_DIR)/idemgate demo

.PHONY: envoy
envoy: ## Install Envoy $(ENVOY_VERSION) (.envoy-version) into .envoy/ unless ENVOY_BIN or a pinned envoy on PATH is found.
	@bin=$(ENVOY) && echo "envoy: $$bin"

.PHONY: services
services: ## Make sure Redis and PostgreSQL answer on the test addresses (starts throwaway ones if not).
	@.ci/services.sh

.PHONY: test
test: services envoy ## Run every test (unit, integration, e2e through real Envoy) with the race detector.
	ENVOY_BIN=$(ENVOY) $(TEST_ENV) $(GO) test -race -count=1 -timeout 45m $(GO_TEST_ARGS) ./...

SEED     ?= 15
DURATION ?= 2m
.PHONY: chaos
chaos: services envoy ## Seeded chaos run through real Envoy and 3 idemgate replicas (SEED=15 DURATION=2m, split between both upstream modes); prints its report.
	ENVOY_BIN=$(ENVOY) $(TEST_ENV) $(GO) test -count=1 -v -run '^TestChaos$$' -timeout 3h ./e2e/chaos/ \
		-args -chaos.seed=$(SEED) -chaos.duration=$(DURATION)

.PHONY: test-race
test-race: test ## Same as test: the suite always runs with -race.

.PHONY: test-short
test-short: ## Unit tests only (no services needed).
	$(GO) test -short -count=1 $(GO_TEST_ARGS) ./...

.PHONY: bench
bench: services build ## Micro-benchmarks, then the ext_proc load benchmark that writes BENCHMARKS.md.
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 1s ./fingerprint/... ./state/... ./extproc/...
	@if [ -d e2e/loadgen ]; then $(GO) run ./e2e/loadgen -out BENCHMARKS.md; else echo "load benchmark: not built yet"; fi

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 60s).
	$(GO) test ./fingerprint -run '^$$' -fuzz '^FuzzVerify$$' -fuzztime $${FUZZTIME:-60s}
	$(GO) test ./fingerprint -run '^$$' -fuzz '^FuzzCanonicalize$$' -fuzztime $${FUZZTIME:-60s}

.PHONY: lint
lint: ## go vet and a gofmt check.
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: check-config
check-config: ## Validate every idemgate config shipped in the repository (secrets named, not read).
	@for f in $$(git ls-files '*idemgate.yaml' | grep -v testdata); do \
		$(GO) run ./cmd/idemgate check-config --offline --config $$f >/dev/null || exit 1; echo "ok   $$f"; done

.PHONY: clean
clean: ## Remove build output.
	rm -rf $(BIN_DIR)
