#!/usr/bin/env bash
# trespass streams end to end (trespass/examples/stream_check.rs): TRESPASS_CHECK_BYTES (1 GiB
# on one device, 64 MiB across two hosts) streamed through a reader that sleeps at random,
# checked byte for byte by checksum; a peer killed with SIGKILL, and one stopped with SIGSTOP
# past its keep-alive period, each noticed by the survivor's blocked read within a stated
# bound; the same (64 MiB) with the server on trespass::tokio; a connection over IPv6. Runs
# where scripts/softroce runs commands; every program runs under a time limit.
#
# Under `scripts/softroce run --hosts 2` the servers run on the peer host, on its address,
# and the clients here, across the link, and then the link's faults run
# (scripts/lib/trespass-faults.sh: loss, jitter, reordering, duplication, the link down).
#
# TRESPASS_BIN: where cargo put trespass's example binaries (scripts/lib/trespass.sh).
# e2e-hosts: 1 2
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}"
# shellcheck source=../lib/trespass.sh
. scripts/lib/trespass.sh
if [ "${RDMA_TEST_HOSTS:-1}" = 2 ]; then
    bytes=${TRESPASS_CHECK_BYTES:-67108864}
else
    bytes=${TRESPASS_CHECK_BYTES:-1073741824}
fi
echo "stream_check: $bin; server at $SERVER_IP"
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

# serve PORT ARGS...: a stream_check server on the server's host, in the background (SRV),
# once its rdma_cm id listens.
serve() {
    local port=$1
    shift
    timeout -k 5 900 "${SERVER_ON[@]}" "$bin" serve "$SERVER_IP:$port" "$@" >"$work/s$port.log" 2>&1 &
    SRV=$!
    wait_cm_listen "$port" 30 || fail "the server on port $port never listened"
}

echo "0. the README's Getting Started: echo_server and echo_client"
timeout -k 5 120 "${SERVER_ON[@]}" "$dir/echo_server" "$SERVER_IP:7699" >"$work/echo-s.log" 2>&1 &
SRV=$!
wait_cm_listen 7699 30 || fail "echo_server never listened"
for msg in "hello over RDMA" "$(head -c 3000 /dev/zero | tr '\0' x)"; do
    if out=$(timeout -k 5 60 "$dir/echo_client" "$SERVER_IP:7699" "$msg" 2>&1) && [ "$out" = "$msg" ]; then
        echo "  ok: echo_client got its ${#msg} bytes back"
    else
        fail "echo_client: $out"
    fi
done
kill "$SRV" 2>/dev/null
wait "$SRV" 2>/dev/null
grep -q "echoed 15 bytes" "$work/echo-s.log" || fail "echo_server did not report its echo: $(cat "$work/echo-s.log")"

echo "0b. the same on tokio (tokio_echo_server, tokio_echo_client), and each side against the other kind"
timeout -k 5 120 "${SERVER_ON[@]}" "$dir/tokio_echo_server" "$SERVER_IP:7698" >"$work/techo-s.log" 2>&1 &
SRV=$!
wait_cm_listen 7698 30 || fail "tokio_echo_server never listened"
for client in tokio_echo_client echo_client; do
    msg="hello from $client $(head -c 5000 /dev/zero | tr '\0' y)"
    if out=$(timeout -k 5 60 "$dir/$client" "$SERVER_IP:7698" "$msg" 2>&1) && [ "$out" = "$msg" ]; then
        echo "  ok: $client got its ${#msg} bytes back from tokio_echo_server"
    else
        fail "$client against tokio_echo_server: $out"
    fi
done
kill "$SRV" 2>/dev/null
wait "$SRV" 2>/dev/null
[ "$(grep -c "echoed 5029 bytes\|echoed 5023 bytes" "$work/techo-s.log")" = 2 ] ||
    fail "tokio_echo_server did not report both echoes: $(cat "$work/techo-s.log")"
timeout -k 5 120 "${SERVER_ON[@]}" "$dir/echo_server" "$SERVER_IP:7697" >"$work/echo-s2.log" 2>&1 &
SRV=$!
wait_cm_listen 7697 30 || fail "echo_server never listened"
if out=$(timeout -k 5 60 "$dir/tokio_echo_client" "$SERVER_IP:7697" "to a thread" 2>&1) && [ "$out" = "to a thread" ]; then
    echo "  ok: tokio_echo_client got its bytes back from echo_server"
