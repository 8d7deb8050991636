#!/usr/bin/env bash
# The link between two hosts goes down during a stride-perf run (scripts/link down: both ends,
# so both ports report it).
#  - Down for longer than the retry budget (-u 14: about 0.5 s): the client, whose RDMA
#    WRITEs go unacknowledged, ends with the transport retry error, which states the budget
#    and names the peer or the link as gone; the server, which posts nothing, sees its port go
#    down and ends once the port has stayed down past that budget (plus slack). Both say the
#    link went down, and both end while it is still down, within seconds.
#  - Down for 1 s within a longer budget (-u 18: about 8.6 s): the run completes, and both
#    sides report the port going down and coming back.
# e2e-hosts: 2
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${RDMA_TEST_HOSTS:-1}" != 2 ]; then
    echo "skipped: a link to take down needs two hosts ('scripts/softroce run --hosts 2')"
    exit 0
fi
. scripts/lib/stride.sh
work=$(mktemp -d)
trap 'scripts/link up >/dev/null 2>&1; rm -rf "$work"' EXIT

# start_pair ARGS...: a stride-perf server on the peer host and a client here, in the
# background: SERVER_PID, CLIENT_PID, logs in $work/server and $work/client.
start_pair() {
    stride_port=$((stride_port + 1))
    "${SERVER_ON[@]}" "$bin" "$@" -d "$SERVER_DEVICE" -p "$stride_port" >"$work/server" 2>&1 &
    SERVER_PID=$!
    wait_tcp_listen "$stride_port" 30 || { fail "the server never listened"; return 1; }
    "$bin" "$@" -d "$dev" -p "$stride_port" "$SERVER_ADDR" >"$work/client" 2>&1 &
    CLIENT_PID=$!
    # Until both print their table header: the run is under way.
    local deadline=$((SECONDS + 30))
    until grep -q '#bytes' "$work/client" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || { fail "the run did not start within 30 s"; return 1; }
        sleep 0.2
    done
}

# ends_within SECS PID: waits for PID to exit, at most SECS seconds (then kills it); sets
# RC (its exit status, or "still running") and ENDED (seconds taken).
ends_within() {
    local limit=$1 pid=$2 t0=$SECONDS
    while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t0)) -lt "$limit" ]; do sleep 0.1; done
    ENDED=$((SECONDS - t0))
    if kill -0 "$pid" 2>/dev/null; then
        kill -9 "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
        RC="still running"
        return
    fi
    RC=0
    wait "$pid" || RC=$?
}

echo "link down past the retry budget (-u 14) during write bw"
if start_pair write bw -D 60 -s 4096 -u 14; then
    sleep 1
    t_down=$SECONDS
    scripts/link down || fail "scripts/link down failed"
    ends_within 20 "$CLIENT_PID"
    client_rc=$RC client_after=$((SECONDS - t_down))
    ends_within 20 "$SERVER_PID"
    server_rc=$RC server_after=$((SECONDS - t_down))
    still_down=$(cat "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null)
    scripts/link up >/dev/null || fail "scripts/link up failed"
    for side in client server; do
        rc_var=${side}_rc after_var=${side}_after
        rc=${!rc_var} after=${!after_var}
        if [ "$rc" = 0 ] || [ "$rc" = "still running" ]; then
            fail "$side: exit '$rc' (it must fail while the link is down)"
            show_log "$side" "$work/$side"
        else
            echo "  ok: the $side ended (exit $rc) ${after} s after the link went down"
        fi
        must_say "$work/$side" "port 1: the link went down \\(port error\\)" "$side reports the port error"
    done
    must_say "$work/client" "transport retry counter exceeded.*no acknowledgement came for about 536 ms .*-u 14.*the peer or the link is gone" \
        "the client's retry error, with its budget"
    must_say "$work/server" "went down .* ago and is still down: longer than the peer keeps resending, about 536 ms" \
        "the server's port-down error"
    case $still_down in *ACTIVE*) fail "the port was active again before both sides ended" ;; esac
    [ "$client_after" -le 10 ] || fail "the client took ${client_after} s (bound: 10 s)"
    [ "$server_after" -le 10 ] || fail "the server took ${server_after} s (bound: 10 s)"
    grep -h 'stride-perf: error' "$work/client" "$work/server" | sed 's/^/    /'
    grep -q panicked "$work"/* && fail "a panic"
fi

echo "link down for 1 s within the retry budget (-u 18) during write bw"
if start_pair write bw -D 6 -s 4096 -u 18; then
    sleep 1
    scripts/link down || fail "scripts/link down failed"
    sleep 1
    scripts/link up || fail "scripts/link up failed"
    ends_within 60 "$CLIENT_PID"
    client_rc=$RC
    ends_within 30 "$SERVER_PID"
    server_rc=$RC
    for side in client server; do
        rc_var=${side}_rc
        if [ "${!rc_var}" != 0 ]; then
            fail "$side: exit '${!rc_var}' (the run must survive a 1 s outage)"
            show_log "$side" "$work/$side"
        else
            echo "  ok: the $side completed the run"
        fi
        must_say "$work/$side" "port 1: the link went down \\(port error\\)" "$side reports the port error"
        must_say "$work/$side" "port 1: the link is up again after [0-9.]+ (ms|s) \\(port active\\)" \
            "$side reports the port active again"
    done
    rows "$work/client" bw 4096 + | grep -qx '[1-9][0-9]*' || fail "no result row on the client"
    grep -h 'port 1: the link' "$work/client" "$work/server" | sed 's/^/    /'
fi
finish
