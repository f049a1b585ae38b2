# shellcheck shell=bash
# shellcheck disable=SC2034 # the settings here are read by the scripts that source this file
# Paths, settings and process helpers shared by the e2e harness scripts. Sourced, never run.

E2E_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO_ROOT=$(cd "$E2E_DIR/.." && pwd)

STATE=${AX_E2E_DIR:-/var/lib/ax-e2e}
STATE=${STATE%/}
CACHE=${AX_CACHE:-/var/cache/ax}
K8S_VERSION=1.20.2
K8S_BIN=$CACHE/k8s-$K8S_VERSION/bin
TOOLS=$CACHE/tools
KUBECTL=$TOOLS/kubectl
IMAGE_CACHE=$CACHE/images

PKI=$STATE/pki
LOGS=$STATE/logs
RUN=$STATE/run
ADMIN_KUBECONFIG=$STATE/admin.kubeconfig
CONTAINERD_SOCK=$STATE/containerd/containerd.sock

PAUSE_IMAGE=localhost/ax-pause:k8s-$K8S_VERSION
BUSYBOX_IMAGE=localhost/ax-busybox:1
# The same image under the public name the examples use (`busybox:1.36`, IfNotPresent), so they
# run unchanged here and on any cluster that can pull from Docker Hub.
BUSYBOX_PUBLIC_IMAGE=docker.io/library/busybox:1.36
NODE_NAME=localhost
# The first address of kube-apiserver's --service-cluster-ip-range: the `kubernetes` Service.
KUBERNETES_SERVICE_IP=10.96.0.1
E2E_NAMESPACE=ax-e2e

# Ports and pod subnet are overridable so the harness's own tests can run beside a live cluster.
# The values a cluster was started with are saved in its state dir and win over the environment,
# so `status`, `down` and `env` find the cluster whatever the caller's environment says.
load_settings() {
  ETCD_PORT=${AX_E2E_ETCD_PORT:-2379}
  ETCD_PEER_PORT=${AX_E2E_ETCD_PEER_PORT:-2380}
  APISERVER_PORT=${AX_E2E_APISERVER_PORT:-6443}
  CONTROLLER_MANAGER_PORT=${AX_E2E_CONTROLLER_MANAGER_PORT:-10257}
  SCHEDULER_PORT=${AX_E2E_SCHEDULER_PORT:-10259}
  KUBELET_PORT=${AX_E2E_KUBELET_PORT:-10250}
  KUBELET_HEALTHZ_PORT=${AX_E2E_KUBELET_HEALTHZ_PORT:-10248}
  POD_SUBNET=${AX_E2E_POD_SUBNET:-10.244.0.0/16}
  if [ -f "$STATE/settings.env" ]; then
    # shellcheck source=/dev/null
    . "$STATE/settings.env"
  fi
  # One short id per state dir keeps cgroups, the bridge and the CNI network of two state dirs apart.
  STATE_ID=$(printf '%s' "$STATE" | sha256sum | cut -c1-8)
  CGROUP=ax-e2e-$STATE_ID
  BRIDGE=axbr-$STATE_ID
  CNI_NETWORK=ax-e2e-$STATE_ID
  NAT_CHAIN=AX-E2E-$STATE_ID
}

save_settings() {
  cat >"$STATE/settings.env" <<EOF
ETCD_PORT=$ETCD_PORT
ETCD_PEER_PORT=$ETCD_PEER_PORT
APISERVER_PORT=$APISERVER_PORT
CONTROLLER_MANAGER_PORT=$CONTROLLER_MANAGER_PORT
SCHEDULER_PORT=$SCHEDULER_PORT
KUBELET_PORT=$KUBELET_PORT
KUBELET_HEALTHZ_PORT=$KUBELET_HEALTHZ_PORT
POD_SUBNET=$POD_SUBNET
EOF
}

# Components in start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet)

say() { printf '%s\n' "$*"; }
warn() { printf 'warning: %s\n' "$*" >&2; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

kubectl_admin() { "$KUBECTL" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }

# --- processes -------------------------------------------------------------------------------

# A pid counts as alive unless it is gone or a zombie.
pid_alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ]
}

# A pid is ours when it is alive, runs in this cluster's cgroup tree and its command line names
# this state dir: pid files can go stale and pids get reused, so a bare pid is never trusted.
pid_is_ours() {
  pid_alive "$1" || return 1
  grep -qE ":/$CGROUP(/|\$)" "/proc/$1/cgroup" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$STATE/"
}

# Prints the pid of a running component of this cluster; fails when it is not running.
component_pid() {
  local pid
  pid=$(cat "$RUN/$1.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && pid_is_ours "$pid" || return 1
  printf '%s\n' "$pid"
}

# --- cgroups ---------------------------------------------------------------------------------
# Every process `up` starts lives in the cgroup tree $CGROUP (one child per component, the
# kubelet's pods under $CGROUP/kubepods). `down` can then find every descendant, including
# containerd shims and container processes, without looking at process names.

cgroup_hierarchies() {
  local dir
  for dir in /sys/fs/cgroup/*/; do
    dir=${dir%/}
    [ "${dir##*/}" = unified ] && continue
    [ -f "$dir/cgroup.procs" ] && printf '%s\n' "$dir"
  done
}

