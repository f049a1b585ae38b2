#!/usr/bin/env bash
# Brings up the local cluster, installs the CRDs and RBAC, starts ax-operator in the background
# (outside the cluster, under its own ServiceAccount token), applies the example task and shows it.
#
#   e2e/run-operator.sh          start (or restart) the operator; the cluster is reused if up
#   e2e/run-operator.sh stop     stop the operator started here
#   e2e/run-operator.sh plugin [BINARY]   link kubectl-ax (default: the debug build), and
#                                kubectl_complete-ax beside it, into the tools dir that
#                                `e2e/cluster.sh env` puts on PATH: `kubectl ax` works
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${AX_E2E_DIR:-/var/lib/ax-e2e}
PIDFILE=$STATE/ax-operator.pid
LOG=$STATE/ax-operator.log

stop() {
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    kill "$(cat "$PIDFILE")"
    echo "ax-operator stopped"
  fi
  rm -f "$PIDFILE"
}
# kubectl runs any `kubectl-NAME` on PATH as `kubectl NAME`.
link_plugin() {
  local binary=${1:-${CARGO_TARGET_DIR:-target}/debug/kubectl-ax} tools=${AX_CACHE:-/var/cache/ax}/tools
  [ -x "$binary" ] || { echo "no kubectl-ax at $binary (cargo build --bin kubectl-ax)" >&2; return 1; }
  mkdir -p "$tools"
  ln -sfn "$(realpath "$binary")" "$tools/kubectl-ax"
  # kubectl (1.26+) runs it for `kubectl ax <TAB>`; linked when built beside kubectl-ax.
  local complete
  complete=$(dirname "$binary")/kubectl_complete-ax
  if [ -x "$complete" ]; then ln -sfn "$(realpath "$complete")" "$tools/kubectl_complete-ax"; fi
}
if [ "${1:-}" = stop ]; then stop; exit 0; fi
if [ "${1:-}" = plugin ]; then link_plugin "${2:-}"; exit 0; fi

e2e/cluster.sh up --sim-nodes 3
eval "$(e2e/cluster.sh env)"
cargo build -q --bin ax-operator --bin kubectl-ax --bin kubectl_complete-ax
link_plugin
kubectl apply --server-side --force-conflicts -f crds/ >/dev/null
kubectl apply -f config/rbac.yaml >/dev/null
e2e/cluster.sh sa-kubeconfig ax-system ax-operator "$STATE/ax-operator.kubeconfig"
stop
KUBECONFIG=$STATE/ax-operator.kubeconfig setsid "${CARGO_TARGET_DIR:-target}/debug/ax-operator" --identity local >>"$LOG" 2>&1 &
echo $! >"$PIDFILE"
echo "ax-operator running (pid $(cat "$PIDFILE"), log $LOG)"

kubectl apply -f examples/hello.yaml
for _ in $(seq 1 120); do
  phase=$(kubectl get axtask hello -o jsonpath='{.status.phase}' 2>/dev/null || true)
  case $phase in Succeeded | Dead | Canceled) break ;; esac
  sleep 1
done
kubectl get axtasks
cat <<EOT

The cluster and the operator keep running. Try:
  eval "\$(e2e/cluster.sh env)"       # KUBECONFIG and kubectl for this shell
  kubectl apply -f examples/retry.yaml && kubectl get axt -w
  kubectl describe axtask hello
  kubectl ax list && kubectl ax describe hello && kubectl ax top
  e2e/run-operator.sh stop && e2e/cluster.sh down   # when done
EOT
