#!/usr/bin/env bash
# stride-perf stream (trespass measured as perftest measures the verbs): latency and
# bandwidth rows, over the byte stream, over messages and over lent messages (zero-copy),
# one and two connections, through the blocking calls and through tokio (--tokio), with a
# sane row on the client for each. A short run of each; scripts/trespass-compare is the
# measurement.
# Binary: ${STRIDE_BIN:-target/debug/stride-perf}.
# e2e-hosts: 1 2
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/stride.sh

# stream_rows LOG KIND SIZE ITERS: rows' check (scripts/lib/stride.sh) for stream's rows,
# which end with one more column (lat: round trips per second); ITERS '+' for any count
# (several connections report their sum).
stream_rows() {
    awk -v kind="$2" -v size="$3" -v iters="$4" '
        function pos(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ && x + 0 > 0 }
        $1 == size && (iters == "+" ? pos($2) : $2 == iters) {
            if (kind == "bw" && NF == 5 && pos($3) && pos($5)) n++
            if (kind == "lat" && NF == 10 && pos($3) && pos($4) && pos($5) && pos($6) \
                && pos($10) && $3 + 0 <= $5 + 0 && $5 + 0 <= $4 + 0) n++
        }
        END { print n + 0 }' "$1"
}

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
    local n want=$iters
    [[ " $* " == *" --connections "* ]] && want=+
    n=$(stream_rows "$PAIR_DIR/client.log" "$kind" "$size" "$want")
    [ "$n" -ge 1 ] || fail "$name: no sane $kind row for $size B x $iters on the client"
    if grep -q panicked "$PAIR_DIR"/*.log; then fail "$name: a panic"; fi
}

stream_run "stream lat, 64 B" lat 64 200
stream_run "stream lat, messages of 4 KiB" lat 4096 100 --messages
stream_run "stream bw, 64 KiB" bw 65536 200
stream_run "stream bw, 2 connections of 1 KiB messages" bw 1024 500 --connections 2 --messages
stream_run "stream lat on tokio, 64 B" lat 64 200 --tokio
stream_run "stream lat on tokio with the adaptive spin, 64 B" lat 64 200 --tokio --busy-poll-max-us 250
stream_run "stream bw on tokio, 2 connections of 4 KiB messages" bw 4096 300 --connections 2 --messages --tokio
stream_run "stream lat, lent messages of 1 MiB (zero-copy)" lat 1048576 20 --lend
stream_run "stream bw on tokio, lent messages of 1 MiB (zero-copy)" bw 1048576 40 --lend --tokio
[ "$failures" -eq 0 ] || { echo "$failures failure(s)"; exit 1; }
echo "all stride-perf stream runs gave their rows"
