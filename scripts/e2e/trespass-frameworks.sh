#!/usr/bin/env bash
# TLS (tokio-rustls, a certificate made at run time), HTTP/1.1 (hyper) and gRPC (tonic) over
# trespass streams, each beside the same over TCP (frameworks/src/bin/trespass-tls.rs,
# trespass-http.rs, trespass-grpc.rs): one short round each. The programs check every byte (a
# 2 MB TLS echo, 300 pings; a 4 MB file, a 404, 300 small requests; 300 unary calls, a
# server stream of 300 messages) and exit 1 on any difference; the check looks for both rows
# of each table. The committed numbers (docs/trespass-async.md) come
# from the programs' defaults (three rounds).
# FRAMEWORKS_BIN: where cargo put the programs (default target/release, else target/debug).
# e2e-hosts: 1
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}"
dir=${FRAMEWORKS_BIN:-}
if [ -z "$dir" ]; then
    dir=target/release
    [ -x "$dir/trespass-tls" ] || dir=target/debug
fi
status=0
check() {
    local name=$1 out rc
    shift
    [ -x "$dir/$name" ] || { echo "FAIL: no $dir/$name (cargo build --release -p trespass-frameworks)"; status=1; return; }
    out=$(timeout -k 5 300 "$dir/$name" "$RDMA_TEST_IP" "$@" 2>&1)
    rc=$?
    echo "$out"
    if [ "$rc" -ne 0 ]; then
        echo "FAIL: $name exited with status $rc"
        status=1
    elif ! grep -q '^trespass	' <<<"$out" || ! grep -q '^tcp	' <<<"$out"; then
        echo "FAIL: $name printed no row for trespass or for tcp"
        status=1
    else
        echo "ok: $name: both rows"
    fi
}
check trespass-tls --rounds 1 --bytes 2000000 --pings 300
check trespass-http --rounds 1 --size 4000000 --requests 300
check trespass-grpc --rounds 1 --requests 300 --stream 300
exit "$status"
