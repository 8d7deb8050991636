#!/usr/bin/env bash
# stride-perf stream (trespass measured as perftest measures the verbs): latency and
# bandwidth rows, over the byte stream and over messages, one and two connections, with a
# sane row on the client for each. A short run of each; scripts/trespass-compare is the
# measurement. Binary: ${STRIDE_BIN:-target/debug/stride-perf}.
# e2e-hosts: 1 2
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/stride.sh

# stream_run NAME KIND SIZE ITERS ARGS...: a stride-perf stream server where peers.sh puts
# servers and a client connecting to its RDMA address; the client must print a sane row.
stream_run() {
    local name=$1 kind=$2 size=$3 iters=$4
    shift 4
    stride_port=$((stride_port + 1))
    echo "$name"
    if ! run_pair "wait_cm_listen $stride_port 30" \
        "$bin" stream "$kind" "$@" -s "$size" -n "$iters" -p "$stride_port" -- \
        "$bin" stream "$kind" "$@" -s "$size" -n "$iters" -p "$stride_port" "$SERVER_IP"; then
        fail "$name: a side failed"
        return
    fi
    local n
    n=$(rows "$PAIR_DIR/client.log" "$kind" "$size" "$iters")
    [ "$n" -ge 1 ] || fail "$name: no sane $kind row for $size B x $iters on the client"
    if grep -q panicked "$PAIR_DIR"/*.log; then fail "$name: a panic"; fi
}

stream_run "stream lat, 64 B" lat 64 200
stream_run "stream lat, messages of 4 KiB" lat 4096 100 --messages
stream_run "stream bw, 64 KiB" bw 65536 200
stream_run "stream bw, 2 connections of 1 KiB messages" bw 1024 500 --connections 2 --messages
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all stride-perf stream runs gave their rows"
