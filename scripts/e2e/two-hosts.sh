#!/usr/bin/env bash
# The two-host rig itself (`scripts/softroce run --hosts 2`): the hosts are separate network
# namespaces with their own devices; rdma-core's ibv_rc_pingpong between them really crosses
# the link (both rxe devices' packet counters and the veth ends' counters grow, by at least the
# messages sent); each fault scripts/link injects reaches that traffic (a delay shows in the
# latency) and the ping-pong survives it (loss: see faults-lossy-link.sh); and with the link down a ping-pong fails, in bounded time, and works again once it is up.
# e2e-hosts: 2
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. scripts/lib/peers.sh

if [ "${RDMA_TEST_HOSTS:-1}" != 2 ]; then
    echo "skipped: two-host checks need 'scripts/softroce run --hosts 2'"
    exit 0
fi
ours=${EXAMPLES_BIN:-target/debug}/rc_pingpong
[ -x "$ours" ] || { echo "FAILED: $ours is missing (cargo build -p sideway-examples)" >&2; exit 1; }
A=$RDMA_TEST_DEVICE
B=$RDMA_TEST_PEER_DEVICE
failures=0
fail() {
    echo "  FAIL: $*" >&2
    failures=$((failures + 1))
}
ok() { echo "  ok: $*"; }
work=$(mktemp -d)
# Whatever happens, leave the link whole for the checks after this one.
trap 'scripts/link clear >/dev/null 2>&1; scripts/link up >/dev/null 2>&1; rm -rf "$work"' EXIT

# snap NAME: the link's counters now, into $work/NAME.
snap() { scripts/link counters >"$work/$1" || fail "scripts/link counters failed"; }
# grew BEFORE AFTER COUNTER: how much COUNTER grew between the two snapshots.
grew() {
    awk -v c="$3" 'FNR == NR { if ($1 == c) b = $2; next } $1 == c { print $2 - b; f = 1 }
        END { if (!f) print "missing" }' "$work/$1" "$work/$2"
}
port=18900
# pingpong N [ARGS...]: ibv_rc_pingpong, N iterations, server on host B, client here. Leaves
# the logs in PAIR_DIR.
pingpong() {
    local n=$1
    shift
    port=$((port + 1))
    run_pair "wait_tcp_listen $port 30" \
        ibv_rc_pingpong -d "$B" -g "$RDMA_TEST_PEER_GID_INDEX" -n "$n" -p "$port" "$@" -- \
        ibv_rc_pingpong -d "$A" -g "$RDMA_TEST_GID_INDEX" -n "$n" -p "$port" "$@" "$RDMA_TEST_PEER_IP"
}

echo "two hosts: $A (${RDMA_TEST_IP}) in $RDMA_TEST_NETNS, $B (${RDMA_TEST_PEER_IP}) in" \
    "$RDMA_TEST_PEER_NETNS, kernel $(uname -r)"

echo "each host sees its own end of the link only, and its own variables"
if ip link show "$RDMA_TEST_NETDEV" >/dev/null 2>&1 && ! ip link show "$RDMA_TEST_PEER_NETDEV" >/dev/null 2>&1; then
    ok "this host has $RDMA_TEST_NETDEV and no $RDMA_TEST_PEER_NETDEV"
else
    fail "this host should have $RDMA_TEST_NETDEV and not $RDMA_TEST_PEER_NETDEV: $(ip -br link)"
fi
# shellcheck disable=SC2016 # expanded by the shell on the peer host
peer_view=$(scripts/on-peer-host sh -c \
    'ip link show "$RDMA_TEST_NETDEV" >/dev/null && echo "$RDMA_TEST_DEVICE $RDMA_TEST_IP $RDMA_TEST_PEER_DEVICE"' 2>&1)
if [ "$peer_view" = "$B $RDMA_TEST_PEER_IP $A" ]; then
    ok "scripts/on-peer-host runs on the peer: $peer_view"
else
    fail "scripts/on-peer-host should see '$B $RDMA_TEST_PEER_IP $A', saw '$peer_view'"
fi

echo "ibv_rc_pingpong across the link (server on $RDMA_TEST_PEER_NETNS), 200 iterations"
n=200
snap before
if pingpong "$n"; then
    snap after
    for c in "$A.sent_pkts" "$A.rcvd_pkts" "$B.sent_pkts" "$B.rcvd_pkts" \
        "$RDMA_TEST_NETDEV.tx_packets" "$RDMA_TEST_NETDEV.rx_packets"; do
        d=$(grew before after "$c")
        if [ "$d" = missing ] || [ "$d" -lt "$n" ]; then
            fail "$c grew by $d, less than the $n messages each way"
        else
            echo "  $c +$d"
        fi
    done
    # Every RoCE packet of rxeA leaves and enters through its veth end (which also carries
    # the TCP exchange of endpoints).
    for dir in sent_pkts:tx_packets rcvd_pkts:rx_packets; do
        r=$(grew before after "$A.${dir%%:*}")
        v=$(grew before after "$RDMA_TEST_NETDEV.${dir#*:}")
        if [ "$r" != missing ] && [ "$v" != missing ] && [ "$v" -ge "$r" ]; then
            ok "$RDMA_TEST_NETDEV.${dir#*:} +$v covers $A.${dir%%:*} +$r: the traffic crossed the link"
        else
            fail "$RDMA_TEST_NETDEV.${dir#*:} grew by $v, less than $A.${dir%%:*} ($r)"
        fi
    done
else
    fail "ibv_rc_pingpong across the link"
fi

