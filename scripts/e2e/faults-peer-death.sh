#!/usr/bin/env bash
# A peer process killed (SIGKILL) on the other host mid-run: the survivor here ends within its
# stated bound and says the peer is gone (stride-perf: the out-of-band connection closes, or
# the peer's memory is gone; rc_pingpong: nothing completes within --stall-timeout). The other host
# itself stays up, as when a process crashes.
# e2e-hosts: 2
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${RDMA_TEST_HOSTS:-1}" != 2 ]; then
    echo "skipped: a peer on another host needs two hosts ('scripts/softroce run --hosts 2')"
    exit 0
fi
. scripts/lib/stride.sh
ours=${EXAMPLES_BIN:-target/debug}/rc_pingpong
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# survivor_ends NAME PID LOG SECS PATTERN: PID must exit non-zero within SECS and LOG must
# match PATTERN.
survivor_ends() {
    local name=$1 pid=$2 log=$3 limit=$4 pattern=$5 t0=$SECONDS rc=0
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid"
        wait "$pid" 2>/dev/null
        fail "$name: still running $limit s after its peer died"
        show_log survivor "$log"
        return
    fi
    wait "$pid" || rc=$?
    if [ "$rc" -eq 0 ]; then
        fail "$name: exit 0 after its peer died"
        show_log survivor "$log"
    elif ! grep -qE "$pattern" "$log"; then
        fail "$name: no message matching '$pattern'"
        show_log survivor "$log"
    else
        echo "  ok: $name: ended (exit $rc) in $((SECONDS - t0)) s: $(grep -E "$pattern" "$log" | head -1)"
    fi
}

# stride_killed NAME VICTIM ARGS...: a 30 s run; VICTIM (server: on the peer host, client:
# here) is killed 2 s in.
stride_killed() {
    local name=$1 victim=$2
    shift 2
    stride_port=$((stride_port + 1))
    "${SERVER_ON[@]}" "$bin" "$@" -d "$SERVER_DEVICE" -p "$stride_port" >"$work/server" 2>&1 &
    local spid=$!
    wait_tcp_listen "$stride_port" 30 || { fail "$name: no server"; kill -9 "$spid"; return; }
    "$bin" "$@" -d "$dev" -p "$stride_port" "$SERVER_ADDR" >"$work/client" 2>&1 &
    local cpid=$!
    sleep 2
    if [ "$victim" = server ]; then
        kill -9 "$spid"
        wait "$spid" 2>/dev/null
        survivor_ends "$name (client here)" "$cpid" "$work/client" 15 \
            'stride-perf: error: .*(peer|closed)'
    else
        kill -9 "$cpid"
        wait "$cpid" 2>/dev/null
        survivor_ends "$name (server on the peer host)" "$spid" "$work/server" 15 \
            'stride-perf: error: .*(peer|closed)'
    fi
}

echo "stride-perf"
# Every verb and test with its server killed: each measuring loop has its own wait, and a
# rewrite of one must not lose the dead-peer check (read and atomic lat once did: their wait
# reported progress on every turn, so the watchdog never ran).
for verb in write read send atomic; do
    for test in lat bw; do
        size=(-s 4096)
        [ "$verb" = atomic ] && size=()
        stride_killed "server killed during $verb $test" server "$verb" "$test" -D 30 "${size[@]}"
    done
done
stride_killed "client killed during read bw" client read bw -D 30 -s 4096

echo "rc_pingpong"
stride_port=$((stride_port + 1))
"${SERVER_ON[@]}" "$ours" -d "$SERVER_DEVICE" -g "$SERVER_GID_INDEX" -n 100000000 \
    --stall-timeout 5 -p "$stride_port" >"$work/server" 2>&1 &
spid=$!
if wait_tcp_listen "$stride_port" 30; then
    "$ours" -d "$dev" -g "${RDMA_TEST_GID_INDEX:-1}" -n 100000000 --stall-timeout 5 \
        -p "$stride_port" "$SERVER_ADDR" >"$work/client" 2>&1 &
    cpid=$!
    sleep 2
    kill -9 "$spid"
    wait "$spid" 2>/dev/null
    # Its bound is --stall-timeout (5 s): a ping-pong waiting for the peer's message has no
    # request outstanding that could fail.
    survivor_ends "rc_pingpong server killed (client here)" "$cpid" "$work/client" 15 \
        '(no completion for 5 s|retry|gone)'
else
    fail "rc_pingpong: no server"
    kill -9 "$spid" 2>/dev/null
fi
finish
