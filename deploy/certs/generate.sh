#!/usr/bin/env bash
# Make a private CA and one TLS certificate for the SuperLink and the ServerApp's data plane, for
# docker-compose.tls.yml.
#
#   deploy/certs/generate.sh [OUT_DIR]    (default deploy/certs/out, FEDGAN_CERTS_DIR in .env)
#   EXTRA_SANS="DNS:fl.example.org,IP:10.0.0.5" deploy/certs/generate.sh OUT_DIR
#
# Writes ca.crt, ca.key, server.pem, server.key. The certificate names the SuperLink as Compose
# services reach it (DNS:superlink) and as `flwr` on the host does (localhost, 127.0.0.1, ::1),
# and the ServerApp's data plane as the workers dial it (DNS:serverapp, the SuperNodes'
# dataplane-address); add EXTRA_SANS for SuperNodes on other hosts. Existing certificates are
# never overwritten.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-$here/out}"
days="${DAYS:-365}"
bits="${KEY_BITS:-4096}"

if [ -e "$out/ca.crt" ]; then
    echo "$out/ca.crt exists; not overwriting (remove $out to start over)." >&2
    exit 0
fi
mkdir -p "$out"
umask 077  # private keys readable by their owner only

export SUPERLINK_SANS="DNS:superlink,DNS:serverapp,DNS:localhost,IP:127.0.0.1,IP:::1${EXTRA_SANS:+,$EXTRA_SANS}"
conf="$here/certificate.conf"

openssl genrsa -out "$out/ca.key" "$bits" 2>/dev/null
openssl req -new -x509 -config "$conf" -extensions ca_ext -subj "/O=fedgan/CN=fedgan CA" \
    -key "$out/ca.key" -days "$days" -out "$out/ca.crt"

openssl genrsa -out "$out/server.key" "$bits" 2>/dev/null
openssl req -new -config "$conf" -key "$out/server.key" -out "$out/server.csr"
openssl x509 -req -in "$out/server.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" \
    -CAcreateserial -days "$days" -extfile "$conf" -extensions server_ext -out "$out/server.pem"
rm -f "$out/server.csr" "$out/ca.srl"
chmod 644 "$out/ca.crt" "$out/server.pem"

echo "Wrote $out/{ca.crt,ca.key,server.pem,server.key} (SANs: $SUPERLINK_SANS)."
echo "The containers run as uid 49999: 'sudo chown 49999:49999 $out/server.key' before 'up'."