echo "the other way: server here, client on $RDMA_TEST_PEER_NETNS"
port=$((port + 1))
snap before
server_on=("${SERVER_ON[@]}")
SERVER_ON=() # run_pair's server, and its readiness probe, here
rc=0
run_pair "wait_tcp_listen $port 30" \
    ibv_rc_pingpong -d "$A" -g "$RDMA_TEST_GID_INDEX" -n 100 -p "$port" -- \
    scripts/on-peer-host ibv_rc_pingpong -d "$B" -g "$RDMA_TEST_PEER_GID_INDEX" -n 100 \
    -p "$port" "$RDMA_TEST_IP" || rc=$?
SERVER_ON=("${server_on[@]}")
if [ "$rc" -eq 0 ]; then
    snap after
    d=$(grew before after "$B.sent_pkts")
    if [ "$d" != missing ] && [ "$d" -ge 100 ]; then ok "$B.sent_pkts +$d"; else
        fail "$B.sent_pkts grew by $d, wanted at least 100"; fi
else
    fail "ibv_rc_pingpong with the client on $RDMA_TEST_PEER_NETNS"
fi

# No ping-pong under loss or corruption (which drops what it hits) here: its protocol has no
# closing handshake, so a dropped ACK of the last message fails it whatever the stack (its
# sender resends to a peer that has exited). faults-lossy-link.sh shows rxe recovering what netem drops, with stride-perf and
# ib_write_bw, which end with a handshake, and their data checked byte for byte.

echo "5 ms delay each way: every round trip takes at least 10 ms"
scripts/link fault delay 5ms || fail "scripts/link fault delay 5ms"
if pingpong 20; then
    for side in server client; do
        us=$(sed -nE 's/^20 iters in [0-9.]+ seconds = ([0-9.]+) usec\/iter$/\1/p' "$PAIR_DIR/$side.log")
        if [ -n "$us" ] && awk -v u="$us" 'BEGIN { exit !(u >= 10000) }'; then
            ok "$side: $us usec/iter"
        else
            fail "$side: '${us:-no}' usec/iter, wanted at least 10000 with 5 ms each way"
        fi
    done
else
    fail "ibv_rc_pingpong with 5 ms delay"
fi

# Faults that drop nothing (corruption drops what it hits: see above).
for fault in "delay 2ms 1ms reorder 25%" "duplicate 5%"; do
    echo "$fault both ways: the ping-pong completes"
    # shellcheck disable=SC2086 # the fault is netem's words
    scripts/link fault $fault || fail "scripts/link fault $fault"
    if pingpong 30; then ok "30 iterations under $fault"; else fail "ibv_rc_pingpong under $fault"; fi
done
scripts/link clear || fail "scripts/link clear"

echo "link down: a ping-pong fails, quickly"
port=$((port + 1))
timeout -k 5 60 scripts/on-peer-host ibv_rc_pingpong -d "$B" -g "$RDMA_TEST_PEER_GID_INDEX" \
    -p "$port" >"$work/server" 2>&1 &
server_pid=$!
wait_tcp_listen "$port" 30 || fail "the server did not listen"
scripts/link down || fail "scripts/link down"
t0=$SECONDS
rc=0
timeout -k 5 30 ibv_rc_pingpong -d "$A" -g "$RDMA_TEST_GID_INDEX" -p "$port" \
    "$RDMA_TEST_PEER_IP" >"$work/client" 2>&1 || rc=$?
kill "$server_pid" 2>/dev/null
wait "$server_pid" 2>/dev/null
show_log client "$work/client"
if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; then
    ok "ibv_rc_pingpong exited $rc after $((SECONDS - t0)) s"
else
    fail "ibv_rc_pingpong with the link down exited $rc (124: it hung for 30 s)"
fi
scripts/link up || fail "scripts/link up"

echo "link down in the middle of a run: our rc_pingpong gives up within its stall timeout"
port=$((port + 1))
timeout -k 5 90 scripts/on-peer-host ibv_rc_pingpong -d "$B" -g "$RDMA_TEST_PEER_GID_INDEX" \
    -n 1000000 -p "$port" >"$work/server" 2>&1 &
server_pid=$!
wait_tcp_listen "$port" 30 || fail "the server did not listen"
snap before
timeout -k 5 60 "$ours" -d "$A" -g "$RDMA_TEST_GID_INDEX" -n 1000000 --stall-timeout 5 \
    -p "$port" "$RDMA_TEST_PEER_IP" >"$work/client" 2>&1 &
client_pid=$!
# Until the ping-pong runs (at most 30 s), then cut it.
deadline=$((SECONDS + 30))
while snap during && [ "$(grew before during "$A.sent_pkts")" -lt 100 ] && [ "$SECONDS" -lt "$deadline" ]; do
    sleep 0.2
done
echo "  $A.sent_pkts +$(grew before during "$A.sent_pkts") before the cut"
scripts/link down || fail "scripts/link down"
t0=$SECONDS
rc=0
wait "$client_pid" || rc=$?
kill "$server_pid" 2>/dev/null
wait "$server_pid" 2>/dev/null
show_log server "$work/server"
show_log client "$work/client"
if [ "$rc" -eq 1 ] && [ $((SECONDS - t0)) -le 20 ] && ! grep -q panicked "$work/client"; then
    ok "rc_pingpong exited 1 after $((SECONDS - t0)) s: $(grep -m1 'rc_pingpong' "$work/client")"
else
    fail "rc_pingpong exited $rc after $((SECONDS - t0)) s; wanted 1 (a clear error) within 20 s"
fi
scripts/link up || fail "scripts/link up"

echo "link up again: the ping-pong works again"
if pingpong 50; then ok "50 iterations after the link came back"; else fail "ibv_rc_pingpong after link up"; fi

if [ "$failures" -ne 0 ]; then
    echo "two-hosts: FAILED: $failures check(s)" >&2
    exit 1
fi
echo "two-hosts: all passed"
