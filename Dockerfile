# The ax-operator image: one static binary, nothing else.
#
# Build the binary first (static glibc, so it runs without a libc in the image):
#   RUSTFLAGS='-C target-feature=+crt-static' cargo build --release \
#     --target x86_64-unknown-linux-gnu --bin ax-operator
# then build from a context holding only the binary (the repository's target/ is large):
#   mkdir -p /tmp/ax-image && cp target/x86_64-unknown-linux-gnu/release/ax-operator /tmp/ax-image/
#   podman --storage-driver vfs build -f Dockerfile --build-arg BINARY=ax-operator \
#     -t localhost/ax-operator:dev /tmp/ax-image
FROM scratch

ARG BINARY=target/x86_64-unknown-linux-gnu/release/ax-operator
COPY --chmod=0555 ${BINARY} /ax-operator

# The nonroot user of distroless images; the chart runs it with a read-only root filesystem.
USER 65532:65532
# /metrics, /healthz, /readyz
EXPOSE 8080
ENTRYPOINT ["/ax-operator"]
