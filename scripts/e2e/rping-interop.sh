#!/usr/bin/env bash
# Our rping (examples/src/bin/rping.rs) against rdma-core's, both ways, and against itself:
# 10 pings of verbose, validated data over rdmacm on the device's IPv4 address, with the ping
# data on both sides checked against the pattern rdma-core's rping prints; the same with -q
# (each side's own QP, named in the connection's qp_num) both ways; -t, which rdma-core 56
# lists but does not handle, ends both programs alike (the usage, exit status 22). Then a
# client with no server must fail, quickly and saying why. A server's -C is ignored, as
# rdma-core's server ignores it: the count is the client's. Runs where scripts/softroce runs commands.
#
# Under `scripts/softroce run --hosts 2` every server runs on the peer host, on its address,
# and every client here, across the link.
#
# EXAMPLES_BIN: where our binaries are (default target/debug).
# e2e-hosts: 1 2
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/peers.sh

: "${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}"
# Server and client both name the server's address (rdmacm resolves the route to it).
ip=$SERVER_IP
bin=${EXAMPLES_BIN:-target/debug}
ours=$bin/rping
[ -x "$ours" ] || { echo "FAIL: no $ours (build with cargo build -p sideway-examples)" >&2; exit 1; }
command -v rping >/dev/null || { echo "FAIL: rdma-core's rping is not installed" >&2; exit 1; }

count=10
# The data of ping N as rping -v prints it with the default size (64 bytes): "rdma-ping-N: "
# and the pattern from A to z starting N places along, cut to 63 characters.
alphabet=$(printf '%s' {A..Z} '[\]^_`' {a..z})
expected() {
    local n=$1 prefix="rdma-ping-$1: " run
    run="${alphabet:n % 58}$alphabet$alphabet"
    printf '%s%s' "$prefix" "${run:0:$((63 - ${#prefix}))}"
}

# check_pings LOG PREFIX: LOG has exactly $count data lines, "PREFIX" + ping N's data, in order.
check_pings() {
    local log=$1 prefix=$2 n
    local got
    got=$(grep -c "^${prefix}rdma-ping-" "$log" || true)
    if [ "$got" -ne "$count" ]; then
        echo "  FAIL: $(basename "$log") has $got ping data lines, wanted $count" >&2
        return 1
    fi
    n=0
    while IFS= read -r line; do
        if [ "$line" != "$prefix$(expected "$n")" ]; then
            echo "  FAIL: ping $n in $(basename "$log"): got '$line'," \
                "wanted '$prefix$(expected "$n")'" >&2
            return 1
        fi
        n=$((n + 1))
    done < <(grep "^${prefix}rdma-ping-" "$log")
}

port=7180
# pair NAME SERVER CLIENT [FLAGS]: FLAGS (one word, or none) go to both sides.
pair() {
    local name=$1 server=$2 client=$3 flags=()
    [ -n "${4:-}" ] && flags=("$4")
    port=$((port + 1))
    echo "$name: server $server, client $client, port $port"
    run_pair "wait_cm_listen $port 30" \
        "$server" -s -a "$ip" -p "$port" -C "$count" -v -V "${flags[@]}" -- \
        "$client" -c -a "$ip" -p "$port" -C "$count" -v -V "${flags[@]}"
    check_pings "$PAIR_DIR/client.log" "ping data: "
    check_pings "$PAIR_DIR/server.log" "server ping data: "
    echo "  ok: $name"
}

pair "our client, rdma-core's server" rping "$ours"
pair "rdma-core's client, our server" "$ours" rping
pair "ours against ours" "$ours" "$ours"
pair "-q: our client, rdma-core's server" rping "$ours" -q
pair "-q: rdma-core's client, our server" "$ours" rping -q

# -C is the client's: rdma-core 56's server ignores its own and serves until the client
# disconnects. A server with -C 2 and a client with -C 5: five pings, both sides succeed.
count_pair() {
    local name=$1 server=$2 client=$3
    port=$((port + 1))
    echo "-C is the client's, $name: server $server -C 2, client $client -C 5, port $port"
    run_pair "wait_cm_listen $port 30" \
        "$server" -s -a "$ip" -p "$port" -C 2 -v -- \
        "$client" -c -a "$ip" -p "$port" -C 5 -V
    got=$(grep -c "^server ping data: rdma-ping-" "$PAIR_DIR/server.log" || true)
    [ "$got" -eq 5 ] || { echo "  FAIL: the server printed $got pings, wanted 5" >&2; exit 1; }
    echo "  ok: the server served the client's 5 pings"
}
count_pair "rdma-core against itself (the reference)" rping rping
count_pair "our server, rdma-core's client" "$ours" rping
count_pair "our server, our client" "$ours" "$ours"

