#!/usr/bin/env bash
# rc_pingpong against rdma-core's ibv_rc_pingpong, both directions, and against itself (also
# with the extended work-request API): 1000 iterations on the test GID. Then on-demand paging
# (-o, -O, -P) and completion timestamps (-t): a pair each way where the device has the
# feature (rdma-core's ibv_devinfo -v says), else both programs must end alike with
# rdma-core's message (rxe on Linux 6.12 has neither). -j (device memory): on a device
# without it (rxe) both programs refuse alike; on one with it, both directions.
# Runs where scripts/softroce runs commands; binaries from ${EXAMPLES_BIN:-target/debug}.
# Under `scripts/softroce run --hosts 2` every server runs on the peer host and every client
# here, across the link.
# e2e-hosts: 1 2
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/peers.sh
. scripts/lib/odp-features.sh

dev=${RDMA_TEST_DEVICE:?RDMA_TEST_DEVICE is not set; run this through scripts/softroce run}
gid=${RDMA_TEST_GID_INDEX:-1}
ours=${EXAMPLES_BIN:-target/debug}/rc_pingpong
[ -x "$ours" ] || { echo "FAILED: $ours is missing (cargo build -p sideway-examples)" >&2; exit 1; }
port=18600

pair() {
    local name=$1
    shift
    port=$((port + 1))
    echo "$name (port $port)"
    local server=() client=()
    while [ "$1" != -- ]; do server+=("$1"); shift; done
    shift
    client=("$@")
    run_pair "wait_tcp_listen $port 30" "${server[@]}" -p "$port" -- \
        "${client[@]}" -p "$port" "$SERVER_ADDR"
    for side in server client; do
        expect_in "$PAIR_DIR/$side.log" '^1000 iters in [0-9.]+ seconds = [0-9.]+ usec/iter$' \
            "1000 iterations on the $side"
        expect_in "$PAIR_DIR/$side.log" '^8192000 bytes in [0-9.]+ seconds = [0-9.]+ Mbit/sec$' \
            "the byte count on the $side"
        expect_in "$PAIR_DIR/$side.log" 'remote address: LID 0x[0-9a-f]{4}, QPN 0x[0-9a-f]{6}, PSN 0x[0-9a-f]{6}, GID ::ffff:' \
            "the peer's endpoint on the $side"
    done
}

common=(-d "$dev" -g "$gid" -n 1000)
# The server's side of a pair: the same device here, the peer's on two hosts.
srv=(-d "$SERVER_DEVICE" -g "$SERVER_GID_INDEX" -n 1000)
pair "ours (client) with ibv_rc_pingpong (server)" \
    ibv_rc_pingpong "${srv[@]}" -- "$ours" "${common[@]}"
pair "ibv_rc_pingpong (client) with ours (server)" \
    "$ours" "${srv[@]}" -- ibv_rc_pingpong "${common[@]}"
pair "ours with ours, extended API (-N)" \
    "$ours" "${srv[@]}" -N -- "$ours" "${common[@]}" -N
pair "ibv_rc_pingpong -N (client) with ours -N (server)" \
    "$ours" "${srv[@]}" -N -- ibv_rc_pingpong "${common[@]}" -N

# -c: the client stamps the first byte of every page, the server checks the stamps after the
# run and prints "invalid data in page N" for each missing one. The pairs without -c on the
# client show that each server's check really fails when the stamps are not there.
no_invalid() {
    expect_not_in "$1" 'invalid data in page' "$2"
    echo "  ok: $2"
}
pair "ours -c (client) with ibv_rc_pingpong -c (server)" \
    ibv_rc_pingpong "${srv[@]}" -c -- "$ours" "${common[@]}" -c
no_invalid "$PAIR_DIR/server.log" "ibv_rc_pingpong finds our stamps"
pair "ibv_rc_pingpong -c (client) with ours -c (server)" \
    "$ours" "${srv[@]}" -c -- ibv_rc_pingpong "${common[@]}" -c
