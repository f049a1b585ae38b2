#!/usr/bin/env bash
# A real single-node Kubernetes 1.20 cluster on this machine for ax's end-to-end tests:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd and a kubelet, all
# state under ${AX_E2E_DIR:-/var/lib/ax-e2e}. See /work/shared/E2E-CLUSTER.md for why each
# setting is what it is.
#
#   cluster.sh up [--sim-nodes N]   start (or finish starting) the cluster; no-op when healthy
#   cluster.sh down                 stop everything `up` started and remove the state dir
#   cluster.sh status               one line per component; exit 0 only when all are healthy
#   cluster.sh env                  eval "$(e2e/cluster.sh env)" sets KUBECONFIG and PATH
#   cluster.sh sa-kubeconfig NAMESPACE SERVICEACCOUNT OUTFILE
#   cluster.sh kubelet stop|start   stop the kubelet (its pods keep running, unsupervised) or start it
#
# Settings (environment): AX_E2E_DIR, AX_CACHE, AX_E2E_*_PORT and AX_E2E_POD_SUBNET (see
# lib/common.sh). For the harness's own tests: AX_E2E_UP_UNTIL=<phase> ends `up` successfully
# after that phase; AX_E2E_KUBELET_EXTRA_ARGS adds kubelet flags. AX_E2E_PROFILING=true serves
# kube-apiserver's /debug/pprof (for `go tool pprof` while a benchmark runs; off otherwise).
set -euo pipefail
# shellcheck source-path=SCRIPTDIR

# shellcheck source=SCRIPTDIR/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=SCRIPTDIR/lib/pki.sh
. "$E2E_DIR/lib/pki.sh"
# shellcheck source=SCRIPTDIR/lib/images.sh
. "$E2E_DIR/lib/images.sh"
load_settings

usage() {
  sed -n '7,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# One `up`/`down` at a time per state dir. The lock lives outside the state dir, which `down`
# removes.
take_lock() {
  exec 9>"${TMPDIR:-/tmp}/ax-e2e-$STATE_ID.lock"
  if ! flock -n 9; then
    say "waiting for another cluster.sh up/down on $STATE"
    flock -w 900 9 || { say "cluster.sh: gave up waiting for the lock on $STATE" >&2; exit 1; }
  fi
}

# --- health ----------------------------------------------------------------------------------

component_healthy() {
  case $1 in
    etcd) curl -sf --max-time 2 "http://127.0.0.1:$ETCD_PORT/health" 2>/dev/null | grep -q '"health":"true"' ;;
    kube-apiserver) [ "$(curl -sf --max-time 2 --cacert "$PKI/ca.crt" "https://127.0.0.1:$APISERVER_PORT/readyz" 2>/dev/null)" = ok ] ;;
    kube-controller-manager) [ "$(curl -skf --max-time 2 "https://127.0.0.1:$CONTROLLER_MANAGER_PORT/healthz" 2>/dev/null)" = ok ] ;;
    kube-scheduler) [ "$(curl -skf --max-time 2 "https://127.0.0.1:$SCHEDULER_PORT/healthz" 2>/dev/null)" = ok ] ;;
    containerd) timeout 3 ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1 ;;
    kubelet) [ "$(curl -sf --max-time 2 "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz" 2>/dev/null)" = ok ] ;;
    *) return 1 ;;
  esac
}

node_ready_status() {
  kubectl_admin --request-timeout=5s get node "$NODE_NAME" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null
}

# The quick test that makes a second `up` a no-op: every component runs from this state dir and
# the API server reports the node Ready.
cluster_healthy() {
  local component
  for component in "${COMPONENTS[@]}"; do component_pid "$component" >/dev/null || return 1; done
  [ "$(node_ready_status)" = True ]
}

# --- failing `up` ----------------------------------------------------------------------------

UP_REPORTED=
UP_DONE=
CURRENT_PHASE=
SIM_PHASE=

# up_failed WHAT REASON LOG: the log's tail, then everything stopped, then one line saying why.
up_failed() {
  local what=$1 reason=$2 log=$3
  if [ -s "$log" ]; then
    printf -- '--- end of %s ---\n' "$log" >&2
    log_tail "$log" 20 >&2
    printf -- '---\n' >&2
  fi
  if [ -n "$SIM_PHASE" ]; then
    stop_daemon ax-sim 10
    rm -f "$RUN/ax-sim.nodes"
  else
    stop_components
  fi
  UP_REPORTED=1
  printf 'cluster up failed: %s %s (log: %s)\n' "$what" "$reason" "$log" >&2
  exit 1
}

