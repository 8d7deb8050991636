#!/usr/bin/env bash
# The link between two hosts fails during a stride-perf write bw (server on the peer host):
#  - Ports down (scripts/link down: both ends, as a cable pulled): SoftRoCE moves the QPs to
#    the error state at once, so the client's WRITEs complete flushed; its error names the
#    port that went down as the likely cause. The server, which posts nothing, sees its port
#    go down and ends once the port has stayed down past the peer's retry budget (plus
#    slack), saying so. Both end within 10 s, while the link is still down.
#  - Ports down for 1 s, then up: the server reports the port down and up again, then learns
#    the client's error once the link carries it.
# Not checked: a black hole (netem loss 100%, ports up), past or within the retry budget.
# On this rig SoftRoCE handles it inconsistently: past the budget (8 s, -u 14) the requester's
# QP failed at once (flushed) in three runs and was still resending 10 s later in a fourth,
# past its 0.5 s budget; a 1 s gap within an 8.6 s budget (-u 18) was ridden out twice and
# failed the QP once. The retry error's text (the budget, the peer or the link gone) is
# covered by stride's unit tests.
# e2e-hosts: 2
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${RDMA_TEST_HOSTS:-1}" != 2 ]; then
    echo "skipped: a link to break needs two hosts ('scripts/softroce run --hosts 2')"
    exit 0
fi
. scripts/lib/stride.sh
work=$(mktemp -d)
trap 'scripts/link up >/dev/null 2>&1; scripts/link clear >/dev/null 2>&1; rm -rf "$work"' EXIT

# start_pair ARGS...: a stride-perf server on the peer host and a client here, in the
# background (SERVER_PID, CLIENT_PID; logs $work/server, $work/client), once the client has
# printed its first interval (or its table header).
start_pair() {
    stride_port=$((stride_port + 1))
    "${SERVER_ON[@]}" "$bin" "$@" -d "$SERVER_DEVICE" -p "$stride_port" >"$work/server" 2>&1 &
    SERVER_PID=$!
    wait_tcp_listen "$stride_port" 30 || { fail "the server never listened"; return 1; }
    "$bin" "$@" -d "$dev" -p "$stride_port" "$SERVER_ADDR" >"$work/client" 2>&1 &
    CLIENT_PID=$!
    local deadline=$((SECONDS + 90))
    # A timed run prints an interval line every second, and its table header at the end.
    until grep -qE '#bytes| interval +[0-9]' "$work/client" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || { fail "the run did not start within 90 s"; return 1; }
        sleep 0.2
    done
}

# ends SIDE LIMIT PID T0: waits for PID at most LIMIT seconds (then kills it); records the
# exit status in RC_SIDE and the seconds since T0 in AFTER_SIDE.
ends() {
    local side=$1 limit=$2 pid=$3 t0=$4 rc=0 start=$SECONDS
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - start)) -lt "$limit" ]; do sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        rc="still running"
    else
        wait "$pid" || rc=$?
    fi
    printf -v "RC_$side" '%s' "$rc"
    printf -v "AFTER_$side" '%s' $((SECONDS - t0))
}

# failed_in SIDE BOUND: SIDE must have failed within BOUND seconds.
failed_in() {
    local rc_var=RC_$1 after_var=AFTER_$1
    local rc=${!rc_var} after=${!after_var}
    if [ "$rc" = 0 ] || [ "$rc" = "still running" ]; then
        fail "$1: exit '$rc' (it must fail)"
        show_log "$1" "$work/$1"
    elif [ "$after" -gt "$2" ]; then
        fail "$1: ended after ${after} s (bound: $2 s)"
    else
        echo "  ok: the $1 ended (exit $rc) ${after} s after the fault"
    fi
}

errors() { grep -h 'stride-perf' "$work/client" "$work/server" | grep -v '^ ' | sed 's/^/    /'; }

echo "ports down (scripts/link down) for 8 s during write bw -u 14"
if start_pair write bw -D 60 -s 4096 -u 14; then
    sleep 1
    t0=$SECONDS
    scripts/link down >/dev/null || fail "scripts/link down failed"
    ends client 10 "$CLIENT_PID" "$t0"
    ends server 10 "$SERVER_PID" "$t0"
    state=$(cat "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null)
    scripts/link up >/dev/null || fail "scripts/link up failed"
    failed_in client 10
    failed_in server 10
    case $state in *ACTIVE*) fail "the port was up again before both sides ended" ;; esac
    must_say "$work/client" "failed at message .*; $dev port 1 went down .* before: the link is the likely cause" \
        "the client's error names its port going down"
    must_say "$work/server" "port 1: the link went down \\(port error\\)" "the server reports the port error"
    must_say "$work/server" "went down .* ago and is still down: longer than the peer keeps resending, about 536 ms" \
        "the server's error states the peer's retry budget"
    errors
fi

echo "ports down for 1 s, then up, during write bw -u 14"
if start_pair write bw -D 60 -s 4096 -u 14; then
    sleep 1
    t0=$SECONDS
    scripts/link down >/dev/null || fail "scripts/link down failed"
    sleep 1
    scripts/link up >/dev/null || fail "scripts/link up failed"
    ends client 10 "$CLIENT_PID" "$t0"
    ends server 15 "$SERVER_PID" "$t0"
    failed_in client 10
    failed_in server 15
    must_say "$work/server" "port 1: the link went down \\(port error\\)" "the server reports the port error"
    must_say "$work/server" "port 1: the link is up again after [0-9.]+ (ms|s) \\(port active\\)" \
        "the server reports the port active again"
    must_say "$work/server" "the peer stopped: .*went down" "the server learns the client's reason"
    errors
fi

finish
