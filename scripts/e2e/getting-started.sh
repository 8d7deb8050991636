#!/usr/bin/env bash
# The two Getting Started programs of README.md (sideway/examples/getting_started_rc.rs and
# getting_started_cm.rs), each as server and client: the verbs-only RC program trades
# endpoints over TCP and exchanges a SEND each way, waiting on its completion channel; the
# rdma_cm program does an RDMA WRITE, a fetch-and-add and a SEND with immediate data. Each
# output is checked for what the program says it did. Runs where scripts/softroce runs
# commands.
#
# Under `scripts/softroce run --hosts 2` the servers run on the peer host, on its address,
# and the clients here, across the link.
#
# EXAMPLES_BIN: where cargo put the example binaries (default target/debug/examples; build
# them with cargo build -p sideway-rdma --examples).
# e2e-hosts: 1 2
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/peers.sh

: "${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}"
bin=${EXAMPLES_BIN:-target/debug/examples}
rc=$bin/getting_started_rc
cm=$bin/getting_started_cm
for b in "$rc" "$cm"; do
    [ -x "$b" ] || { echo "FAIL: no $b (build with cargo build -p sideway-rdma --examples)" >&2; exit 1; }
done

echo "getting_started_rc: verbs, endpoints over TCP, SENDs both ways, completion events"
port=18600
dev_args=()
[ -n "${RDMA_TEST_DEVICE:-}" ] && dev_args=(--device "$RDMA_TEST_DEVICE")
server_dev_args=()
[ -n "${SERVER_DEVICE:-}" ] && server_dev_args=(--device "$SERVER_DEVICE")
run_pair "wait_tcp_listen $port 30" \
    "$rc" "${server_dev_args[@]}" --gid-index "$SERVER_GID_INDEX" --port "$port" -- \
    "$rc" "${dev_args[@]}" --gid-index "${RDMA_TEST_GID_INDEX:-1}" --port "$port" "$SERVER_ADDR"
expect_in "$PAIR_DIR/server.log" "^got: hello from the client$" "the client's SEND"
expect_in "$PAIR_DIR/client.log" "^got: hello from the server$" "the server's answer"
expect_in "$PAIR_DIR/client.log" "^remote endpoint [0-9a-f]{4}:[0-9a-f]{6}:001234:[0-9a-f]{32}$" \
    "the server's endpoint line"
echo "  ok: getting_started_rc"

echo "getting_started_cm: rdma_cm, RDMA WRITE, fetch-and-add, SEND with immediate"
port=7600
run_pair "wait_cm_listen $port 30" \
    "$cm" --listen "$SERVER_IP" --port "$port" -- \
    "$cm" --port "$port" "$SERVER_IP"
expect_in "$PAIR_DIR/server.log" "^RDMA WRITE: hello through RDMA WRITE$" "the client's WRITE"
expect_in "$PAIR_DIR/server.log" "^SEND with immediate 0x5eed: hello through SEND$" \
    "the SEND with its immediate data"
expect_in "$PAIR_DIR/server.log" "^counter after fetch-and-add: 42$" "the counter, 37 + 5"
expect_in "$PAIR_DIR/client.log" "^fetch-and-add: the counter was 37$" "the old value"
expect_in "$PAIR_DIR/server.log" "^the client disconnected$" "the disconnect"
echo "  ok: getting_started_cm"

echo "getting_started_cm: a client with no server fails in bounded time, saying why"
out=$(mktemp)
status=0
timeout 60 "$cm" --port 7699 "$SERVER_IP" >"$out" 2>&1 || status=$?
sed 's/^/  /' "$out"
[ "$status" -eq 1 ] || { echo "  FAIL: exit status $status, wanted 1 (124: it hung)" >&2; exit 1; }
! grep -q panicked "$out" || { echo "  FAIL: it panicked" >&2; exit 1; }
echo "  ok: refused"
