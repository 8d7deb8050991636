#!/usr/bin/env bash
# stride-perf on bad input: each case must end with a clear message and a non-zero exit
# within a bounded time, never a hang. Binary: ${STRIDE_BIN:-target/debug/stride-perf}.
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/stride.sh

echo "local mistakes"
expect_error "no server listening" "is the server running" \
    "$bin" write bw -d "$dev" -p 18790 127.0.0.1
expect_error "unknown device" "no RDMA device named \"nosuch0\"; available: .*$dev" \
    "$bin" write bw -d nosuch0
expect_error "GID index out of range" "has no GID index 200" \
    "$bin" write bw -d "$dev" -x 200
expect_error "read on UD" "READ needs a reliable connection" \
    "$bin" read bw -d "$dev" -c UD
expect_error "size larger than the device allows" "larger than $dev port 1 allows" \
    "$bin" write bw -d "$dev" -s 4294967295
expect_error "UD message larger than the MTU" "does not fit one UD datagram" \
    "$bin" send bw -d "$dev" -c UD -s 8192
expect_error "completion events on write lat" "does not apply to write lat" \
    "$bin" write lat -d "$dev" -e
# -c DC needs an mlx5 device: on any other (rxe here) both sides refuse before any QP is
# made, the server before it waits for a client, the client before it connects.
dc_need="$dev is an? [a-z0-9_]+ device, not mlx5: -c DC .*needs an mlx5 NIC"
expect_error "DC on a device that is not mlx5 (server)" "$dc_need" \
    "$bin" write bw -d "$dev" -c DC
expect_error "DC on a device that is not mlx5 (client)" "$dc_need" \
    "$bin" send lat -d "$dev" -c DC -p 18791 127.0.0.1
out=$(timeout -k 5 30 "$bin" read bw -d "$dev" -c DC 2>&1)
if grep -q "waiting for a client" <<<"$out"; then
    fail "DC on a device that is not mlx5: the server waited for a client first: $out"
else
    echo "  ok: DC on a device that is not mlx5: refused before the server waits"
fi

echo "mismatched sides"
pair_error "different -s" 'message size \(-s/-a\): server \[4096\], client \[8192\]' \
    write bw -s 4096 -- write bw -s 8192
pair_error "different verbs" 'verb: server write, client read' \
    write bw -- read bw

# killed_peer NAME VICTIM ARGS...: runs a pair for 20 s (-D), kills VICTIM (SIGKILL) after
# 2 s; the survivor must stop with an error within 15 s, well before its run would have ended.
# (No `timeout` wrapper here: the signal must reach stride-perf itself; the loop below bounds
# the wait instead.)
killed_peer() {
    local name=$1 victim=$2
    shift 2
    stride_port=$((stride_port + 1))
    local dir
    dir=$(mktemp -d)
    "$bin" "$@" -d "$dev" -p "$stride_port" >"$dir/server" 2>&1 &
    local spid=$!
    wait_tcp_listen "$stride_port" 30 || { fail "$name: the server never listened"; kill -9 "$spid"; return; }
    "$bin" "$@" -d "$dev" -p "$stride_port" 127.0.0.1 >"$dir/client" 2>&1 &
    local cpid=$!
    sleep 2
    local survivor_pid=$cpid survivor=client victim_pid=$spid
    if [ "$victim" = client ]; then
        survivor_pid=$spid survivor=server victim_pid=$cpid
    fi
    kill -9 "$victim_pid"
    wait "$victim_pid" 2>/dev/null
    local t0=$SECONDS rc=0
    while kill -0 "$survivor_pid" 2>/dev/null && [ $((SECONDS - t0)) -le 15 ]; do sleep 0.2; done
    if kill -0 "$survivor_pid" 2>/dev/null; then
        kill -9 "$survivor_pid"
        wait "$survivor_pid" 2>/dev/null
        fail "$name: the $survivor was still running 15 s after the $victim died"
        show_log "$survivor" "$dir/$survivor"
        rm -rf "$dir"
        return
    fi
    wait "$survivor_pid" || rc=$?
    if [ "$rc" -eq 0 ]; then
        fail "$name: the $survivor exited 0"
        show_log "$survivor" "$dir/$survivor"
    elif ! grep -q 'stride-perf: error:' "$dir/$survivor"; then
        fail "$name: the $survivor gave no error message"
        show_log "$survivor" "$dir/$survivor"
    else
        echo "  ok: $name: the $survivor stopped in $((SECONDS - t0)) s:" \
            "$(grep 'stride-perf: error:' "$dir/$survivor")"
    fi
    rm -rf "$dir"
}

echo "peer killed mid-run"
killed_peer "server killed during write bw" server write bw -D 20 -s 4096
killed_peer "client killed during write lat" client write lat -D 20
killed_peer "client killed during read bw (passive server)" client read bw -D 20 -s 4096
finish
