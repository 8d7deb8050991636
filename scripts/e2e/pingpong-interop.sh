#!/usr/bin/env bash
# ud_pingpong, uc_pingpong and srq_pingpong against rdma-core's ibv_ud_pingpong,
# ibv_uc_pingpong and ibv_srq_pingpong, both directions, polling and sleeping on completion
# events (-e); rc_pingpong -e against ibv_rc_pingpong -e both directions; and each of ours
# against itself with the extended API (-N -e). 1000 iterations on the test GID. Then -c
# (validate the received buffer) on UC, UD and SRQ both ways, and srq_pingpong -o (on-demand
# paging): a pair each way where the device has it, else both programs end alike.
# xsrq_pingpong against ibv_xsrq_pingpong: on a device without XRC (rxe) both end at once, and
# ours must end as rdma-core's does, with the same output ("Couldn't Open the XRC Domain 95")
# and exit status; on a device with XRC both wait for a client, and the pair runs both ways.
# Runs where scripts/softroce runs commands; binaries from ${EXAMPLES_BIN:-target/debug}.
# Under `scripts/softroce run --hosts 2` every server runs on the peer host and every client
# here, so each program runs on both hosts, across the link.
# e2e-hosts: 1 2
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/peers.sh
. scripts/lib/odp-features.sh

dev=${RDMA_TEST_DEVICE:?RDMA_TEST_DEVICE is not set; run this through scripts/softroce run}
gid=${RDMA_TEST_GID_INDEX:-1}
bin=${EXAMPLES_BIN:-target/debug}
for p in rc ud uc srq; do
    [ -x "$bin/${p}_pingpong" ] || { echo "FAILED: $bin/${p}_pingpong is missing (cargo build -p sideway-examples)" >&2; exit 1; }
done
port=18700
iters=1000
passed=0