no_invalid "$PAIR_DIR/server.log" "we find ibv_rc_pingpong's stamps"
pair "ours without -c (client) with ibv_rc_pingpong -c (server)" \
    ibv_rc_pingpong "${srv[@]}" -c -- "$ours" "${common[@]}"
expect_in "$PAIR_DIR/server.log" '^invalid data in page 0$' \
    "ibv_rc_pingpong reports the missing stamp"
echo "  ok: ibv_rc_pingpong reports our missing stamp"
pair "ibv_rc_pingpong without -c (client) with ours -c (server)" \
    "$ours" "${srv[@]}" -c -- ibv_rc_pingpong "${common[@]}"
expect_in "$PAIR_DIR/server.log" '^invalid data in page 0$' "we report the missing stamp"
echo "  ok: we report ibv_rc_pingpong's missing stamp"

# On-demand paging and completion timestamps.
device_features "$dev"
alone=(-d "$dev" -g "$gid" -p 18698)
rc_odp_msg="The device isn't ODP capable or does not support RC send and receive with ODP"
# odp_pairs NAME FLAGS...: a pair each way with FLAGS on both sides.
odp_pairs() {
    local name=$1
    shift
    pair "ours $name (client) with ibv_rc_pingpong $name (server)" \
        ibv_rc_pingpong "${srv[@]}" "$@" -- "$ours" "${common[@]}" "$@"
    pair "ibv_rc_pingpong $name (client) with ours $name (server)" \
        "$ours" "${srv[@]}" "$@" -- ibv_rc_pingpong "${common[@]}" "$@"
}
echo "-o (on-demand paging)"
if [ "$HAS_ODP_RC" = 1 ]; then
    odp_pairs -o -o
else
    same_end "$rc_odp_msg" "$ours" "${alone[@]}" -o -- ibv_rc_pingpong "${alone[@]}" -o
fi
echo "-O (implicit on-demand paging)"
if [ "$HAS_ODP_RC" = 1 ] && [ "$HAS_IMPLICIT_ODP" = 1 ]; then
    odp_pairs -O -O
elif [ "$HAS_ODP_RC" = 1 ]; then
    same_end "The device doesn't support implicit ODP" \
        "$ours" "${alone[@]}" -O -- ibv_rc_pingpong "${alone[@]}" -O
else
    same_end "$rc_odp_msg" "$ours" "${alone[@]}" -O -- ibv_rc_pingpong "${alone[@]}" -O
fi
echo "-P (prefetch with ibv_advise_mr)"
same_end "prefetch is valid only with on-demand memory region" \
    "$ours" "${alone[@]}" -P -- ibv_rc_pingpong "${alone[@]}" -P
if [ "$HAS_ODP_RC" = 1 ]; then
    odp_pairs "-o -P" -o -P
    # A provider without advise_mr warns in both and carries on: the same error number.
    theirs_warn=$(grep -o "Couldn't prefetch MR([0-9-]*)" "$PAIR_DIR/client.log" || true)
    ours_warn=$(grep -o "Couldn't prefetch MR([0-9-]*)" "$PAIR_DIR/server.log" || true)
    [ "$theirs_warn" = "$ours_warn" ] || { echo "FAILED: prefetch: ibv_rc_pingpong '$theirs_warn', ours '$ours_warn'" >&2; exit 1; }
    echo "  ok: the same prefetch outcome (${ours_warn:-no warning})"
else
    same_end "$rc_odp_msg" "$ours" "${alone[@]}" -o -P -- ibv_rc_pingpong "${alone[@]}" -o -P
fi
echo "-t (completion timestamps)"
if [ "$HAS_TIMESTAMPS" = 1 ]; then
    odp_pairs -t -t
    for side in server client; do
        expect_in "$PAIR_DIR/$side.log" '^Average receive completion clock cycles = [0-9]+\.[0-9]{6}$' \
            "the clock cycles between receives on the $side"
    done
