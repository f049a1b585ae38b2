#!/usr/bin/env bash
# Tests of the cluster harness itself: its failure paths and basics. They run against a separate
# state dir on other ports, so a cluster running at the default state dir is left alone (it is
# only asked, read-only, whether a second `up` is a fast no-op). Never starts a kubelet: two
# kubelets on one machine share /var/log/pods. Assumes e2e/install.sh has completed.
# Prints "N passed, M failed" last; exits non-zero when anything failed.
set -uo pipefail

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CLUSTER=$E2E_DIR/cluster.sh
PASSED=0
FAILED=0

pass() { PASSED=$((PASSED + 1)); printf 'ok   %s\n' "$1"; }
fail() { FAILED=$((FAILED + 1)); printf 'FAIL %s\n' "$1"; [ -n "${2:-}" ] && printf '%s\n' "$2" | sed 's/^/     /'; }

port_free() { [ -z "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]; }

# A free port at or after $1.
free_port() {
  local port=$1
  while ! port_free "$port"; do port=$((port + 1)); done
  printf '%s\n' "$port"
}

WORK=$(mktemp -d /tmp/ax-e2e-harness.XXXXXX)
export AX_E2E_DIR=$WORK/state
AX_E2E_ETCD_PORT=$(free_port 22379)
AX_E2E_ETCD_PEER_PORT=$(free_port $((AX_E2E_ETCD_PORT + 1)))
AX_E2E_APISERVER_PORT=$(free_port 16443)
AX_E2E_CONTROLLER_MANAGER_PORT=$(free_port 20257)
AX_E2E_SCHEDULER_PORT=$(free_port 20259)
AX_E2E_KUBELET_PORT=$(free_port 20250)
AX_E2E_KUBELET_HEALTHZ_PORT=$(free_port 20248)
export AX_E2E_POD_SUBNET=10.245.0.0/16
export AX_E2E_ETCD_PORT AX_E2E_ETCD_PEER_PORT AX_E2E_APISERVER_PORT AX_E2E_CONTROLLER_MANAGER_PORT \
  AX_E2E_SCHEDULER_PORT AX_E2E_KUBELET_PORT AX_E2E_KUBELET_HEALTHZ_PORT
STATE_ID=$(printf '%s' "$AX_E2E_DIR" | sha256sum | cut -c1-8)
CGROUP=ax-e2e-$STATE_ID
NAT_CHAIN=AX-E2E-$STATE_ID
BRIDGE=axbr-$STATE_ID
BLOCKER=

cleanup() {
  [ -n "$BLOCKER" ] && kill "$BLOCKER" 2>/dev/null
  "$CLUSTER" down >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT

# Pids still alive in the test cluster's cgroup tree (empty when nothing of it runs).
cgroup_processes() {
  [ -d "/sys/fs/cgroup/pids/$CGROUP" ] || return 0
  find "/sys/fs/cgroup/pids/$CGROUP" -name cgroup.procs -exec cat {} + 2>/dev/null | tr '\n' ' '
}

# A zombie has exited; init reaps it when it gets round to it.
running() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# Pids from the test cluster's pid files that are still running.
pid_file_processes() {
  local file pid
  for file in "$AX_E2E_DIR"/run/*.pid; do
    [ -f "$file" ] || continue
    pid=$(cat "$file")
    [ -n "$pid" ] && running "$pid" && printf '%s ' "$pid"
  done
}

run_cluster() { "$CLUSTER" "$@" >"$WORK/out" 2>"$WORK/err"; }

test_status_when_stopped() {
  if run_cluster status; then
    fail "status on a stopped cluster exits non-zero" "$(cat "$WORK/out")"
  elif grep -q '^kube-apiserver *stopped' "$WORK/out"; then
    pass "status on a stopped cluster exits non-zero and says stopped"
  else
    fail "status on a stopped cluster says stopped" "$(cat "$WORK/out")"
  fi
}

# shellcheck disable=SC2016 # the literal text the caller's eval expands
test_env_output() {
  run_cluster env
  if grep -qx "export KUBECONFIG=$AX_E2E_DIR/admin.kubeconfig" "$WORK/out" \
    && grep -qxF 'export PATH=/var/cache/ax/tools:$PATH' "$WORK/out"; then
    pass "env prints KUBECONFIG and PATH exports"
  else
    fail "env prints KUBECONFIG and PATH exports" "$(cat "$WORK/out")"
  fi
}

test_bad_sim_nodes() {
  if run_cluster up --sim-nodes many; then
    fail "up --sim-nodes with a non-number is rejected"
  elif [ -z "$(cgroup_processes)" ]; then
    pass "up --sim-nodes with a non-number is rejected before starting anything"
  else
    fail "up --sim-nodes with a non-number starts nothing" "running: $(cgroup_processes)"
  fi
}

test_port_taken() {
  local port=$AX_E2E_APISERVER_PORT deadline
  python3 -m http.server "$port" --bind 127.0.0.1 >/dev/null 2>&1 &
  BLOCKER=$!
  deadline=$((SECONDS + 20))
  while port_free "$port" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
  run_cluster up
  local rc=$? lines
  lines=$(grep -c . "$WORK/err")
  if [ "$rc" -eq 0 ]; then
    fail "up with port $port taken fails" "$(cat "$WORK/out" "$WORK/err")"
  elif [ "$lines" -ne 1 ] || ! grep -q "^cluster up failed: port $port needed by kube-apiserver is already in use by python3[^ ]* (pid $BLOCKER)" "$WORK/err"; then
    fail "up with port $port taken prints one clear line" "$(cat "$WORK/err")"
  elif [ -n "$(cgroup_processes)$(pid_file_processes)" ]; then
    fail "up with port $port taken leaves nothing running" "running: $(cgroup_processes) $(pid_file_processes)"
  else
    pass "up with port $port taken fails with one clear line and leaves nothing running"
  fi
  kill "$BLOCKER" 2>/dev/null
  wait "$BLOCKER" 2>/dev/null
  BLOCKER=
}

test_component_failure_cleans_up() {
  AX_E2E_KUBELET_EXTRA_ARGS=--no-such-kubelet-flag run_cluster up
  local rc=$?
  local last
  last=$(tail -1 "$WORK/err")
  if [ "$rc" -eq 0 ]; then
    fail "up with a failing kubelet fails" "$(cat "$WORK/out")"
  elif [[ $last != "cluster up failed: kubelet exited while starting (log: $AX_E2E_DIR/logs/kubelet.log)" ]]; then
    fail "up with a failing kubelet ends with one clear line" "$(cat "$WORK/err")"
  elif ! grep -q 'no-such-kubelet-flag' "$WORK/err"; then
    fail "up with a failing kubelet prints the tail of its log" "$(cat "$WORK/err")"
  elif [ -n "$(cgroup_processes)$(pid_file_processes)" ]; then
    fail "up with a failing kubelet stops what it started" "running: $(cgroup_processes) $(pid_file_processes)"
  else
    pass "up with a failing kubelet prints its log, stops everything and says why in one line"
  fi
}

test_down_stops_everything() {
  local pids pid
  if ! AX_E2E_UP_UNTIL=containerd run_cluster up; then
    fail "partial up (until containerd) succeeds" "$(tail -25 "$WORK/err")"
    return
  fi
  pids=$(pid_file_processes)
  if [ "$(wc -w <<<"$pids")" -ne 5 ]; then
    fail "partial up runs five components" "pids: $pids"
  fi
  local dnat="-A $NAT_CHAIN -s $AX_E2E_POD_SUBNET -d 10.96.0.1/32 -p tcp -m tcp --dport 443 -j DNAT --to-destination 127.0.0.1:$AX_E2E_APISERVER_PORT"
  if ! iptables -w -t nat -S "$NAT_CHAIN" 2>/dev/null | grep -qxF -- "$dnat"; then
    fail "up routes the kubernetes Service from the pod bridge to the API server" "$(iptables -w -t nat -S 2>&1)"
  elif ! iptables -w -t nat -C PREROUTING -i "$BRIDGE" -j "$NAT_CHAIN" 2>/dev/null; then
    fail "up sends the pod bridge's traffic through $NAT_CHAIN" "$(iptables -w -t nat -S PREROUTING 2>&1)"
  elif [ "$(sysctl -n "net.ipv4.conf.$BRIDGE.route_localnet" 2>/dev/null)" != 1 ]; then
    fail "up lets the pod bridge reach 127.0.0.1 (route_localnet)"
  else
    pass "up routes the kubernetes Service from the pod bridge to the API server on loopback"
  fi
  if run_cluster status; then
    fail "status exits non-zero while the kubelet is stopped" "$(cat "$WORK/out")"
  elif ! grep -q '^etcd .*healthy' "$WORK/out"; then
    fail "status reports running components" "$(cat "$WORK/out")"
  else
    pass "status reports running components and exits non-zero without a kubelet"
  fi
  if ! run_cluster down; then
    fail "down succeeds" "$(cat "$WORK/out" "$WORK/err")"
    return
  fi
  local alive=
  for pid in $pids; do running "$pid" && alive="$alive $pid"; done
  if [ -n "$alive" ]; then
    fail "after down no pid from the pid files is alive" "alive:$alive"
  elif [ -n "$(cgroup_processes)" ] || [ -d "/sys/fs/cgroup/pids/$CGROUP" ]; then
    fail "after down the cgroup tree is empty and removed" "running: $(cgroup_processes)"
  elif [ -e "$AX_E2E_DIR" ]; then
    fail "down removes the state dir" "$(ls -la "$AX_E2E_DIR")"
  elif iptables -w -t nat -S 2>/dev/null | grep -qF -- "$NAT_CHAIN" || ip link show "$BRIDGE" >/dev/null 2>&1; then
    fail "down removes the NAT rules and the pod bridge" "$(iptables -w -t nat -S 2>&1 | grep -F -- "$NAT_CHAIN")"
  else
    pass "after down no pid from the pid files is alive; the state dir, NAT rules and bridge are gone"
  fi
  if run_cluster down; then
    pass "down on a stopped cluster succeeds"
  else
    fail "down on a stopped cluster succeeds" "$(cat "$WORK/err")"
  fi
}

# Read-only against the default cluster: a second `up` on a healthy cluster is a quick no-op.
test_second_up_is_fast() {
  local default_state=/var/lib/ax-e2e started
  if ! AX_E2E_DIR=$default_state "$CLUSTER" status >/dev/null 2>&1; then
    printf 'skip second up on a healthy cluster is fast (no healthy cluster at %s)\n' "$default_state"
    return
  fi
  started=$(date +%s%N)
  env -u AX_E2E_ETCD_PORT -u AX_E2E_ETCD_PEER_PORT -u AX_E2E_APISERVER_PORT -u AX_E2E_CONTROLLER_MANAGER_PORT \
    -u AX_E2E_SCHEDULER_PORT -u AX_E2E_KUBELET_PORT -u AX_E2E_KUBELET_HEALTHZ_PORT -u AX_E2E_POD_SUBNET \
    AX_E2E_DIR=$default_state "$CLUSTER" up >"$WORK/out" 2>"$WORK/err"
  local rc=$? took=$((($(date +%s%N) - started) / 1000000))
  if [ "$rc" -eq 0 ] && grep -q 'already up' "$WORK/out" && [ "$took" -lt 3000 ]; then
    pass "second up on a healthy cluster is a no-op (${took} ms)"
  else
    fail "second up on a healthy cluster is a quick no-op" "rc=$rc took=${took}ms $(cat "$WORK/out" "$WORK/err")"
  fi
}

test_status_when_stopped
test_env_output
test_bad_sim_nodes
test_port_taken
test_component_failure_cleans_up
test_down_stops_everything
test_second_up_is_fast

printf '%s passed, %s failed\n' "$PASSED" "$FAILED"
[ "$FAILED" -eq 0 ]