else
    fail "tokio_echo_client against echo_server: $out"
fi
kill "$SRV" 2>/dev/null
wait "$SRV" 2>/dev/null

echo "1. $bytes bytes through a reader that sleeps at random"
serve 7700 --sleepy
t0=$SECONDS
if timeout -k 5 900 "$bin" send "$SERVER_IP:7700" "$bytes" >"$work/send.log" 2>&1; then
    echo "  ok: $(tail -n1 "$work/send.log") ($((SECONDS - t0)) s)"
else
    fail "the stream check failed"
    cat "$work/send.log"
fi
wait_exit "$SRV" 30 || fail "the server did not finish cleanly"
grep received "$work/s7700.log" | sed 's/^/  server: /'

echo "1b. 67108864 bytes through a tokio reader that sleeps at random (serve --tokio)"
serve 7706 --sleepy --tokio
if timeout -k 5 300 "$bin" send "$SERVER_IP:7706" 67108864 >"$work/send-t.log" 2>&1; then
    echo "  ok: $(tail -n1 "$work/send-t.log")"
else
    fail "the stream check against the tokio server failed"
    cat "$work/send-t.log"
fi
wait_exit "$SRV" 30 || fail "the tokio server did not finish cleanly"
grep received "$work/s7706.log" | sed 's/^/  server: /'

# peer_dies SIGNAL PORT LIMIT PATTERN [SERVE ARGS...]: a server blocked in read, its idle
# client (here) sent SIGNAL; the server's read must fail within LIMIT seconds with a message
# matching PATTERN.
peer_dies() {
    local sig=$1 port=$2 limit=$3 pattern=$4 rc=0
    shift 4
    serve "$port" --keepalive 1 "$@"
    # Not under timeout: the signal must reach the program itself (the trap and the kill
    # below end it).
    "$bin" idle "$SERVER_IP:$port" --keepalive 1 >"$work/c$port.log" 2>&1 &
    local cli=$! waited=0
    # Connected once the server says so (at most 5 s), then a moment for its read to begin.
    while ! grep -q '^connection from' "$work/s$port.log" 2>/dev/null && [ "$waited" -lt 50 ]; do
        sleep 0.1
        waited=$((waited + 1))
    done
    sleep 0.3
    local t0=$SECONDS
    kill "-$sig" "$cli"
    wait_exit "$SRV" "$limit" || rc=$?
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
echo "3b. the same two with the server's read parked in tokio's reactor (serve --tokio)"
peer_dies KILL 7707 10 "reset|disconnected" --tokio
peer_dies STOP 7708 10 "keep-alive" --tokio

if [ "${RDMA_TEST_HOSTS:-1}" = 1 ]; then
    # 2001:2::/48 is IPv6's benchmarking range (RFC 5180); it exists only in this guest.
    echo "4. a stream over IPv6 (2001:2::1 on ${RDMA_TEST_NETDEV:-dummy0})"
    netdev=${RDMA_TEST_NETDEV:-dummy0}
    if ip -6 addr add 2001:2::1/64 dev "$netdev" nodad 2>"$work/ip6.err"; then
        sleep 1
        timeout -k 5 120 "$bin" serve "[2001:2::1]:7703" >"$work/s6.log" 2>&1 &
        SRV=$!
        sleep 1
        if timeout -k 5 120 "$bin" send "[2001:2::1]:7703" 1048576 >"$work/c6.log" 2>&1; then
            echo "  ok: $(tail -n1 "$work/c6.log")"
        else
            fail "the IPv6 stream failed"
            cat "$work/c6.log" "$work/s6.log"
        fi
        wait_exit "$SRV" 30 || fail "the IPv6 server did not finish cleanly"
        ip -6 addr del 2001:2::1/64 dev "$netdev" 2>/dev/null
    else
        fail "could not add an IPv6 address to $netdev: $(cat "$work/ip6.err")"
    fi
fi
if [ "${RDMA_TEST_HOSTS:-1}" = 2 ]; then
    echo "5. the link's faults (scripts/lib/trespass-faults.sh)"
    TRESPASS_BIN=$dir bash scripts/lib/trespass-faults.sh || fail "the link fault checks failed"
fi
exit "$status"