on_up_exit() {
  local rc=$?
  trap - EXIT INT TERM
  if [ "$rc" -ne 0 ] && [ -z "$UP_REPORTED" ] && [ -z "$UP_DONE" ]; then
    if [ -n "$SIM_PHASE" ]; then stop_daemon ax-sim 10; else stop_components; fi
    printf 'cluster up failed: phase %s stopped unexpectedly (exit %s; logs: %s)\n' \
      "${CURRENT_PHASE:-start}" "$rc" "$LOGS" >&2
  fi
  exit "$rc"
}

# wait_healthy COMPONENT TIMEOUT: polls its health check, noticing at once when it exits.
wait_healthy() {
  local component=$1 timeout=$2 deadline
  deadline=$(($(date +%s) + timeout))
  until component_healthy "$component"; do
    component_pid "$component" >/dev/null \
      || up_failed "$component" "exited while starting" "$LOGS/$component.log"
    [ "$(date +%s)" -lt "$deadline" ] \
      || up_failed "$component" "did not become healthy within ${timeout}s" "$LOGS/$component.log"
    sleep 0.3
  done
}

# --- components ------------------------------------------------------------------------------

start_etcd() {
  start_daemon etcd /usr/bin/etcd --name ax-e2e --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "ax-e2e=http://127.0.0.1:$ETCD_PEER_PORT" --initial-cluster-state new \
    --logger zap --log-outputs stderr
}

# The audit log records every write of the ax-operator ServiceAccount (and nothing else), so a test
# can count the operator's own requests per namespace (tests/e2e_writes.rs).
write_audit_policy() {
  cat >"$STATE/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    users: ["system:serviceaccount:ax-system:ax-operator"]
    verbs: [create, update, patch, delete, deletecollection]
  - level: None
POLICY
}

start_kube-apiserver() {
  write_audit_policy
  start_daemon kube-apiserver "$K8S_BIN/kube-apiserver" \
    --audit-policy-file="$STATE/audit-policy.yaml" --audit-log-path="$STATE/audit.log" \
    --audit-log-maxsize=200 --audit-log-maxbackup=1 \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --secure-port="$APISERVER_PORT" --insecure-port=0 \
    --advertise-address=127.0.0.1 --endpoint-reconciler-type=none \
    --service-cluster-ip-range=10.96.0.0/16 \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" --token-auth-file="$PKI/tokens.csv" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=Hostname \
    --cert-dir="$STATE/kube-apiserver" --allow-privileged=true --profiling="${AX_E2E_PROFILING:-false}"
}

start_kube-controller-manager() {
  local kubeconfig=$STATE/kube-controller-manager.kubeconfig
  start_daemon kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig="$kubeconfig" --authentication-kubeconfig="$kubeconfig" --authorization-kubeconfig="$kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$CONTROLLER_MANAGER_PORT" --port=0 \
    --cert-dir="$STATE/kube-controller-manager" --leader-elect=false \
    --use-service-account-credentials=true --controllers='*,-nodeipam' --allocate-node-cidrs=false \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --kube-api-qps=50 --kube-api-burst=100 --profiling=false
}

start_kube-scheduler() {
  local kubeconfig=$STATE/kube-scheduler.kubeconfig
  start_daemon kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig="$kubeconfig" --authentication-kubeconfig="$kubeconfig" --authorization-kubeconfig="$kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$SCHEDULER_PORT" --port=0 \
    --cert-dir="$STATE/kube-scheduler" --leader-elect=false \
    --kube-api-qps=100 --kube-api-burst=200 --profiling=false
}

write_containerd_config() {
  mkdir -p "$STATE/containerd" "$STATE/cni/net.d"
  cat >"$STATE/containerd/config.toml" <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # Processes here lack CAP_SYS_RESOURCE: without this runc cannot set oom_score_adj -998 and
  # every pod sandbox fails.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$STATE/containerd/runc"
        SystemdCgroup = false

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
    max_conf_num = 1
EOF
  # A plain bridge without masquerading: pods reach each other and the host, nothing else. The
  # only iptables rules are the kubernetes Service's (ensure_service_vip).
  cat >"$STATE/cni/net.d/10-ax-e2e.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_SUBNET"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni/networks"
      }
    }
  ]
}
EOF
}

