#!/usr/bin/env bash
# Runs every test of ax: unit and property tests, then the end-to-end tests on a real local
# cluster that this script brings up (and takes down again unless AX_E2E_KEEP=1).
#
#   e2e/run-tests.sh            everything
#   AX_E2E_KEEP=1 e2e/run-tests.sh   leave the cluster running afterwards (faster reruns)
#   AX_E2E_FRESH=1 e2e/run-tests.sh  take down any existing cluster first (always so when CI=true)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
STATE=${AX_E2E_DIR:-/var/lib/ax-e2e}
ARTIFACTS=${AX_E2E_ARTIFACTS:-$ROOT/target/e2e}
mkdir -p "$ARTIFACTS"
export CARGO_TERM_COLOR=never RUST_BACKTRACE=1

declare -a SUMMARY=()
FAILED=0
START=$(date +%s)

phase() { printf '\n=== %s\n' "$*"; PHASE_START=$(date +%s); }
phase_done() { SUMMARY+=("$(printf '%-28s %4ss  %s' "$1" "$(( $(date +%s) - PHASE_START ))" "$2")"); }
run_phase() { # name, command...
  local name=$1; shift
  phase "$name"
  if "$@"; then phase_done "$name" ok; else phase_done "$name" FAILED; FAILED=1; fi
}

OPERATOR_PID=
stop_operator() {
  if [ -n "$OPERATOR_PID" ] && kill -0 "$OPERATOR_PID" 2>/dev/null; then
    kill "$OPERATOR_PID" 2>/dev/null || true
    wait "$OPERATOR_PID" 2>/dev/null || true
  fi
  OPERATOR_PID=
}
finish() {
  stop_operator
  if [ "${AX_E2E_KEEP:-0}" != 1 ]; then
    phase "cluster down"
    e2e/cluster.sh down || true
  fi
  printf '\n=== summary (%ss in all)\n' "$(( $(date +%s) - START ))"
  printf '%s\n' "${SUMMARY[@]}"
}
trap finish EXIT

