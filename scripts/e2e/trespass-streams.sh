#!/usr/bin/env bash
# trespass streams end to end (trespass/examples/stream_check.rs): TRESPASS_CHECK_BYTES (1 GiB)
# streamed through a reader that sleeps at random, checked byte for byte by checksum; a peer
# killed with SIGKILL, and one stopped with SIGSTOP past its keep-alive period, each noticed
# by the survivor's blocked read within a stated bound. Runs where scripts/softroce runs
# commands; every program runs under `timeout`.
#
# TRESPASS_BIN: where cargo put trespass's example binaries (scripts/test passes the release
# build's target/release/examples, which moves the GiB about twice as fast in the emulated
# guest as the debug build; default: that, else target/debug/examples).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}"
dir=${TRESPASS_BIN:-}
if [ -z "$dir" ]; then
    dir=target/release/examples
    [ -x "$dir/stream_check" ] || dir=target/debug/examples
fi
bin=$dir/stream_check
[ -x "$bin" ] || { echo "FAIL: no $bin (build with cargo build --release -p trespass --examples)" >&2; exit 1; }
echo "stream_check: $bin"
bytes=${TRESPASS_CHECK_BYTES:-1073741824}
work=$(mktemp -d)
status=0
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; status=1; }

# wait_exit PID SECS: the exit status of PID, or 124 after killing it past SECS seconds.
wait_exit() {
    local pid=$1 limit=$2 t0=$SECONDS rc=0
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        return 124
    fi
    wait "$pid" || rc=$?
    return "$rc"
}

echo "1. $bytes bytes through a reader that sleeps at random"
addr=$RDMA_TEST_IP:7700
timeout 900 "$bin" serve "$addr" --sleepy >"$work/serve.log" 2>&1 &
server=$!
sleep 1
t0=$SECONDS
if timeout 900 "$bin" send "$addr" "$bytes" >"$work/send.log" 2>&1; then
    echo "  ok: $(tail -n1 "$work/send.log") ($((SECONDS - t0)) s)"
else
    fail "the stream check failed"
    cat "$work/send.log"
fi
wait_exit "$server" 30 || { fail "the server did not finish cleanly"; }
grep received "$work/serve.log" | sed 's/^/  server: /'

# peer_dies SIGNAL PORT LIMIT PATTERN: a server blocked in read, its idle client sent SIGNAL;
# the server's read must fail within LIMIT seconds with a message matching PATTERN.
peer_dies() {
    local sig=$1 port=$2 limit=$3 pattern=$4 rc=0
    timeout 120 "$bin" serve "$RDMA_TEST_IP:$port" --keepalive 1 >"$work/s$port.log" 2>&1 &
    local srv=$!
    sleep 1
    # Not under timeout: the signal must reach the program itself (the trap and the kill
    # below end it).
    "$bin" idle "$RDMA_TEST_IP:$port" --keepalive 1 >"$work/c$port.log" 2>&1 &
    local cli=$!
    sleep 2
    local t0=$SECONDS
    kill "-$sig" "$cli"
    wait_exit "$srv" "$limit" || rc=$?
    kill -9 "$cli" 2>/dev/null
    wait "$cli" 2>/dev/null
    if [ "$rc" -eq 3 ] && grep -Eq "$pattern" "$work/s$port.log"; then
        echo "  ok: $(grep 'read failed' "$work/s$port.log") ($((SECONDS - t0)) s after SIG$sig)"
    else
        fail "after SIG$sig the server exited $rc (want 3 within $limit s, a message matching '$pattern')"
        cat "$work/s$port.log" "$work/c$port.log"
    fi
}

echo "2. a peer killed (SIGKILL): the blocked reader sees a reset"
peer_dies KILL 7701 10 "reset|disconnected"
echo "3. a peer stopped (SIGSTOP) past the keep-alive period of 1 s: a keep-alive error within 2 periods"
peer_dies STOP 7702 10 "keep-alive"
exit "$status"
