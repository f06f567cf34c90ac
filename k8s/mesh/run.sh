#!/usr/bin/env bash
# make test-mesh: the control planes as judges of the files shipped in k8s/.
# Builds the tools once into .mesh/bin (git-ignored; a version stamp beside
# each binary decides whether it is rebuilt), then runs the three judges:
#   envoy-gateway     Envoy Gateway standalone + the pinned Envoy + idemgate
#                     (tiered store, on the shipped unix socket: the ext_proc
#                     cluster is a pipe) + the demo payments API k8s/mesh/envoygateway
#   istio             Istio's config generator (own Go module) k8s/mesh/istio,
#                     its idemgate filter in the pinned Envoy with idemgate
#                     (memory store, a body-only preview), and
#                     `istioctl analyze --use-kube=false`
#   kubectl-validate  every rendered manifest, Kubernetes 1.35 k8s/mesh/kubectlvalidate
# Each judge's name is printed with its result and time; a judge that skips
# a test fails. Needs ENVOY_BIN (the Makefile passes the pinned Envoy) and the
# services of `make services` (the Envoy Gateway judge starts its own Redis
# and database on them).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
export PATH="/usr/local/go/bin:$PATH"

# The pins. Envoy Gateway's is the API version go.mod holds for the manifests.
EG_VERSION=v1.9.1
KUSTOMIZE_VERSION=v5.8.2   # v5.8.3 needs Go 1.27
# kubectl-validate has no release with schemas past 1.30: the commit that
# added 1.35 (2026-01-05).
KUBECTL_VALIDATE_VERSION=v0.0.5-0.20260105161640-a97ccfaca20b
ISTIO_VERSION="$(awk '$1 == "istio.io/istio" {print $2; exit}' k8s/mesh/istio/go.mod)"

bin="$root/.mesh/bin"
mkdir -p "$bin"
say() { echo "mesh: $*"; }
now() { date +%s; }

# tool NAME VERSION COMMAND...: runs COMMAND (which builds $bin/NAME) unless
# the binary with that version stamp is already there.
tool() {
  local name=$1 version=$2 start
  shift 2
  if [ -x "$bin/$name" ] && [ "$(cat "$bin/$name.version" 2>/dev/null)" = "$version" ]; then
    say "$name $version: cached in .mesh/bin"
    return
  fi
  say "building $name $version into .mesh/bin (once)..."
  start=$(now)
  rm -f "$bin/$name" "$bin/$name.version"
  "$@"
  echo "$version" > "$bin/$name.version"
  say "built $name in $(( $(now) - start ))s"
}

# GOFLAGS is cleared for the installs: .ci/run sets -mod=readonly, which
# `go install pkg@version` and the judge module do not need.
build_start=$(now)
tool envoy-gateway "$EG_VERSION" env GOBIN="$bin" GOFLAGS= go install "github.com/envoyproxy/gateway/cmd/envoy-gateway@$EG_VERSION"
tool kustomize "$KUSTOMIZE_VERSION" env GOBIN="$bin" GOFLAGS= go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
tool kubectl-validate "$KUBECTL_VALIDATE_VERSION" env GOBIN="$bin" GOFLAGS= go install "sigs.k8s.io/kubectl-validate@$KUBECTL_VALIDATE_VERSION"
tool istioctl "$ISTIO_VERSION" env -C k8s/mesh/istio GOFLAGS= go build -o "$bin/istioctl" istio.io/istio/istioctl/cmd/istioctl
say "tools ready in $(( $(now) - build_start ))s"

export ENVOY_GATEWAY_BIN="$bin/envoy-gateway" KUSTOMIZE_BIN="$bin/kustomize" \
  KUBECTL_VALIDATE_BIN="$bin/kubectl-validate" IDEMGATE_REQUIRE_SERVICES=1
[ -n "${ENVOY_BIN:-}" ] || ENVOY_BIN="$(.ci/envoy.sh)"
export ENVOY_BIN

# The judges' own code: vet with the tag that builds it (make lint's
# ./... does not see it).
go vet -tags mesh ./k8s/mesh/...
(cd k8s/mesh/istio && GOFLAGS= go vet .)

failed=()
logs="$root/.mesh/logs"
mkdir -p "$logs"
# judge NAME COMMAND...: runs one judge, its output in .mesh/logs/NAME.log
# and on the terminal; a skipped test is a failure.
judge() {
  local name=$1 start status=0
  shift
  say "== judge: $name"
  start=$(now)
  set +e
  { "$@"; echo $? > "$logs/$name.rc"; } 2>&1 | tee "$logs/$name.log" |
    grep --line-buffered -E '^(--- |    --- |ok |FAIL)|judge:|IST[0-9]|^Error|as it must'
  set -e
  status=$(cat "$logs/$name.rc")
  if grep -q -- '--- SKIP' "$logs/$name.log"; then
    say "judge $name skipped a test: that is a failure here"
    status=1
  fi
  if [ "$status" -eq 0 ]; then
    say "ok   judge $name ($(( $(now) - start ))s)"
  else
    say "FAIL judge $name ($(( $(now) - start ))s, full output in .mesh/logs/$name.log)"
    failed+=("$name")
  fi
}

# analyze FILE: istioctl analyze on rendered manifests; prints its findings
# other than the one every EnvoyFilter gets (IST0133 "EnvoyFilter exposes
# internal implementation details"), and fails if there are any.
analyze() {
  local out
  out="$("$bin/istioctl" analyze --use-kube=false --failure-threshold Error "$1" 2>&1)" || { echo "$out"; return 1; }
  out="$(grep -E '^(Error|Warning|Info) \[' <<<"$out" | grep -v 'EnvoyFilter exposes internal implementation details' || true)"
  if [ -n "$out" ]; then echo "$out"; return 1; fi
}

istio_judge() {
  (cd k8s/mesh/istio && GOFLAGS= go test -count=1 -v .) || return 1
  local rendered="$root/.mesh/istio-rendered.yaml" broken="$root/.mesh/istio-broken.yaml" findings
  "$KUSTOMIZE_BIN" build k8s/istio > "$rendered"
  echo "judge: istioctl analyze --use-kube=false (k8s/istio rendered): warnings fail"
  analyze "$rendered" || return 1
  # It can fail: the AuthorizationPolicy without its ports (IST0133, found
  # this way) and the EnvoyFilter without its priority (IST0151).
  "$KUSTOMIZE_BIN" build k8s/mesh/istio/testdata/analyze-broken > "$broken"
  findings="$(analyze "$broken" || true)"
  if grep -q 'IST0133.*AuthorizationPolicy' <<<"$findings" && grep -q IST0151 <<<"$findings"; then
    echo "judge: istioctl analyze reports IST0133 and IST0151 on a copy without ports and priority, as it must"
  else
    echo "judge: istioctl analyze did not catch the broken copy"
    return 1
  fi
}

judge envoy-gateway go test -tags mesh -race -count=1 -v -timeout 20m ./k8s/mesh/envoygateway/
judge istio istio_judge
judge kubectl-validate go test -tags mesh -race -count=1 -v -timeout 10m ./k8s/mesh/kubectlvalidate/

if [ ${#failed[@]} -gt 0 ]; then
  say "FAILED judges: ${failed[*]}"
  exit 1
fi
say "all judges passed: envoy-gateway istio kubectl-validate"