# pair NAME BYTES QPS SERVER_CMD... -- CLIENT_CMD...: runs the pair and checks both logs:
# the iteration count, BYTES transferred, and QPS remote endpoints.
pair() {
    local name=$1 bytes=$2 qps=$3
    shift 3
    port=$((port + 1))
    echo "$name (port $port)"
    local server=() client=()
    while [ "$1" != -- ]; do server+=("$1"); shift; done
    shift
    client=("$@")
    run_pair "wait_tcp_listen $port 30" "${server[@]}" -p "$port" -- \
        "${client[@]}" -p "$port" "$SERVER_ADDR"
    for side in server client; do
        expect_in "$PAIR_DIR/$side.log" "^$iters iters in [0-9.]+ seconds = [0-9.]+ usec/iter$" \
            "$iters iterations on the $side"
        expect_in "$PAIR_DIR/$side.log" "^$bytes bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$" \
            "the byte count on the $side"
        local n
        n=$(grep -cE 'remote address: +LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}[,:] GID ::ffff:' "$PAIR_DIR/$side.log" || true)
        [ "$n" -eq "$qps" ] || { echo "  FAIL: $n remote endpoints on the $side, expected $qps" >&2; return 1; }
    done
    if grep -l panicked "$PAIR_DIR"/*.log 2>/dev/null; then echo "FAILED: a panic" >&2; exit 1; fi
    passed=$((passed + 1))
}

common=(-d "$dev" -g "$gid" -n "$iters")
# The server's side of a pair: the same device here, the peer's on two hosts.
srv=(-d "$SERVER_DEVICE" -g "$SERVER_GID_INDEX" -n "$iters")
for p in ud uc srq; do
    ours=$bin/${p}_pingpong
    theirs=ibv_${p}_pingpong
    case $p in
        ud) bytes=$((1024 * iters * 2)) qps=1 ;; # the default 2048 shrinks to the MTU, 1024 on rxe
        srq) bytes=$((4096 * iters * 2)) qps=16 ;;
        *) bytes=$((4096 * iters * 2)) qps=1 ;;
    esac
    pair "$p: ours (client) with $theirs (server)" "$bytes" "$qps" \
        "$theirs" "${srv[@]}" -- "$ours" "${common[@]}"
    pair "$p: $theirs (client) with ours (server)" "$bytes" "$qps" \
        "$ours" "${srv[@]}" -- "$theirs" "${common[@]}"
    pair "$p: ours -e (client) with $theirs -e (server)" "$bytes" "$qps" \
        "$theirs" "${srv[@]}" -e -- "$ours" "${common[@]}" -e
    pair "$p: $theirs -e (client) with ours -e (server)" "$bytes" "$qps" \
        "$ours" "${srv[@]}" -e -- "$theirs" "${common[@]}" -e
    pair "$p: ours -N -e with ours -N" "$bytes" "$qps" \
        "$ours" "${srv[@]}" -N -e -- "$ours" "${common[@]}" -N
done
# -c on UC (rc_pingpong's is checked in rc-pingpong-interop.sh): stamps found both ways,
# and a client without -c leaves the server to report page 0.
uc_bytes=$((4096 * iters * 2))
pair "uc: ours -c (client) with ibv_uc_pingpong -c (server)" "$uc_bytes" 1 \
    ibv_uc_pingpong "${srv[@]}" -c -- "$bin/uc_pingpong" "${common[@]}" -c
expect_not_in "$PAIR_DIR/server.log" 'invalid data' "ibv_uc_pingpong -c finds our stamps"
pair "uc: ibv_uc_pingpong -c (client) with ours -c (server)" "$uc_bytes" 1 \
    "$bin/uc_pingpong" "${srv[@]}" -c -- ibv_uc_pingpong "${common[@]}" -c
expect_not_in "$PAIR_DIR/server.log" 'invalid data' "we find ibv_uc_pingpong's stamps"
pair "uc: ibv_uc_pingpong without -c (client) with ours -c (server)" "$uc_bytes" 1 \
    "$bin/uc_pingpong" "${srv[@]}" -c -- ibv_uc_pingpong "${common[@]}"
expect_in "$PAIR_DIR/server.log" '^invalid data in page 0$' "our report of the missing stamp"
echo "  ok: -c on UC: stamps found both ways, a missing one reported"
# -c on UD (the stamps sit after the 40 bytes of GRH room) and SRQ, 200 iterations each.
short=(-d "$dev" -g "$gid" -n 200)
short_srv=(-d "$SERVER_DEVICE" -g "$SERVER_GID_INDEX" -n 200)
iters=200
for p in ud srq; do
    case $p in
        ud) bytes=$((1024 * iters * 2)) qps=1 ;;
        srq) bytes=$((4096 * iters * 2)) qps=16 ;;
    esac
    ours=$bin/${p}_pingpong
    theirs=ibv_${p}_pingpong
    pair "$p: ours -c (client) with $theirs -c (server)" "$bytes" "$qps" \
        "$theirs" "${short_srv[@]}" -c -- "$ours" "${short[@]}" -c
    expect_not_in "$PAIR_DIR/server.log" 'invalid data' "$theirs -c finds our stamps"
    pair "$p: $theirs -c (client) with ours -c (server)" "$bytes" "$qps" \
        "$ours" "${short_srv[@]}" -c -- "$theirs" "${short[@]}" -c
    expect_not_in "$PAIR_DIR/server.log" 'invalid data' "we find $theirs's stamps"
    if [ "$p" = srq ]; then
        # ibv_srq_pingpong's buffer starts zeroed, and zero is the stamp: a client without -c
        # leaves nothing to report, in rdma-core's server as in ours.
        pair "$p: ours without -c (client) with $theirs -c (server)" "$bytes" "$qps" \
            "$theirs" "${short_srv[@]}" -c -- "$ours" "${short[@]}"
        expect_not_in "$PAIR_DIR/server.log" 'invalid data' "a zeroed buffer, as $theirs's"
        echo "  ok: -c on $p: stamps found both ways; our buffer starts zeroed as $theirs's"
    else
        pair "$p: $theirs without -c (client) with ours -c (server)" "$bytes" "$qps" \
            "$ours" "${short_srv[@]}" -c -- "$theirs" "${short[@]}"
        expect_in "$PAIR_DIR/server.log" '^invalid data in page 0$' "our report of the missing stamp"
        echo "  ok: -c on $p: stamps found both ways, a missing one reported"
    fi
done
# srq_pingpong -o.
device_features "$dev"
if [ "$HAS_ODP_SRQ" = 1 ]; then
    bytes=$((4096 * iters * 2))
    pair "srq: ours -o (client) with ibv_srq_pingpong -o (server)" "$bytes" 16 \
        ibv_srq_pingpong "${short_srv[@]}" -o -- "$bin/srq_pingpong" "${short[@]}" -o
    pair "srq: ibv_srq_pingpong -o (client) with ours -o (server)" "$bytes" 16 \
        "$bin/srq_pingpong" "${short_srv[@]}" -o -- ibv_srq_pingpong "${short[@]}" -o
else
    echo "srq: -o on a device without ODP for SRQ"
    alone=(-d "$dev" -g "$gid" -p 18798 -o)
    same_end "The device isn't ODP capable or does not support RC send, receive and srq with ODP" \
        "$bin/srq_pingpong" "${alone[@]}" -- ibv_srq_pingpong "${alone[@]}"
fi
iters=1000
pair "rc: ours -e (client) with ibv_rc_pingpong -e (server)" 8192000 1 \
    ibv_rc_pingpong "${srv[@]}" -e -- "$bin/rc_pingpong" "${common[@]}" -e
pair "rc: ibv_rc_pingpong -e (client) with ours -e (server)" 8192000 1 \
    "$bin/rc_pingpong" "${srv[@]}" -e -- ibv_rc_pingpong "${common[@]}" -e

echo "xsrq_pingpong against ibv_xsrq_pingpong"
[ -x "$bin/xsrq_pingpong" ] || { echo "FAILED: $bin/xsrq_pingpong is missing (cargo build -p sideway-examples)" >&2; exit 1; }
xsrq_logs=$(mktemp -d)
rc_ours=0 rc_theirs=0
port=$((port + 1))
timeout 10 "$bin/xsrq_pingpong" -d "$dev" -g "$gid" -p "$port" >"$xsrq_logs/ours" 2>&1 || rc_ours=$?
port=$((port + 1))
timeout 10 ibv_xsrq_pingpong -d "$dev" -g "$gid" -p "$port" >"$xsrq_logs/theirs" 2>&1 || rc_theirs=$?
sed 's/^/  [ours] /' "$xsrq_logs/ours"
sed 's/^/  [ibv_xsrq_pingpong] /' "$xsrq_logs/theirs"
if [ "$rc_theirs" -eq 124 ]; then
    # rdma-core's server waited for a client: the device has XRC.
    [ "$rc_ours" -eq 124 ] || { echo "FAILED: ibv_xsrq_pingpong waits for a client, ours exited $rc_ours" >&2; exit 1; }
    for way in ours theirs; do
        port=$((port + 1))
        if [ "$way" = ours ]; then s=ibv_xsrq_pingpong c=$bin/xsrq_pingpong; else s=$bin/xsrq_pingpong c=ibv_xsrq_pingpong; fi
        echo "xsrq: $c (client) with $s (server) (port $port)"
        run_pair "wait_tcp_listen $port 30" "$s" -d "$SERVER_DEVICE" -g "$SERVER_GID_INDEX" -p "$port" -- \
            "$c" -d "$dev" -g "$gid" -p "$port" "$SERVER_ADDR"
        for side in server client; do
            expect_in "$PAIR_DIR/$side.log" '^success$' "success on the $side"
            expect_in "$PAIR_DIR/$side.log" '^  remote: LID [0-9a-f]{4}, QPN RECV [0-9a-f]{6} SEND [0-9a-f]{6}, PSN [0-9a-f]{6}, SRQN [0-9a-f]{6}, GID ' \
                "the peer's endpoint on the $side"
        done
        passed=$((passed + 1))
    done
else
    [ "$rc_ours" -eq "$rc_theirs" ] || { echo "FAILED: ibv_xsrq_pingpong exited $rc_theirs, ours $rc_ours" >&2; exit 1; }
    diff "$xsrq_logs/theirs" "$xsrq_logs/ours" || { echo "FAILED: xsrq_pingpong's output differs from ibv_xsrq_pingpong's (above)" >&2; exit 1; }
    echo "  ok: $dev has no XRC; ours ends as ibv_xsrq_pingpong does (exit $rc_ours): $(head -n 1 "$xsrq_logs/ours")"
    passed=$((passed + 1))
fi
rm -rf "$xsrq_logs"

echo "bad input"
out=$("$bin/srq_pingpong" -d "$dev" -g "$gid" -q 8 -r 4 2>&1) && { echo "FAILED: -q 8 -r 4, yet exit 0" >&2; exit 1; }
grep -q "too small for 8 QPs" <<<"$out" || { echo "FAILED: rx-depth message: $out" >&2; exit 1; }
echo "  ok: $out"
out=$("$bin/ud_pingpong" -d "$dev" -g "$gid" -s 1000000 2>&1) && { echo "FAILED: -s 1000000, yet exit 0" >&2; exit 1; }
grep -q "larger than the port's MTU" <<<"$out" || { echo "FAILED: UD size message: $out" >&2; exit 1; }
echo "  ok: $out"
out=$("$bin/uc_pingpong" -d "$dev" -g "$gid" -e -p 18799 127.0.0.1 2>&1) && { echo "FAILED: no server, yet exit 0" >&2; exit 1; }
grep -q "is the server running" <<<"$out" || { echo "FAILED: no-server message: $out" >&2; exit 1; }
echo "  ok: $out"
echo "pingpong-interop: all $passed pairs passed"
