#!/usr/bin/env bash
# image.sh BINARY IMAGE:TAG — puts a binary into a FROM-scratch image (entrypoint, user 65532, the
# machine's CA bundle) and imports it into the e2e cluster's containerd. There is no registry: use
# the printed reference with imagePullPolicy: Never. A static binary goes in alone (a Rust binary
# is static when built with RUSTFLAGS='-C target-feature=+crt-static' --target
# x86_64-unknown-linux-gnu, as the Dockerfile's is); a dynamic one goes in without its debug info
# and with its loader and the shared libraries ldd names, at the paths it looks for them.
set -euo pipefail
# shellcheck source-path=SCRIPTDIR

# shellcheck source=SCRIPTDIR/lib/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"
# shellcheck source=SCRIPTDIR/lib/images.sh
. "$E2E_DIR/lib/images.sh"
load_settings

die() { printf 'image.sh: %s\n' "$*" >&2; exit 1; }

[ $# -eq 2 ] || { sed -n '2,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
binary=$1
reference=$(qualified_reference "$2")
[[ ${reference##*/} == *:* ]] || die "give the image a tag, like $2:dev"
if [ ! -f "$binary" ] || [ ! -x "$binary" ]; then die "$binary is not an executable file"; fi
timeout 5 ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1 \
  || die "the cluster's containerd ($CONTAINERD_SOCK) is not running; run e2e/cluster.sh up"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
name=$(basename "$binary")
mkdir -p "$work/ctx/rootfs/etc" "$work/ctx/rootfs/tmp"
chmod 1777 "$work/ctx/rootfs/tmp"
install -m 0755 "$binary" "$work/ctx/rootfs/$name"
# FROM scratch has no dynamic loader and no libc: a dynamic binary brings its own. The e2e tests
# install the debug build this way, so they need no second (release, static) build of the operator.
if readelf -l "$binary" 2>/dev/null | grep -q 'Requesting program interpreter'; then
  objcopy --strip-debug "$work/ctx/rootfs/$name"
  for lib in $(ldd "$binary" | grep -o '/[^ ]*'); do
    mkdir -p "$work/ctx/rootfs$(dirname "$lib")"
    cp -L "$lib" "$work/ctx/rootfs$lib"
  done
fi
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' >"$work/ctx/rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$work/ctx/rootfs/etc/group"
# The machine's CA bundle, for TLS to anything but the API server (whose CA comes with the
# ServiceAccount): ax-operator loads the system roots at start for HTTPS callbacks.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$work/ctx/rootfs/etc/ssl/certs"
  install -m 0444 /etc/ssl/certs/ca-certificates.crt "$work/ctx/rootfs/etc/ssl/certs/ca-certificates.crt"
fi
cat >"$work/ctx/Containerfile" <<EOF
FROM scratch
COPY rootfs/ /
USER 65532:65532
ENTRYPOINT ["/$name"]
EOF
build_image_archive "$reference" "$work/ctx" "$work/image.tar" || die "podman could not build $reference"
import_image_archive "$work/image.tar" || die "containerd could not import $reference"
say "imported $reference (use it with imagePullPolicy: Never)"
