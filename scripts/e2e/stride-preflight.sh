#!/usr/bin/env bash
# stride-perf's pre-flight diagnosis: before the QPs move to RTR both sides compare link
# layer, GID type, the address family of the chosen GIDs and the active MTU. A server on the
# link-local IPv6 GID (index 0 on SoftRoCE) against a client on the IPv4 one (index 1) must
# end on both sides, at once and without a hang, saying "pass -x 1 on the server"; a matching
# pair says what it agreed on in the banner. Binary: ${STRIDE_BIN:-target/debug/stride-perf}.
# e2e-hosts: 1
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. scripts/lib/stride.sh

echo "a matching pair says what it checked"
stride "write bw, GID index 1 on both" bw 4096 50 client write bw -s 4096 -n 50 -x 1
must_say "$PAIR_DIR/client.log" '^ Pre-flight      : both Ethernet \(RoCE\), IPv4 RoCE v2 GIDs, active MTU [0-9]+ / [0-9]+ B' "the pre-flight line"

echo "a link-local server and an IPv4 client are stopped before RTR, with the fix"
want='pre-flight check, before connecting: the server uses GID index 0 \(fe80:.*link-local IPv6, RoCE v2\), the client GID index 1 \(::ffff:[0-9.]+, IPv4, RoCE v2\): the address families differ .*pass -x 1 on the server'
pair_error "server -x 0, client -x 1" "$want" write bw -s 4096 -n 50 -x 0 -- \
    write bw -s 4096 -n 50 -x 1
pair_error "server -x 1, client -x 0" 'pass -x 1 on the client' send bw -s 4096 -n 50 -x 1 -- \
    send bw -s 4096 -n 50 -x 0
# With rdma_cm (-R) the GIDs are rdma_cm's business: no pre-flight refusal.
host=${SERVER_IP:-198.18.0.1} stride "write bw -R: rdma_cm setups pass" bw 4096 50 client \
    write bw -s 4096 -n 50 -R
finish
