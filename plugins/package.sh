#!/usr/bin/env bash
# Builds the krew archive of kubectl-ax and its manifest (plugins/ax.yaml with version, URI and
# checksum filled in) into target/plugin/.
#
#   plugins/package.sh [BASE_URL]   BASE_URL: where the archive will be published
#                                    (default: file:// of target/plugin, for --archive installs)
# AX_PLUGIN_BINARY: use this binary instead of building a static release one.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=target/plugin
ARCHIVE=kubectl-ax-linux-amd64.tar.gz
mkdir -p "$OUT"
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
BINARY=${AX_PLUGIN_BINARY:-}
if [ -z "$BINARY" ]; then
  # Static, so it runs on any Linux with kubectl.
  CARGO_TARGET_DIR=target/static RUSTFLAGS='-C target-feature=+crt-static' \
    cargo build --release --target x86_64-unknown-linux-gnu --bin kubectl-ax
  BINARY=target/static/x86_64-unknown-linux-gnu/release/kubectl-ax
fi
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
install -m 0755 "$BINARY" "$STAGE/kubectl-ax"
tar -C "$STAGE" -czf "$OUT/$ARCHIVE" kubectl-ax
SHA=$(sha256sum "$OUT/$ARCHIVE" | cut -d' ' -f1)
BASE=${1:-file://$(realpath "$OUT")}
sed -e "s|@VERSION@|$VERSION|" -e "s|@URI@|$BASE/$ARCHIVE|" -e "s|@SHA256@|$SHA|" \
  plugins/ax.yaml >"$OUT/ax.yaml"
echo "$OUT/$ARCHIVE ($SHA)"
echo "$OUT/ax.yaml"