crds_fresh() {
  local fresh; fresh=$(mktemp -d)
  # The crdgen the build above made: `cargo run` would build it again with other features.
  "${CARGO_TARGET_DIR:-$ROOT/target}/debug/crdgen" "$fresh"
  if ! diff -r crds "$fresh" >/dev/null; then
    echo "crds/ is stale: run 'cargo run --bin crdgen crds' and commit the result" >&2
    diff -r crds "$fresh" | head -20 >&2
    return 1
  fi
  local crd
  for crd in crds/*.yaml; do
    if [ -d charts/ax-operator/crds ] && ! cmp -s "$crd" "charts/ax-operator/crds/$(basename "$crd")"; then
      echo "charts/ax-operator/crds/$(basename "$crd") differs from $crd: copy crds/*.yaml into the chart" >&2
      return 1
    fi
  done
}

df -h "$ROOT" | tail -1 | awk '{print "disk: " $4 " free of " $2 " at the start"}'
phase "build"
# One package per invocation: building both together unifies their features differently from the
# per-package test runs below, which would then rebuild everything.
cargo build --all-targets
cargo build -p ax-sim --all-targets
phase_done build ok

unit_tests() { cargo test --lib --bins && cargo test -p ax-sim -p ax-bench --lib --bins; }
run_phase "unit and property tests" unit_tests
run_phase "crds up to date" crds_fresh
run_phase "docs links" cargo test --test docs_links

phase "cluster up"
# In CI, start from nothing: a cluster left by an earlier run (or its leftovers, if its processes
# were killed) must not leak old objects into this one.
if [ "${CI:-}" = true ] || [ "${AX_E2E_FRESH:-0}" = 1 ]; then
  e2e/cluster.sh down
fi
e2e/cluster.sh up --sim-nodes 3
phase_done "cluster up" ok
eval "$(e2e/cluster.sh env)"
export KUBECTL=$(command -v kubectl)
HELM=$(command -v helm)
export HELM

run_phase "helm lint" "$HELM" lint --strict charts/ax-operator
# The chart's PrometheusRule and Grafana dashboard as rendered by helm: promtool check + alert unit
# tests (tests/monitoring/alerts.test.yaml). No cluster needed; promtool comes with Debian's
# prometheus, which install.sh installs.
run_phase "chart monitoring (promtool)" cargo test --test chart_monitoring
run_phase "chart values (helm)" cargo test --test chart_values

phase "install CRDs, RBAC, operator"
kubectl apply --server-side --force-conflicts -f crds/ >/dev/null
kubectl apply -f config/rbac.yaml >/dev/null
# The operator runs under its own ServiceAccount, so the tests exercise its real RBAC.
e2e/cluster.sh sa-kubeconfig ax-system ax-operator "$STATE/ax-operator.kubeconfig"
export AX_OPERATOR_KUBECONFIG=$STATE/ax-operator.kubeconfig
export AX_OPERATOR_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/ax-operator
# Where the shared operator serves /metrics; tests/e2e_prometheus.rs points its Prometheus there.
export AX_OPERATOR_METRICS_ADDR=127.0.0.1:18080
# The callback tests' receiver listens on 127.0.0.2: the operator calls it only because this
# allowlist names it (127.0.0.1 stays refused, which another test checks).
export AX_CALLBACK_ALLOW=${AX_CALLBACK_ALLOW:-127.0.0.2/32}
# Tests assert on series of their own made-up task types, hundreds in a run: no `other` here.
export AX_METRICS_MAX_TYPES=${AX_METRICS_MAX_TYPES:-100000}
start_operator() {
  KUBECONFIG=$AX_OPERATOR_KUBECONFIG RUST_LOG=${RUST_LOG:-info,ax=debug} AX_METRICS_ADDR=$AX_OPERATOR_METRICS_ADDR \
    "$AX_OPERATOR_BIN" --identity e2e >>"$ARTIFACTS/operator.log" 2>&1 &
  OPERATOR_PID=$!
}
start_operator
phase_done "install CRDs, RBAC, operator" ok

# Tests that start, kill or install operators themselves run after the shared one is stopped.
OWN_OPERATOR=(e2e_restart e2e_traces e2e_writes e2e_readiness e2e_fencing_disruption e2e_cron_restart e2e_cli_restart e2e_memory e2e_helm)
# Tests that need the shared operator but measure rates or capacity, or time a worker's stop on the
# real kubelet (e2e_fencing: beside 60 other tests its sandbox teardown took 40 s and a worker's
# exit code was lost), or load the cluster for minutes (e2e_fanout: 2,000 children, 200 at a time;
# beside 100 other tests a test waited 19 s to see a task Running), run on their own beside it.
ALONE=(e2e_capacity e2e_fencing e2e_fanout)
shared=()
for t in tests/e2e_*.rs; do
  name=$(basename "$t" .rs)
  [[ " ${OWN_OPERATOR[*]} ${ALONE[*]} " == *" $name "* ]] || shared+=(--test "$name")
done
# nextest runs the tests of every file side by side (cargo test would run the files one after
# another); each test has a namespace of its own.
if cargo nextest --version >/dev/null 2>&1; then
  run_phase "e2e: shared operator" cargo nextest run --no-fail-fast --test-threads 16 \
    --status-level fail --final-status-level slow "${shared[@]}"
else
  run_phase "e2e: shared operator" cargo test "${shared[@]}" -- --test-threads 16
fi
for name in "${ALONE[@]}"; do
  [ -f "tests/$name.rs" ] && run_phase "e2e: ${name#e2e_} (shared operator, alone)" cargo test --test "$name" -- --test-threads 4
done
stop_operator
# The image the Helm tests install: the debug operator every other e2e test runs, with its loader
# and libraries (e2e/image.sh). A release build of the Dockerfile's static binary would compile the
# whole dependency tree again (13 minutes on 2 CPUs) to test the same code.
export AX_OPERATOR_IMAGE=${AX_OPERATOR_IMAGE:-localhost/ax-operator:dev}
operator_image() {
  e2e/image.sh "$AX_OPERATOR_BIN" "$AX_OPERATOR_IMAGE" && IMAGE_OK=1
}
IMAGE_OK=0
[ -f tests/e2e_helm.rs ] && run_phase "operator image" operator_image
for name in "${OWN_OPERATOR[@]}"; do
  [ -f "tests/$name.rs" ] || continue
  if [ "$name" = e2e_helm ] && [ "$IMAGE_OK" != 1 ]; then
    SUMMARY+=("$(printf '%-28s %4ss  %s' "e2e: helm" 0 "SKIPPED (no operator image)")")
    continue
  fi
  run_phase "e2e: ${name#e2e_}" cargo test --test "$name" -- --test-threads 1
done
# The chaos soak (README "Chaos soak"): its own HA pair of operators under a seeded schedule of
# faults, then an audit of every worker pod. It stops the API server, etcd and the kubelet, so it
# runs alone, after every other e2e test (about 12 minutes; AX_CHAOS_IN_CI=0 leaves it out).
chaos_soak() {
  cargo build -q -p ax-bench &&
    "${CARGO_TARGET_DIR:-$ROOT/target}/debug/ax-bench" --cluster-dir "$STATE" chaos \
      --tasks "${AX_CHAOS_TASKS:-500}" --minutes "${AX_CHAOS_MINUTES:-8}" \
      --seed "${AX_CHAOS_SEED:-1}" --faults all --log-dir "$ARTIFACTS/chaos"
}
if [ "${AX_CHAOS_IN_CI:-1}" = 1 ]; then
  run_phase "e2e: chaos soak" chaos_soak
fi
run_phase "e2e: sim nodes" cargo test -p ax-sim --test sim_pods
run_phase "harness tests" e2e/test-harness.sh

if [ "$FAILED" != 0 ]; then
  # What a failure on another machine needs first: free disk, the nodes' conditions and taints.
  df -h "$ROOT" "$STATE" 2>/dev/null || true
  kubectl get nodes -o custom-columns='NODE:.metadata.name,TAINTS:.spec.taints[*].key,CONDITIONS:.status.conditions[?(@.status=="True")].type' 2>/dev/null || true
  kubectl get pods -A --field-selector=status.phase=Pending --no-headers 2>/dev/null | head -20 || true
  echo "operator log: $ARTIFACTS/operator.log (last lines below)"
  tail -n 40 "$ARTIFACTS/operator.log" || true
fi
exit "$FAILED"
