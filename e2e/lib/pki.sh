# shellcheck shell=bash
# The cluster's CA, serving and client certificates, service-account keys, static tokens and
# kubeconfigs. Sourced after common.sh. Everything is made once per state dir.

pki_openssl_config() {
  cat >"$PKI/openssl.cnf" <<'EOF'
[req]
distinguished_name = dn
[dn]
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign,digitalSignature
subjectKeyIdentifier = hash
EOF
}

# issue_cert NAME SUBJECT EXTENSIONS: key + certificate signed by the cluster CA.
issue_cert() {
  local name=$1 subject=$2 extensions=$3
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subject" -config "$PKI/openssl.cnf" -out "$PKI/$name.csr"
  printf '%s\n' "$extensions" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 3650 -extfile "$PKI/$name.ext" \
    -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_pki() {
  [ -f "$PKI/done" ] && return 0
  rm -rf "$PKI"
  mkdir -p "$PKI"
  chmod 0700 "$PKI"
  pki_openssl_config
  openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
  openssl req -x509 -new -key "$PKI/ca.key" -subj /CN=ax-e2e-ca -days 3650 \
    -config "$PKI/openssl.cnf" -extensions ca -out "$PKI/ca.crt"
  issue_cert apiserver /CN=kube-apiserver "basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1,DNS:localhost,IP:$KUBERNETES_SERVICE_IP,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  # The API server proves itself to the kubelet (logs, exec) with this client certificate.
  issue_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "basicConstraints = CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = clientAuth"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  make_tokens
  touch "$PKI/done"
}

# Static bearer tokens: token,user,uid,"groups".
make_tokens() {
  local admin cm scheduler kubelet
  admin=$(openssl rand -hex 24)
  cm=$(openssl rand -hex 24)
  scheduler=$(openssl rand -hex 24)
  kubelet=$(openssl rand -hex 24)
  cat >"$PKI/tokens.csv" <<EOF
$admin,admin,admin,"system:masters"
$cm,system:kube-controller-manager,system:kube-controller-manager
$scheduler,system:kube-scheduler,system:kube-scheduler
$kubelet,system:node:$NODE_NAME,system:node:$NODE_NAME,"system:nodes"
EOF
  chmod 0600 "$PKI/tokens.csv"
}

token_of() {
  awk -F, -v user="$1" '$2 == user { print $1; exit }' "$PKI/tokens.csv"
}

# write_kubeconfig FILE USER TOKEN [NAMESPACE]
write_kubeconfig() {
  local file=$1 user=$2 token=$3 namespace=${4:-default} ca
  ca=$(base64 -w0 <"$PKI/ca.crt")
  (
    umask 077
    cat >"$file.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ax-e2e
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority-data: $ca
users:
- name: $user
  user:
    token: $token
contexts:
- name: ax-e2e
  context:
    cluster: ax-e2e
    user: $user
    namespace: $namespace
current-context: ax-e2e
EOF
  )
  mv "$file.tmp" "$file"
}

make_kubeconfigs() {
  write_kubeconfig "$ADMIN_KUBECONFIG" admin "$(token_of admin)"
  write_kubeconfig "$STATE/kube-controller-manager.kubeconfig" system:kube-controller-manager \
    "$(token_of system:kube-controller-manager)"
  write_kubeconfig "$STATE/kube-scheduler.kubeconfig" system:kube-scheduler "$(token_of system:kube-scheduler)"
  write_kubeconfig "$STATE/kubelet.kubeconfig" "system:node:$NODE_NAME" "$(token_of "system:node:$NODE_NAME")"
}
