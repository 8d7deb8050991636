#!/usr/bin/env bash
# rdma-core's own example programs, built from Debian's source of the rdma-core release
# installed here and linked against the shim alone (scripts/rdma-core-examples, on the host),
# against Debian's binaries of the same programs, both directions where there are two sides:
#   ibv_rc/uc/ud/srq_pingpong, rping, udaddy, ucmatose, rdma_server/rdma_client, rstream,
#   riostream (rsocket streams, riostream through riomap/riowrite), cmtime;
# and one-sided: ibv_devices and ibv_devinfo -v print exactly what Debian's print,
# ibv_asyncwatch opens the device and waits for events as Debian's does (ended by timeout).
# ibv_xsrq_pingpong needs XRC, which rxe does not implement: both builds must end with the
# same error, the program's own, and the check says so; on a device with XRC it runs both ways.
# Built but not run here: mckey (multicast), rcopy, rdma_xserver/rdma_xclient (XRC), and
# udpong (rsocket datagrams: on rxe, Debian's own client fails "rconnect: No such file or
# directory" against Debian's own server); linking them against the shim is checked on the
# host.
# Runs where scripts/softroce runs commands; every program runs under `timeout`. It works
# under `scripts/softroce run --hosts 2` too (every server on the peer host, every client
# here, across the link; the one-sided programs here), but scripts/test runs it on one
# device only, to keep the whole run within its time budget: run it by hand for two hosts.
# e2e-hosts: 1
# '$PORT' in single quotes is a placeholder both_ways fills in, not a variable:
# shellcheck disable=SC2016
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/peers.sh
PEER_TIMEOUT=60

dev=${RDMA_TEST_DEVICE:?RDMA_TEST_DEVICE is not set; run this through scripts/softroce run}
gid=${RDMA_TEST_GID_INDEX:-1}
ip=${RDMA_TEST_IP:?RDMA_TEST_IP is not set; the rdmacm programs need the device address}
dir=target/rdma-core-examples
shim=$dir/bin

fail() {
    echo "rdma-core-examples: FAILED: $*" >&2
    exit 1
}

[ -f "$dir/version" ] || fail "$dir is missing; build it on the host with scripts/rdma-core-examples"
built=$(cat "$dir/version")
here=$(dpkg-query -W -f='${Version}' libibverbs1)
[ "$built" = "$here" ] || fail "the programs were built from rdma-core $built, but $here is" \
    "installed here; run scripts/rdma-core-examples again"
echo "rdma-core $here: the programs built against the shim ($shim) against Debian's (/usr/bin)"
for exe in "$shim"/*; do
    ! ldd "$exe" | grep -E 'libibverbs|librdmacm' || fail "$exe loads rdma-core at load time"
    [ -x "/usr/bin/${exe##*/}" ] || fail "Debian's ${exe##*/} is not installed here"
done
echo "ldd: none of the $(ls "$shim" | wc -l) programs loads libibverbs or librdmacm"

passed=0
port=19000

# both_ways NAME READY CHECK SERVER_ARGS... -- CLIENT_ARGS...: runs NAME's server and client
# twice, the shim's server with Debian's client and the other way round, on a fresh PORT each
# (READY and the ARGS may say $PORT, replaced here); CHECK runs on the logs after each.
both_ways() {
    local name=$1 ready=$2 check=$3
    shift 3
    local sargs=() cargs=() a
    while [ "$1" != -- ]; do sargs+=("$1"); shift; done
    shift
    cargs=("$@")
    local server client label
    for server in "$shim/$name" "/usr/bin/$name"; do
        if [ "$server" = "$shim/$name" ]; then
            client=/usr/bin/$name label="shim's server, Debian's client"
        else
            client=$shim/$name label="Debian's server, shim's client"
        fi
        port=$((port + 1))
        local s=() c=()
        for a in "${sargs[@]}"; do s+=("${a//\$PORT/$port}"); done
        for a in "${cargs[@]}"; do c+=("${a//\$PORT/$port}"); done
        echo "$name: $label (port $port)"
        run_pair "${ready//\$PORT/$port}" "$server" "${s[@]}" -- "$client" "${c[@]}"
        $check
        passed=$((passed + 1))
    done
}