start_containerd() {
  write_containerd_config
  start_daemon containerd /usr/bin/containerd --config "$STATE/containerd/config.toml"
}

write_kubelet_config() {
  mkdir -p "$STATE/kubelet"
  cat >"$STATE/kubelet-config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: AlwaysAllow
cgroupDriver: cgroupfs
cgroupRoot: /$CGROUP
failSwapOn: false
makeIPTablesUtilChains: false
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
volumePluginDir: $STATE/kubelet/volume-plugins
maxPods: 110
# The node turns Ready sooner after a start; status is still posted only when it changes.
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 1m
serializeImagePulls: false
# Images come from \`ctr import\` and cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# Absolute floors, not percentages: on a large disk that a build has nearly filled, 1% is
# gigabytes, and the node's DiskPressure taint would leave every real worker Pending.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 300Mi
  nodefs.inodesFree: 1%
  imagefs.available: 300Mi
EOF
}

start_kubelet() {
  write_kubelet_config
  local extra=()
  # shellcheck disable=SC2206
  [ -n "${AX_E2E_KUBELET_EXTRA_ARGS:-}" ] && extra=($AX_E2E_KUBELET_EXTRA_ARGS)
  start_daemon kubelet "$K8S_BIN/kubelet" \
    --config="$STATE/kubelet-config.yaml" --kubeconfig="$STATE/kubelet.kubeconfig" \
    --root-dir="$STATE/kubelet" --cert-dir="$STATE/kubelet/pki" \
    --container-runtime=remote --container-runtime-endpoint="unix://$CONTAINERD_SOCK" \
    --hostname-override="$NODE_NAME" --pod-infra-container-image="$PAUSE_IMAGE" \
    "${extra[@]}"
}

# ensure_component NAME TIMEOUT: leaves a healthy running component alone, restarts an unhealthy
# one, starts a stopped one.
ensure_component() {
  local component=$1 timeout=$2
  if component_pid "$component" >/dev/null; then
    component_healthy "$component" && return 0
    stop_daemon "$component"
  fi
  "start_$component"
  wait_healthy "$component" "$timeout"
}

# Stops every component in reverse start order, pods and containerd shims included.
stop_components() {
  stop_daemon ax-sim 10
  rm -f "$RUN/ax-sim.nodes"
  stop_daemon kubelet 15
  # Container processes first, then the shims are asked to clean up (unmount rootfs, remove
  # their sockets) while containerd still runs.
  cgroup_kill "$CGROUP/kubepods" || true
  if component_pid containerd >/dev/null; then
    timeout 10 ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks ls -q 2>/dev/null \
      | timeout 30 xargs -r -P 8 -n 1 ctr --address "$CONTAINERD_SOCK" -n k8s.io tasks delete -f >/dev/null 2>&1 || true
  fi
  local shim_sockets
  shim_sockets=$(leftover_shim_sockets)
  stop_daemon containerd 10
  local component
  for component in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop_daemon "$component" 20
  done
  cgroup_kill "$CGROUP" || true
  cgroup_remove "$CGROUP"
  # shellcheck disable=SC2086
  [ -n "$shim_sockets" ] && rm -f $shim_sockets
  return 0
}

# Socket files of shims still running for our containerd: containerd names them
# /run/containerd/s/<sha256 of "address/namespace/id">, and a killed shim leaves them behind.
leftover_shim_sockets() {
  local pid args id namespace
  for pid in $(cgroup_pids "$CGROUP"); do
    args=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null) || continue
    case $(head -1 <<<"$args") in *containerd-shim*) ;; *) continue ;; esac
    grep -qxF -- "$CONTAINERD_SOCK" <<<"$args" || continue
    id=$(grep -A1 -x -- '-id' <<<"$args" | tail -1)
    namespace=$(grep -A1 -x -- '-namespace' <<<"$args" | tail -1)
    printf '/run/containerd/s/%s\n' "$(printf '%s' "$CONTAINERD_SOCK/$namespace/$id" | sha256sum | cut -d' ' -f1)"
  done
}

# Mount points at or under a directory, deepest first.
mounts_under() {
  awk -v dir="$1" '{ p = $5; gsub(/\\040/, " ", p); if (p == dir || index(p, dir "/") == 1) print length(p) "\t" p }' \
    /proc/self/mountinfo | sort -rn | cut -f2-
}