else
    same_end "The device isn't completion timestamp capable" \
        "$ours" "${alone[@]}" -t -- ibv_rc_pingpong "${alone[@]}" -t
fi

echo "bad input"
out=$("$ours" -d "$dev" -g "$gid" -p 18699 127.0.0.1 2>&1) && { echo "FAILED: no server, yet exit 0" >&2; exit 1; }
grep -q "is the server running" <<<"$out" || { echo "FAILED: no-server message: $out" >&2; exit 1; }
echo "  ok: no server: $out"
out=$("$ours" -d no_such_dev 2>&1) && { echo "FAILED: unknown device, yet exit 0" >&2; exit 1; }
grep -qE "available: (.*, )?$dev(,|$)" <<<"$out" || { echo "FAILED: unknown-device message: $out" >&2; exit 1; }
echo "  ok: unknown device: $out"
out=$("$ours" -d "$dev" -g 200 2>&1) && { echo "FAILED: bad GID index, yet exit 0" >&2; exit 1; }
grep -q "has no GID index 200" <<<"$out" || { echo "FAILED: GID message: $out" >&2; exit 1; }
echo "  ok: GID index out of range: $out"
for p in 0 9; do
    out=$("$ours" -d "$dev" -g "$gid" -i "$p" 2>&1) && { echo "FAILED: port $p, yet exit 0" >&2; exit 1; }
    grep -q "has no port $p" <<<"$out" || { echo "FAILED: port $p message: $out" >&2; exit 1; }
    echo "  ok: port $p: $out"
done

# -j: the message buffer in device memory. Each program is started as a client of a port
# nobody listens on, so that it ends either way: at the device-memory check, or (a device
# with device memory) when its connect fails, after which the pair below runs.
echo "-j (device memory)"
c_rc=0; c_out=$(timeout 30 ibv_rc_pingpong -d "$dev" -g "$gid" -j -p 18698 127.0.0.1 2>&1) || c_rc=$?
o_rc=0; o_out=$(timeout 30 "$ours" -d "$dev" -g "$gid" -j -p 18698 127.0.0.1 2>&1) || o_rc=$?
if grep -q "Device doesn't support dm allocation" <<<"$c_out"; then
    [ "$c_rc" = 1 ] || { echo "FAILED: ibv_rc_pingpong -j exited $c_rc: $c_out" >&2; exit 1; }
    [ "$o_rc" = 1 ] || { echo "FAILED: ours -j exited $o_rc (ibv_rc_pingpong: 1): $o_out" >&2; exit 1; }
    grep -q "Device doesn't support dm allocation" <<<"$o_out" ||
        { echo "FAILED: ours -j said: $o_out" >&2; exit 1; }
    if grep -q "local address" <<<"$o_out"; then echo "FAILED: ours -j got as far as its endpoint: $o_out" >&2; exit 1; fi
    echo "  ok: no device memory on $dev: both exit 1; ibv_rc_pingpong: $c_out"
    echo "  ok: ours: $o_out"
else
    echo "  $dev has device memory (ibv_rc_pingpong -j: $c_out); both directions with -j -c"
    pair "ours -j -c (client) with ibv_rc_pingpong -j -c (server)" \
        ibv_rc_pingpong "${srv[@]}" -j -c -- "$ours" "${common[@]}" -j -c
    no_invalid "$PAIR_DIR/server.log" "ibv_rc_pingpong finds our stamps in device memory"
    pair "ibv_rc_pingpong -j -c (client) with ours -j -c (server)" \
        "$ours" "${srv[@]}" -j -c -- ibv_rc_pingpong "${common[@]}" -j -c
    no_invalid "$PAIR_DIR/server.log" "we find ibv_rc_pingpong's stamps in device memory"
fi
if grep -l panicked "$PAIR_DIR"/*.log 2>/dev/null; then echo "FAILED: a panic" >&2; exit 1; fi
echo "rc-pingpong-interop: all passed"