cgroup_make() {
  local rel=$1 hierarchy path part
  while read -r hierarchy; do
    path=$hierarchy
    for part in ${rel//\// }; do
      local parent=$path
      path=$path/$part
      [ -d "$path" ] && continue
      mkdir "$path"
      # A new cpuset starts with no cpus or mems, and no process could join it.
      if [ -f "$path/cpuset.cpus" ]; then
        cat "$parent/cpuset.cpus" >"$path/cpuset.cpus"
        cat "$parent/cpuset.mems" >"$path/cpuset.mems"
      fi
    done
  done < <(cgroup_hierarchies)
}

cgroup_join() {
  local rel=$1 pid=$2 hierarchy
  while read -r hierarchy; do
    printf '%s\n' "$pid" >"$hierarchy/$rel/cgroup.procs"
  done < <(cgroup_hierarchies)
}

# Pids of every process in a cgroup subtree. The pids hierarchy holds every process runc starts
# for a pod too, so it is the one to read when it exists.
cgroup_pids() {
  local rel=$1 hierarchy
  hierarchy=/sys/fs/cgroup/pids
  [ -d "$hierarchy" ] || hierarchy=$(cgroup_hierarchies | head -1)
  [ -d "$hierarchy/$rel" ] || return 0
  find "$hierarchy/$rel" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un
}

cgroup_kill() {
  local rel=$1 pids tries=0
  while pids=$(cgroup_pids "$rel") && [ -n "$pids" ]; do
    # shellcheck disable=SC2086
    kill -KILL $pids 2>/dev/null || true
    tries=$((tries + 1))
    [ "$tries" -ge 100 ] && { warn "processes left in cgroup $rel: ${pids//$'\n'/ }"; return 1; }
    sleep 0.1
  done
}

cgroup_remove() {
  local rel=$1 hierarchy
  while read -r hierarchy; do
    [ -d "$hierarchy/$rel" ] && find "$hierarchy/$rel" -depth -type d -exec rmdir {} + 2>/dev/null
  done < <(cgroup_hierarchies)
  return 0
}

# --- daemons ---------------------------------------------------------------------------------

# start_daemon NAME COMMAND...: runs COMMAND in the background in its own session and in the
# cgroup $CGROUP/NAME, appends its output to $LOGS/NAME.log and records its pid.
start_daemon() {
  local name=$1
  shift
  mkdir -p "$LOGS" "$RUN"
  cgroup_make "$CGROUP/$name"
  printf '=== %s starting: %s\n' "$(date -u +%FT%TZ)" "$*" >>"$LOGS/$name.log"
  (
    cgroup_join "$CGROUP/$name" "$BASHPID"
    # The daemon outlives this script: it must not hold the up/down lock or a caller's pipe.
    local fds=() fd
    for fd in "/proc/$BASHPID/fd/"*; do fds+=("${fd##*/}"); done
    for fd in "${fds[@]}"; do
      if [ "$fd" -gt 2 ] 2>/dev/null; then { exec {fd}>&-; } 2>/dev/null || true; fi
    done
    # Not a process group leader (no job control), so setsid does not fork and the pid stays $!.
    exec setsid "$@" </dev/null >>"$LOGS/$name.log" 2>&1
  ) &
  local pid=$! tries=0
  printf '%s\n' "$pid" >"$RUN/$name.pid"
  # Until the exec the child still looks like this script; callers judge it after the exec.
  until pid_is_ours "$pid" || ! pid_alive "$pid" || [ "$tries" -ge 100 ]; do
    tries=$((tries + 1))
    sleep 0.05
  done
}

# The end of a component's log from its latest start, without Go's goroutine dump, which follows
# a fatal error and would bury it.
log_tail() {
  local log=$1 lines=${2:-20}
  awk '/^=== .* starting: / { n = 0; dump = 0 } /^goroutine [0-9]+ \[/ { dump = 1 } !dump { buf[n++] = $0 }
    END { for (i = (n > keep ? n - keep : 0); i < n; i++) print buf[i] }' keep="$lines" "$log"
}

# stop_daemon NAME [TIMEOUT]: SIGTERM to the component's process group, SIGKILL after TIMEOUT
# seconds, then SIGKILL to anything left in its cgroup (children that changed session).
stop_daemon() {
  local name=$1 timeout=${2:-15} pid
  if pid=$(component_pid "$name"); then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    wait_pids_gone "$timeout" "$pid" || kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
    wait_pids_gone 5 "$pid" || warn "$name (pid $pid) did not exit"
    wait "$pid" 2>/dev/null || true
  fi
  cgroup_kill "$CGROUP/$name" || true
  rm -f "$RUN/$name.pid"
}

# wait_pids_gone TIMEOUT PID...: true once none of the pids is alive.
wait_pids_gone() {
  local timeout=$1 deadline pid alive
  shift
  deadline=$(($(date +%s) + timeout))
  while :; do
    alive=
    for pid in "$@"; do pid_alive "$pid" && alive=1; done
    [ -z "$alive" ] && return 0
    [ "$(date +%s)" -ge "$deadline" ] && return 1
    sleep 0.1
  done
}

# Who listens on a TCP port: "name (pid N)", empty when nobody does.
port_listener() {
  ss -Hltnp "sport = :$1" 2>/dev/null | head -1 | sed -n 's/.*users:(("\([^"]*\)",pid=\([0-9]*\).*/\1 (pid \2)/p;t;s/.*LISTEN.*/an unknown process/p'
}

port_listener_pid() {
  ss -Hltnp "sport = :$1" 2>/dev/null | sed -n 's/.*users:(("[^"]*",pid=\([0-9]*\).*/\1/p' | head -1
}