unmount_under() {
  local dir=$1 mount_point
  for _ in 1 2 3 4 5; do
    [ -z "$(mounts_under "$dir")" ] && return 0
    while IFS= read -r mount_point; do
      umount "$mount_point" 2>/dev/null || umount -l "$mount_point" 2>/dev/null || true
    done < <(mounts_under "$dir")
  done
  [ -z "$(mounts_under "$dir")" ]
}

# What the kubelet and the CNI plugins keep outside the state dir on this Kubernetes version.
clean_host_leftovers() {
  local pod_dir uid link
  for pod_dir in "$STATE"/kubelet/pods/*/; do
    [ -d "$pod_dir" ] || continue
    uid=$(basename "$pod_dir")
    rm -rf /var/log/pods/*_"$uid"
    for link in /var/log/containers/*.log; do
      [ -L "$link" ] && [[ $(readlink "$link") == /var/log/pods/*_"$uid"/* ]] && rm -f "$link"
    done
  done
  rm -f /var/lib/cni/results/"$CNI_NETWORK"-*
  local sandbox
  for sandbox in "$STATE"/containerd/root/io.containerd.grpc.v1.cri/sandboxes/*/; do
    [ -d "$sandbox" ] && rm -f "/var/lib/cni/results/cni-loopback-$(basename "$sandbox")-lo"
  done
  ip link del "$BRIDGE" 2>/dev/null || true
}

# --- the kubernetes Service ------------------------------------------------------------------
# There is no kube-proxy, so the `kubernetes` Service's address, which the kubelet hands every pod
# as KUBERNETES_SERVICE_HOST/PORT, would lead nowhere (or out of the machine by the default route).
# This does kube-proxy's one job pods here need: connections from the pod bridge to
# $KUBERNETES_SERVICE_IP:443 are DNATed to the API server on 127.0.0.1, so in-cluster clients (the
# operator installed by Helm) work while the API server keeps listening on loopback only. The
# serving certificate already names that address. route_localnet on the bridge (ours alone) lets
# packets that arrived there be delivered to 127.0.0.1; traffic stays on loopback and the bridge.

# Idempotent: a second `up` finds everything in place and changes nothing.
ensure_service_vip() {
  command -v iptables >/dev/null || { say "iptables is not installed (e2e/install.sh installs it)"; return 1; }
  # The CNI bridge plugin adopts an existing bridge of its name and adds the gateway address.
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add name "$BRIDGE" type bridge || return 1
  ip link set "$BRIDGE" up || return 1
  sysctl -qw "net.ipv4.conf.$BRIDGE.route_localnet=1" || return 1
  iptables -w -t nat -S "$NAT_CHAIN" >/dev/null 2>&1 || iptables -w -t nat -N "$NAT_CHAIN" || return 1
  local rule=(-s "$POD_SUBNET" -d "$KUBERNETES_SERVICE_IP/32" -p tcp --dport 443
    -j DNAT --to-destination "127.0.0.1:$APISERVER_PORT")
  iptables -w -t nat -C "$NAT_CHAIN" "${rule[@]}" 2>/dev/null || iptables -w -t nat -A "$NAT_CHAIN" "${rule[@]}" || return 1
  iptables -w -t nat -C PREROUTING -i "$BRIDGE" -j "$NAT_CHAIN" 2>/dev/null \
    || iptables -w -t nat -A PREROUTING -i "$BRIDGE" -j "$NAT_CHAIN" || return 1
}

service_vip_phase() {
  mkdir -p "$LOGS"
  ensure_service_vip >>"$LOGS/service-vip.log" 2>&1 \
    || up_failed "the kubernetes Service" "could not be routed to the API server" "$LOGS/service-vip.log"
}

# The NAT rules `up` added; the bridge itself goes with the other host leftovers.
remove_service_vip() {
  command -v iptables >/dev/null || return 0
  while iptables -w -t nat -D PREROUTING -i "$BRIDGE" -j "$NAT_CHAIN" 2>/dev/null; do :; done
  if iptables -w -t nat -S "$NAT_CHAIN" >/dev/null 2>&1; then
    if ! { iptables -w -t nat -F "$NAT_CHAIN" && iptables -w -t nat -X "$NAT_CHAIN"; }; then
      warn "could not remove the iptables chain $NAT_CHAIN"
    fi
  fi
  return 0
}

