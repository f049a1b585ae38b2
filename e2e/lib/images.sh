# shellcheck shell=bash
# Building FROM-scratch images with podman and importing them into the cluster's containerd.
# Sourced after common.sh. There is no registry: pods use these images with imagePullPolicy Never
# or IfNotPresent (the examples' `busybox:1.36` is a second name of the busybox image).

# podman with a private, throwaway vfs store, so nothing outside the build dir is touched.
podman_private() {
  local store=$1
  shift
  podman --root "$store/storage" --runroot "$store/run" --storage-driver vfs \
    --cgroup-manager cgroupfs --events-backend file "$@"
}

# build_image_archive REFERENCE CONTEXT_DIR OUT_TAR: builds CONTEXT_DIR/Containerfile and saves
# the image as a docker-archive.
build_image_archive() {
  local reference=$1 context=$2 out=$3 store
  mkdir -p "$IMAGE_CACHE"
  store=$(mktemp -d "$IMAGE_CACHE/podman.XXXXXX")
  if podman_private "$store" build -q --pull=never -t "$reference" -f "$context/Containerfile" "$context" >/dev/null \
    && podman_private "$store" save -q --format docker-archive -o "$out.tmp" "$reference"; then
    mv "$out.tmp" "$out"
    rm -rf "$store"
  else
    rm -rf "$store" "$out.tmp"
    return 1
  fi
}

# The name podman gives a short reference: "app:1" becomes "localhost/app:1".
qualified_reference() {
  local reference=$1 first=${1%%/*}
  if [ "$first" = "$reference" ] || { [[ $first != *.* ]] && [[ $first != *:* ]] && [ "$first" != localhost ]; }; then
    reference=localhost/$reference
  fi
  printf '%s\n' "$reference"
}

ctr_cluster() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }

import_image_archive() {
  ctr_cluster images import "$1" >/dev/null
}

image_present() {
  [ -n "$(ctr_cluster images ls -q "name==$1" 2>/dev/null)" ]
}

# Image archives depend only on their inputs, so they are cached by a hash of those inputs and a
# second cluster on the same machine only imports them.
pause_image_archive() {
  local key ctx out
  key=$(cat "$K8S_BIN/pause" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
  out=$IMAGE_CACHE/ax-pause-$key.tar
  if [ ! -f "$out" ]; then
    ctx=$(mktemp -d)
    install -m 0755 "$K8S_BIN/pause" "$ctx/pause"
    printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$ctx/Containerfile"
    build_image_archive "$PAUSE_IMAGE" "$ctx" "$out" || { rm -rf "$ctx"; return 1; }
    rm -rf "$ctx"
  fi
  printf '%s\n' "$out"
}

busybox_image_archive() {
  local key ctx out applet
  key=$(cat /bin/busybox "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
  out=$IMAGE_CACHE/ax-busybox-$key.tar
  if [ ! -f "$out" ]; then
    ctx=$(mktemp -d)
    mkdir -p "$ctx/rootfs/bin" "$ctx/rootfs/etc" "$ctx/rootfs/tmp"
    chmod 1777 "$ctx/rootfs/tmp"
    install -m 0755 /bin/busybox "$ctx/rootfs/bin/busybox"
    for applet in $(/bin/busybox --list); do
      [ "$applet" = busybox ] || ln -s busybox "$ctx/rootfs/bin/$applet"
    done
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\nnonroot:x:65532:65532:nonroot:/:/bin/false\n' >"$ctx/rootfs/etc/passwd"
    printf 'root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n' >"$ctx/rootfs/etc/group"
    printf 'FROM scratch\nCOPY rootfs/ /\nENV PATH=/bin\nCMD ["/bin/sh"]\n' >"$ctx/Containerfile"
    build_image_archive "$BUSYBOX_IMAGE" "$ctx" "$out" || { rm -rf "$ctx"; return 1; }
    rm -rf "$ctx"
  fi
  printf '%s\n' "$out"
}