echo "-t: rdma-core 56 lists it but handles it nowhere; both end with the usage and EINVAL"
usage_theirs=$(mktemp)
usage_ours=$(mktemp)
for side in theirs ours; do
    prog=rping out=$usage_theirs
    [ "$side" = ours ] && prog=$ours out=$usage_ours
    rc=0
    timeout 10 "$prog" -s -t 5 >"$out" 2>/dev/null || rc=$?
    [ "$rc" -eq 22 ] || { echo "  FAIL: $prog -t 5: exit status $rc, wanted 22" >&2; exit 1; }
    expect_in "$out" "use self-created, self-modified QP" "the usage"
done
cmp -s "$usage_theirs" "$usage_ours" || {
    echo "  FAIL: the usage texts differ:" >&2; diff "$usage_theirs" "$usage_ours" >&2; exit 1; }
echo "  ok: exit status 22 and the same usage from both"

echo "our persistent server (-P), two clients in a row: ours, then rdma-core's"
port=$((port + 1))
log=$(mktemp)
timeout -k 5 "$PEER_TIMEOUT" "${SERVER_ON[@]}" "$ours" -s -P -a "$ip" -p "$port" -v >"$log" 2>&1 &
server_pid=$!
wait_cm_listen "$port" 30
timeout 60 "$ours" -c -a "$ip" -p "$port" -C 3 -V >/dev/null
timeout 60 rping -c -a "$ip" -p "$port" -C 3 -V >/dev/null
sleep 1
kill -0 "$server_pid" || { echo "  FAIL: the persistent server stopped" >&2; exit 1; }
kill "$server_pid"
wait "$server_pid" || true
show_log server "$log"
got=$(grep -c "^server ping data: rdma-ping-[012]: " "$log" || true)
[ "$got" -eq 6 ] || { echo "  FAIL: the server printed $got pings, wanted 6" >&2; exit 1; }
echo "  ok: one server, two clients"

echo "our client, while rdma-core's server is killed mid-run"
port=$((port + 1))
# No `timeout` in between: the kill below must hit rping itself (scripts/on-peer-host
# execs it, keeping the process id). It dies at the latest with that kill.
"${SERVER_ON[@]}" rping -s -a "$ip" -p "$port" >/dev/null 2>&1 &
server_pid=$!
wait_cm_listen "$port" 30
out=$(mktemp)
start=$SECONDS
timeout 60 "$ours" -c -a "$ip" -p "$port" -V >"$out" 2>&1 &
client_pid=$!
sleep 2
kill -9 "$server_pid"
wait "$server_pid" 2>/dev/null || true
rc=0
wait "$client_pid" || rc=$?
sed 's/^/  /' "$out"
[ "$rc" -eq 1 ] || { echo "  FAIL: exit status $rc, wanted 1 (124: it hung)" >&2; exit 1; }
expect_in "$out" "^rping: " "a one-line error"
! grep -q panicked "$out" || { echo "  FAIL: it panicked" >&2; exit 1; }
echo "  ok: stops in $((SECONDS - start)) s"

echo "our client with no server listening"
out=$(mktemp)
start=$SECONDS
rc=0
timeout 30 "$ours" -c -a "$ip" -p 7199 -C 3 -v >"$out" 2>&1 || rc=$?
sed 's/^/  /' "$out"
[ "$rc" -eq 1 ] || { echo "  FAIL: exit status $rc, wanted 1" >&2; exit 1; }
[ $((SECONDS - start)) -lt 15 ] || { echo "  FAIL: took $((SECONDS - start)) s" >&2; exit 1; }
expect_in "$out" "^rping: .*7199.*(rejected|unreachable)" "a message naming the address"
! grep -q panicked "$out" || { echo "  FAIL: it panicked" >&2; exit 1; }
echo "  ok: fails in $((SECONDS - start)) s with a clear message"
echo "rping interop: all passed"