# --- images, node, smoke pod -----------------------------------------------------------------

import_images() {
  local archive reference
  for reference in "$PAUSE_IMAGE" "$BUSYBOX_IMAGE"; do
    image_present "$reference" && continue
    case $reference in
      "$PAUSE_IMAGE") archive=$(pause_image_archive 2>>"$LOGS/images.log") ;;
      *) archive=$(busybox_image_archive 2>>"$LOGS/images.log") ;;
    esac || up_failed "image $reference" "could not be built with podman" "$LOGS/images.log"
    import_image_archive "$archive" 2>>"$LOGS/images.log" \
      || up_failed "image $reference" "could not be imported into containerd" "$LOGS/images.log"
  done
  image_present "$BUSYBOX_PUBLIC_IMAGE" \
    || ctr_cluster images tag "$BUSYBOX_IMAGE" "$BUSYBOX_PUBLIC_IMAGE" >/dev/null 2>>"$LOGS/images.log" \
    || up_failed "image $BUSYBOX_PUBLIC_IMAGE" "could not be tagged from $BUSYBOX_IMAGE" "$LOGS/images.log"
}

wait_node_ready() {
  local deadline=$(($(date +%s) + 180))
  until [ "$(node_ready_status)" = True ]; do
    component_pid kubelet >/dev/null || up_failed kubelet "exited before node $NODE_NAME was Ready" "$LOGS/kubelet.log"
    [ "$(date +%s)" -lt "$deadline" ] \
      || up_failed "node $NODE_NAME" "did not become Ready within 180s" "$LOGS/kubelet.log"
    sleep 0.5
  done
}

# wait_for_service_account NAMESPACE NAME TIMEOUT
wait_for_service_account() {
  local deadline=$(($(date +%s) + $3))
  until kubectl_admin --request-timeout=5s -n "$1" get serviceaccount "$2" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || return 1
    sleep 0.5
  done
}

ensure_namespace() {
  kubectl_admin get namespace "$E2E_NAMESPACE" >/dev/null 2>&1 \
    || kubectl_admin create namespace "$E2E_NAMESPACE" >/dev/null
}

smoke_pod() {
  local name=ax-e2e-smoke log=$LOGS/smoke-pod.log phase deadline
  wait_for_service_account default default 60 \
    || up_failed kube-controller-manager "created no default ServiceAccount within 60s" "$LOGS/kube-controller-manager.log"
  kubectl_admin -n default delete pod "$name" --ignore-not-found --wait=true >/dev/null 2>&1 || true
  kubectl_admin -n default apply -f - >"$log" 2>&1 <<EOF || up_failed "smoke pod" "could not be created" "$log"
apiVersion: v1
kind: Pod
metadata:
  name: $name
spec:
  restartPolicy: Never
  dnsPolicy: Default
  terminationGracePeriodSeconds: 1
  containers:
  - name: smoke
    image: $BUSYBOX_IMAGE
    imagePullPolicy: Never
    command: ["sh", "-c", "echo ax-e2e smoke ok"]
EOF
  deadline=$(($(date +%s) + 180))
  while :; do
    phase=$(kubectl_admin --request-timeout=5s -n default get pod "$name" -o 'jsonpath={.status.phase}' 2>/dev/null || true)
    [ "$phase" = Succeeded ] && break
    if [ "$phase" = Failed ] || [ "$(date +%s)" -ge "$deadline" ]; then
      kubectl_admin -n default describe pod "$name" >>"$log" 2>&1 || true
      up_failed "smoke pod" "did not succeed (phase: ${phase:-unknown})" "$log"
    fi
    component_pid kubelet >/dev/null || up_failed kubelet "exited while running the smoke pod" "$LOGS/kubelet.log"
    sleep 0.5
  done
  kubectl_admin -n default delete pod "$name" --wait=false >/dev/null 2>&1 || true
}

