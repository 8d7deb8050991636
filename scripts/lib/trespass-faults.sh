#!/usr/bin/env bash
# trespass across a faulty link (two hosts, netem through scripts/link): for each fault a
# stream of TRESPASS_FAULT_BYTES (1 MiB) from here to a server on the peer host arrives byte
# for byte (checksum), within a time limit; the table at the end gives each fault's time.
# Under jitter (every packet delayed 10 +- 5 ms on its own, so most arrive out of order)
# SoftRoCE's go-back-N retransmission exhausts the transport's retries on writes of many
# packets (perftest's `ib_write_bw -R -s 65536` hangs there, 4 KiB writes crawl through); for
# that row the check is that the data arrives intact OR both sides end with a typed error
# within the limit: never a hang, never wrong data. Keep-alive is 10 s in these rows: at 5%
# loss or 25% reordering SoftRoCE moves some 30 KB/s, and a probe's answer waits behind the
# writes in the answering side's send queue (up to its 256 KiB send buffer), so a period
# of 2 s declared a live peer dead (docs/trespass-protocol.md, keep-alive).
# Then the link goes down under an idle connection with keep-alive 1 s: both sides' blocked
# reads end with a typed error (keep-alive, unreachable or reset) within 10 s, while the link
# is still down.
# e2e-hosts: 2
set -uo pipefail
cd "$(dirname "$0")/../.."
if [ "${RDMA_TEST_HOSTS:-1}" != 2 ]; then
    echo "skipped: link faults need two hosts ('scripts/softroce run --hosts 2')"
    exit 0
fi
# shellcheck source=trespass.sh
. scripts/lib/trespass.sh
bytes=${TRESPASS_FAULT_BYTES:-1048576}
limit=${TRESPASS_FAULT_TIMEOUT:-120}
keepalive=${TRESPASS_FAULT_KEEPALIVE:-10}
work=$(mktemp -d)
status=0
trap 'kill -9 $(jobs -p) 2>/dev/null; scripts/link up >/dev/null 2>&1; scripts/link clear >/dev/null 2>&1; rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; status=1; }
rows=()
port=7710

# under [--may-fail] NAME NETEM-ARGS...: the stream with the link faulted so (no ARGS: a
# clean link). With --may-fail, both sides ending with a typed error also passes.
under() {
    local may_fail=0
    if [ "$1" = --may-fail ]; then
        may_fail=1
        shift
    fi
    local name=$1
    shift
    port=$((port + 1))
    scripts/link clear >/dev/null 2>&1
    if [ $# -gt 0 ] && ! scripts/link fault "$@" >/dev/null; then
        fail "$name: could not set netem $*"
        return
    fi
    timeout -k 5 "$limit" "${SERVER_ON[@]}" "$bin" serve "$SERVER_IP:$port" --keepalive "$keepalive" \
        >"$work/s$port.log" 2>&1 &
    local srv=$!
    wait_cm_listen "$port" 30 || { fail "$name: the server never listened"; return; }
    local t0=$SECONDS verdict=ok crc=0 src=0
    timeout -k 5 "$limit" "$bin" send "$SERVER_IP:$port" "$bytes" --keepalive "$keepalive" \
        >"$work/c$port.log" 2>&1 || crc=$?
    wait "$srv" 2>/dev/null || src=$?
    if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ]; then
        # Typed errors: the client says what broke (exit 1, not a mismatch), the server's read
        # failed (exit 3); a timeout (124) is a hang, a mismatch is lost data.
        if [ "$may_fail" = 1 ] && [ "$crc" = 1 ] && [ "$src" = 3 ] &&
            ! grep -q MISMATCH "$work/c$port.log"; then
            verdict="typed errors: $(tail -n1 "$work/c$port.log" | cut -c1-60)..."
        else
            verdict=FAILED
            fail "$name: the stream did not arrive intact within $limit s (client $crc, server $src)"
            cat "$work/c$port.log" "$work/s$port.log"
        fi
    fi
    rows+=("$(printf '%-28s %-22s %5d s  %s' "$name" "${*:-none}" $((SECONDS - t0)) "$verdict")")
    echo "  $name: $verdict ($((SECONDS - t0)) s)"
}

echo "1. $bytes bytes under each fault"
under "clean link"
under "loss 1%" loss 1%
under "loss 5%" loss 5%
under --may-fail "delay 10 ms, jitter 5 ms" delay 10ms 5ms
under "reordering" delay 5ms reorder 25% 50%
under "duplication 1%" duplicate 1%
scripts/link clear >/dev/null 2>&1

echo "2. the link goes down under an idle connection (keep-alive 1 s)"
port=$((port + 1))
timeout -k 5 60 "${SERVER_ON[@]}" "$bin" serve "$SERVER_IP:$port" --keepalive 1 >"$work/down-s.log" 2>&1 &
srv=$!
wait_cm_listen "$port" 30 || fail "the server never listened"
# The client here waits in a read too: `serve` on this host would need a listener, so the
# idle client's own failure is seen through its exit (it exits 1 with the error).
timeout -k 5 60 "$bin" idle "$SERVER_IP:$port" --keepalive 1 >"$work/down-c.log" 2>&1 &
cli=$!
# Connected once the server says so (at most 5 s), then a moment for its read to begin.
waited=0
while ! grep -q '^connection from' "$work/down-s.log" 2>/dev/null && [ "$waited" -lt 50 ]; do
    sleep 0.1
    waited=$((waited + 1))
done
sleep 0.3
scripts/link down >/dev/null || fail "scripts/link down failed"
t0=$SECONDS
while kill -0 "$srv" 2>/dev/null && [ $((SECONDS - t0)) -lt 10 ]; do sleep 0.2; done
if kill -0 "$srv" 2>/dev/null; then
    fail "the server's read did not end within 10 s of the link going down"
    cat "$work/down-s.log"
elif grep -Eq "read failed .*(keep-alive|unreachable|reset)" "$work/down-s.log"; then
    echo "  ok: server: $(grep 'read failed' "$work/down-s.log") ($((SECONDS - t0)) s after the link went down)"
else
    fail "the server ended without the expected error"
    cat "$work/down-s.log"
fi
scripts/link up >/dev/null 2>&1
# $cli is timeout(1): the idle client under it goes first.
pkill -9 -P "$cli" 2>/dev/null
kill -9 "$cli" 2>/dev/null
wait "$cli" "$srv" 2>/dev/null
# The server's disconnect went out while the link was down, which leaves SoftRoCE's QP1 in
# the error state and every later rdma_cm connection timing out: re-create the device then.
scripts/link heal || fail "scripts/link heal failed"

printf '\n%-28s %-22s %7s  %s\n' fault netem time verdict
printf '%s\n' "${rows[@]}"
exit "$status"