ready_tcp() { wait_tcp_listen "$1" 30; }
ready_cm() { wait_cm_listen "$1" 30; }
# cmtime's server listens on rdmacm and on a TCP side channel on the same port.
ready_cm_tcp() { wait_cm_listen "$1" 30 && wait_tcp_listen "$1" 30; }

iters=200
pingpong_check() {
    expect_in "$PAIR_DIR/server.log" "^$iters iters in [0-9.]+ seconds" "$iters iterations on the server"
    expect_in "$PAIR_DIR/client.log" "^$iters iters in [0-9.]+ seconds" "$iters iterations on the client"
}
for p in rc uc srq; do
    both_ways "ibv_${p}_pingpong" 'ready_tcp $PORT' pingpong_check \
        -d "$SERVER_DEVICE" -g "$SERVER_GID_INDEX" -n "$iters" -p '$PORT' -- \
        -d "$dev" -g "$gid" -n "$iters" -p '$PORT' "$SERVER_ADDR"
done
# UD messages must fit the path MTU (1024 on rxe over a 1500-byte netdev).
both_ways ibv_ud_pingpong 'ready_tcp $PORT' pingpong_check \
    -d "$SERVER_DEVICE" -g "$SERVER_GID_INDEX" -n "$iters" -s 1024 -p '$PORT' -- \
    -d "$dev" -g "$gid" -n "$iters" -s 1024 -p '$PORT' "$SERVER_ADDR"

rping_check() {
    local i
    for i in 0 1 2; do
        expect_in "$PAIR_DIR/client.log" "^ping data: rdma-ping-$i: " "ping $i on the client"
        expect_in "$PAIR_DIR/server.log" "^server ping data: rdma-ping-$i: " "ping $i on the server"
    done
}
both_ways rping 'ready_cm $PORT' rping_check \
    -s -a "$SERVER_IP" -p '$PORT' -C 3 -v -- -c -a "$SERVER_IP" -p '$PORT' -C 3 -v

# udaddy and ucmatose: one connection, the default 10 messages each way.
cm_datagram_check() {
    expect_in "$PAIR_DIR/server.log" '^data transfers complete$' "completed transfers on the server"
    expect_in "$PAIR_DIR/client.log" '^data transfers complete$' "completed transfers on the client"
    expect_in "$PAIR_DIR/server.log" '^return status 0$' "status 0 on the server"
    expect_in "$PAIR_DIR/client.log" '^return status 0$' "status 0 on the client"
}
# udaddy has no port option: it always uses 7174 (its -p is the legacy port-space flag).
both_ways udaddy 'ready_cm 7174' cm_datagram_check -b "$SERVER_IP" -- -s "$SERVER_IP" -b "$ip"
both_ways ucmatose 'ready_cm $PORT' cm_datagram_check -b "$SERVER_IP" -p '$PORT' -- \
    -s "$SERVER_IP" -b "$ip" -p '$PORT'

rdma_server_check() {
    expect_in "$PAIR_DIR/server.log" '^rdma_server: end 0$' "rdma_server's end 0"
    expect_in "$PAIR_DIR/client.log" '^rdma_client: end 0$' "rdma_client's end 0"
}
# One program per side here: rdma_server with rdma_client, each build's of each.
for server in "$shim/rdma_server" /usr/bin/rdma_server; do
    if [ "$server" = "$shim/rdma_server" ]; then client=/usr/bin/rdma_client
    else client=$shim/rdma_client; fi
    port=$((port + 1))
    echo "rdma_server/rdma_client: $server with $client (port $port)"
    run_pair "ready_cm $port" "$server" -s "$SERVER_IP" -p "$port" -- \
        "$client" -s "$SERVER_IP" -p "$port"
    rdma_server_check
    passed=$((passed + 1))
done

# rstream and riostream: one "custom" run of 100 transfers of 4 KiB each way (800k in all).
stream_check() {
    local side
    for side in server client; do
        expect_in "$PAIR_DIR/$side.log" '^custom +4k +100 +1 +800k +[0-9.]+s ' "the result row on the $side"
    done
}
for p in rstream riostream; do
    both_ways "$p" 'ready_cm $PORT' stream_check \
        -b "$SERVER_IP" -p '$PORT' -S 4096 -C 100 -- -s "$SERVER_IP" -p '$PORT' -S 4096 -C 100