preflight() {
  local entry component port who pid
  for entry in "etcd $ETCD_PORT" "etcd $ETCD_PEER_PORT" "kube-apiserver $APISERVER_PORT" \
    "kube-controller-manager $CONTROLLER_MANAGER_PORT" "kube-scheduler $SCHEDULER_PORT" \
    "kubelet $KUBELET_PORT" "kubelet $KUBELET_HEALTHZ_PORT"; do
    component=${entry% *}
    port=${entry#* }
    component_pid "$component" >/dev/null && continue
    who=$(port_listener "$port")
    [ -z "$who" ] && continue
    pid=$(port_listener_pid "$port")
    # A leftover of this very cluster (say, a pid file lost) is still ours: stop it, don't fail.
    if [ -n "$pid" ] && pid_is_ours "$pid"; then
      kill -KILL "$pid" 2>/dev/null || true
      wait_pids_gone 5 "$pid" && continue
    fi
    UP_REPORTED=1
    printf 'cluster up failed: port %s needed by %s is already in use by %s, which is not part of this cluster (%s)\n' \
      "$port" "$component" "$who" "$STATE" >&2
    exit 1
  done
  local binary
  for binary in kube-apiserver kube-controller-manager kube-scheduler kubelet pause; do
    [ -x "$K8S_BIN/$binary" ] || up_failed install "left no $K8S_BIN/$binary" "$LOGS/install.log"
  done
}

run_install() {
  mkdir -p "$LOGS"
  if ! AX_CACHE=$CACHE bash "$E2E_DIR/install.sh" >>"$LOGS/install.log" 2>&1; then
    up_failed install "failed" "$LOGS/install.log"
  fi
}

certs() {
  make_pki
  make_kubeconfigs
}

# --- sim nodes -------------------------------------------------------------------------------

sim_nodes_ready() {
  kubectl_admin --request-timeout=5s get nodes -l ax.dev/sim-node=true \
    -o 'jsonpath={range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' 2>/dev/null \
    | grep -c '^True$' || true
}

ensure_sim() {
  local count=$1 pid target_dir binary deadline started
  SIM_PHASE=1
  if pid=$(component_pid ax-sim) && [ "$(cat "$RUN/ax-sim.nodes" 2>/dev/null)" = "$count" ]; then
    say "ax-sim already running with $count nodes (pid $pid)"
    return 0
  fi
  stop_daemon ax-sim 10
  # Nodes of an earlier simulator (perhaps with more nodes) would stay Ready for a while with no one
  # driving their pods: remove them all; the new simulator registers its own.
  kubectl_admin --request-timeout=20s delete nodes -l ax.dev/sim-node=true --wait=false >/dev/null 2>&1 || true
  started=$(now)
  CURRENT_PHASE=sim-build
  say "ax-e2e: building ax-sim"
  mkdir -p "$LOGS"
  (cd "$REPO_ROOT" && cargo build -q -p ax-sim) >"$LOGS/ax-sim-build.log" 2>&1 \
    || up_failed ax-sim "did not build" "$LOGS/ax-sim-build.log"
  target_dir=${CARGO_TARGET_DIR:-target}
  [[ $target_dir == /* ]] || target_dir=$REPO_ROOT/$target_dir
  binary=$target_dir/debug/ax-sim
  record_phase sim-build "$started"
  started=$(now)
  CURRENT_PHASE=sim-nodes
  say "ax-e2e: starting ax-sim with $count nodes"
  start_daemon ax-sim "$binary" --kubeconfig "$ADMIN_KUBECONFIG" --nodes "$count"
  printf '%s\n' "$count" >"$RUN/ax-sim.nodes"
  deadline=$(($(date +%s) + 120))
  until [ "$(sim_nodes_ready)" -ge "$count" ]; do
    component_pid ax-sim >/dev/null || up_failed ax-sim "exited while starting" "$LOGS/ax-sim.log"
    [ "$(date +%s)" -lt "$deadline" ] \
      || up_failed ax-sim "did not get $count sim nodes Ready within 120s" "$LOGS/ax-sim.log"
    sleep 0.5
  done
  record_phase sim-nodes "$started"
  SIM_PHASE=
}

# --- up --------------------------------------------------------------------------------------

PHASES=()
record_phase() { PHASES+=("$1 $(elapsed "$2" "$(now)")"); }

print_timings() {
  local entry
  say "phase timings:"
  for entry in "${PHASES[@]}"; do printf '  %-24s %6ss\n' "${entry% *}" "${entry##* }"; done
  printf '  %-24s %6ss\n' total "$(elapsed "$UP_STARTED" "$(now)")"
}

# run_phase NAME COMMAND...: times the command; AX_E2E_UP_UNTIL=NAME ends `up` after it.
run_phase() {
  local name=$1 started
  shift
  CURRENT_PHASE=$name
  say "ax-e2e: $name"
  started=$(now)
  "$@"
  record_phase "$name" "$started"
  if [ "${AX_E2E_UP_UNTIL:-}" = "$name" ]; then
    UP_DONE=1
    print_timings
    say "cluster partly up (stopped after phase $name as AX_E2E_UP_UNTIL asked)"
    exit 0
  fi
}

cmd_up() {
  local sim_nodes=
  while [ $# -gt 0 ]; do
    case $1 in
      --sim-nodes) [ $# -ge 2 ] || usage; sim_nodes=$2; shift 2 ;;
      --sim-nodes=*) sim_nodes=${1#*=}; shift ;;
      *) usage ;;
    esac
  done
  if [ -n "$sim_nodes" ] && ! [[ $sim_nodes =~ ^[1-9][0-9]*$ ]]; then
    say "cluster.sh up: --sim-nodes needs a positive number, got '$sim_nodes'" >&2
    exit 2
  fi
  UP_STARTED=$(now)
  trap on_up_exit EXIT
  trap 'exit 130' INT TERM
  mkdir -p "$(dirname "$STATE")"
  take_lock
  if [ -d "$STATE" ] && cluster_healthy; then
    say "cluster already up ($STATE)"
    # Clusters started before the Service was routed get the rules now, without a restart.
    if ! ensure_service_vip >>"$LOGS/service-vip.log" 2>&1; then
      UP_REPORTED=1
      say "cluster up failed: the kubernetes Service could not be routed to the API server (log: $LOGS/service-vip.log)" >&2
      exit 1
    fi
    # Clusters started before the examples used busybox:1.36 get that name now.
    import_images
    if [ -n "$sim_nodes" ]; then
      ensure_sim "$sim_nodes"
      [ ${#PHASES[@]} -eq 0 ] || print_timings
    fi
    UP_DONE=1
    return 0
  fi
  mkdir -p "$STATE" "$LOGS" "$RUN"
  chmod 0700 "$STATE"
  [ -f "$STATE/settings.env" ] || save_settings
  run_phase install run_install
  run_phase preflight preflight
  run_phase certs certs
  run_phase service-vip service_vip_phase
  run_phase etcd ensure_component etcd 60
  run_phase kube-apiserver ensure_component kube-apiserver 120
  run_phase kube-controller-manager ensure_component kube-controller-manager 60
  run_phase kube-scheduler ensure_component kube-scheduler 60
  run_phase containerd ensure_component containerd 60
  run_phase images import_images
  run_phase kubelet ensure_component kubelet 90
  run_phase node-ready wait_node_ready
  run_phase namespace ensure_namespace
  run_phase smoke-pod smoke_pod
  [ -n "$sim_nodes" ] && ensure_sim "$sim_nodes"
  UP_DONE=1
  print_timings
  say "cluster up: eval \"\$($0 env)\" to use it (KUBECONFIG=$ADMIN_KUBECONFIG)"
}

# --- down, status, env, sa-kubeconfig --------------------------------------------------------

cmd_down() {
  [ $# -eq 0 ] || usage
  take_lock
  local pids=() name pid left=()
  for name in "${COMPONENTS[@]}" ax-sim; do
    pid=$(cat "$RUN/$name.pid" 2>/dev/null) && [ -n "$pid" ] && pids+=("$pid")
  done
  stop_components
  remove_service_vip
  if [ -d "$STATE" ]; then
    clean_host_leftovers
    unmount_under "$STATE" || warn "some mounts under $STATE remain: $(mounts_under "$STATE" | tr '\n' ' ')"
    rm -rf --one-file-system "$STATE" || { say "cluster down: could not remove $STATE" >&2; exit 1; }
  fi
  for pid in "${pids[@]}"; do pid_is_ours "$pid" && left+=("$pid"); done
  if [ ${#left[@]} -gt 0 ]; then
    say "cluster down: processes still running: ${left[*]}" >&2
    exit 1
  fi
  say "cluster down ($STATE removed)"
}

cmd_status() {
  [ $# -eq 0 ] || usage
  local component pid healthy=0 node
  if [ ! -d "$STATE" ]; then
    say "no cluster at $STATE"
    healthy=1
  fi
  for component in "${COMPONENTS[@]}"; do
    if pid=$(component_pid "$component"); then
      if component_healthy "$component"; then
        printf '%-24s running  pid %-8s healthy\n' "$component" "$pid"
      else
        printf '%-24s running  pid %-8s UNHEALTHY\n' "$component" "$pid"
        healthy=1
      fi
    else
      printf '%-24s stopped\n' "$component"
      healthy=1
    fi
  done
  if component_pid kube-apiserver >/dev/null; then
    node=$(node_ready_status || true)
    case $node in
      True) printf '%-24s Ready\n' "node $NODE_NAME" ;;
      '') printf '%-24s not registered\n' "node $NODE_NAME"; healthy=1 ;;
      *) printf '%-24s NotReady (%s)\n' "node $NODE_NAME" "$node"; healthy=1 ;;
    esac
  else
    printf '%-24s unknown (API server down)\n' "node $NODE_NAME"
    healthy=1
  fi
  if [ -f "$RUN/ax-sim.nodes" ]; then
    if pid=$(component_pid ax-sim); then
      printf '%-24s running  pid %-8s %s/%s sim nodes Ready\n' ax-sim "$pid" "$(sim_nodes_ready)" "$(cat "$RUN/ax-sim.nodes")"
    else
      printf '%-24s stopped\n' ax-sim
      healthy=1
    fi
  fi
  return "$healthy"
}

cmd_env() {
  [ $# -eq 0 ] || usage
  printf 'export KUBECONFIG=%s\n' "$ADMIN_KUBECONFIG"
  # shellcheck disable=SC2016 # $PATH is for the caller's eval to expand
  printf 'export PATH=%s:$PATH\n' "$TOOLS"
  printf 'export CONTAINERD_ADDRESS=%s\n' "$CONTAINERD_SOCK"
  printf 'export CONTAINERD_NAMESPACE=k8s.io\n'
  printf 'export AX_E2E_AUDIT_LOG=%s\n' "$STATE/audit.log"
}

# A kubeconfig with a ServiceAccount's token, for running a program out of cluster under that
# account's RBAC. On 1.20 the token controller keeps a token Secret for every ServiceAccount.
cmd_sa_kubeconfig() {
  [ $# -eq 3 ] || usage
  local namespace=$1 account=$2 out=$3 deadline secret token
  deadline=$(($(date +%s) + 60))
  while :; do
    secret=$(kubectl_admin -n "$namespace" get serviceaccount "$account" -o 'jsonpath={.secrets[*].name}' 2>/dev/null || true)
    secret=$(tr ' ' '\n' <<<"$secret" | grep -- '-token-' | head -1 || true)
    if [ -n "$secret" ]; then
      token=$(kubectl_admin -n "$namespace" get secret "$secret" -o 'jsonpath={.data.token}' 2>/dev/null | base64 -d || true)
      [ -n "$token" ] && break
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
      say "sa-kubeconfig: no token for ServiceAccount $namespace/$account within 60s (does it exist?)" >&2
      exit 1
    fi
    sleep 0.5
  done
  mkdir -p "$(dirname "$out")"
  write_kubeconfig "$out" "system:serviceaccount:$namespace:$account" "$token" "$namespace"
  if ! "$KUBECTL" --kubeconfig "$out" --request-timeout=10s get --raw /api >/dev/null 2>&1; then
    say "sa-kubeconfig: the API server rejects the token in $out" >&2
    exit 1
  fi
  say "wrote $out (ServiceAccount $namespace/$account)"
}

# What a node that stops answering looks like: the kubelet is gone, its containers keep running,
# nothing reports on them until it comes back (for the fencing tests).
cmd_kubelet() {
  [ $# -eq 1 ] || usage
  take_lock
  case $1 in
    stop) stop_daemon kubelet 15; say "kubelet stopped" ;;
    start) ensure_component kubelet 60; say "kubelet running" ;;
    *) usage ;;
  esac
}

main() {
  [ $# -ge 1 ] || usage
  local command=$1
  shift
  [ "$(id -u)" -eq 0 ] || { say "cluster.sh must run as root" >&2; exit 1; }
  case $command in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    env) cmd_env "$@" ;;
    sa-kubeconfig) cmd_sa_kubeconfig "$@" ;;
    kubelet) cmd_kubelet "$@" ;;
    *) usage ;;
  esac
}

main "$@"