done

cmtime_check() {
    local side
    for side in server client; do
        expect_in "$PAIR_DIR/$side.log" '^step ' "cmtime's table on the $side"
        expect_in "$PAIR_DIR/$side.log" '^full connect +[0-9]' "the full-connect row on the $side"
    done
}
# The server names its own QP numbers for the round without QPs (-q 5000): on one host the
# CM refuses the same numbers from both sides as stale.
both_ways cmtime 'ready_cm_tcp $PORT' cmtime_check \
    -b "$SERVER_IP" -p '$PORT' -c 20 -q 5000 -- -s "$SERVER_IP" -b "$ip" -p '$PORT' -c 20

# --- one side ------------------------------------------------------------------------------
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for args in "ibv_devices" "ibv_devinfo -d $dev -v"; do
    read -r prog rest <<<"$args"
    # shellcheck disable=SC2086
    timeout 30 "$shim/$prog" $rest >"$out/shim" 2>&1 || fail "$shim/$prog $rest failed: $(cat "$out/shim")"
    # shellcheck disable=SC2086
    timeout 30 "/usr/bin/$prog" $rest >"$out/debian" 2>&1 || fail "/usr/bin/$prog $rest failed"
    grep -q "$dev" "$out/shim" || fail "$prog does not list $dev"
    if ! diff -u "$out/debian" "$out/shim" >"$out/diff"; then
        sed 's/^/  /' "$out/diff"
        fail "the shim's $prog printed something else than Debian's (diff above)"
    fi
    echo "$prog: the shim's build prints exactly what Debian's prints ($(wc -l <"$out/shim") lines)"
    passed=$((passed + 1))
done

# ibv_asyncwatch opens the device and blocks for async events; nothing happens, so timeout
# ends both builds after 3 s (status 124), each having said what it watches.
for exe in "$shim/ibv_asyncwatch" /usr/bin/ibv_asyncwatch; do
    rc=0
    timeout 3 "$exe" -d "$dev" >"$out/log" 2>&1 || rc=$?
    sed 's/^/  /' "$out/log"
    [ "$rc" -eq 124 ] || fail "$exe exited $rc before the timeout"
    grep -q "^$dev: async event FD" "$out/log" || fail "$exe did not report watching $dev"
done
echo "ibv_asyncwatch: both builds watch $dev until stopped"
passed=$((passed + 1))

# ibv_xsrq_pingpong: XRC. On a device without it the server ends at once; both builds must end
# alike, with the same message.
rc_shim=0 rc_deb=0
port=$((port + 1))
timeout 30 "$shim/ibv_xsrq_pingpong" -d "$dev" -g "$gid" -p "$port" >"$out/shim" 2>&1 || rc_shim=$?
port=$((port + 1))
timeout 30 /usr/bin/ibv_xsrq_pingpong -d "$dev" -g "$gid" -p "$port" >"$out/debian" 2>&1 || rc_deb=$?
sed 's/^/  [shim] /' "$out/shim"
sed 's/^/  [debian] /' "$out/debian"
if [ "$rc_shim" -eq 124 ] && [ "$rc_deb" -eq 124 ]; then
    # Both servers waited for a client: the device has XRC; run it both ways.
    both_ways ibv_xsrq_pingpong 'ready_tcp $PORT' true \
        -d "$SERVER_DEVICE" -g "$SERVER_GID_INDEX" -p '$PORT' -- \
        -d "$dev" -g "$gid" -p '$PORT' "$SERVER_ADDR"
else
    [ "$rc_shim" -ne 0 ] && [ "$rc_shim" -eq "$rc_deb" ] ||
        fail "ibv_xsrq_pingpong: the shim's build exited $rc_shim, Debian's $rc_deb"
    diff -q "$out/debian" "$out/shim" >/dev/null ||
        fail "ibv_xsrq_pingpong: the two builds failed with different messages (above)"
    echo "ibv_xsrq_pingpong: $dev has no XRC; both builds end alike with the program's own" \
        "message: $(head -n 1 "$out/shim")"
    passed=$((passed + 1))
fi

echo "rdma-core-examples: all $passed runs passed"
