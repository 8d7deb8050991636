#!/usr/bin/env bash
# Our cmtime (examples/src/bin/cmtime/main.rs) against rdma-core's, both ways, and against itself:
# 100 connections per round, every side must succeed and print its tables (one for the round
# with QPs, one for the round without), with a row for every step. The steps each side
# performs must show positive times in every column. Then, with 20 connections, the flags
# that change what crosses the wire, both ways: -m 200 (the timed round's QPs simulated by
# 200 us sleeps, the connections naming QP numbers from -q on) with -n 4 worker threads on
# the side that is ours, and -S (TCP sockets instead of rdma_cm, no step bytes). Runs where
# scripts/softroce runs commands.
#
# Client and server run on one host here, so the server gets its own QP numbers for the round
# without QPs (-q 5000): with both sides naming the same numbers, the CM refuses the
# connections as stale (rdma-core's cmtime fails the same way against itself).
#
# Under `scripts/softroce run --hosts 2` every server runs on the peer host, bound to its
# address, and every client here, bound to this host's.
#
# EXAMPLES_BIN: where our binaries are (default target/debug).
# e2e-hosts: 1 2
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/peers.sh

ip=${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}
bin=${EXAMPLES_BIN:-target/debug}
ours=$bin/cmtime
[ -x "$ours" ] || { echo "FAIL: no $ours (build with cargo build -p sideway-examples)" >&2; exit 1; }
command -v cmtime >/dev/null || { echo "FAIL: rdma-core's cmtime is not installed" >&2; exit 1; }

n=100
all_steps=("full connect" "create id" "bind addr" "resolve addr" "resolve route" "create qp"
    "init qp attr" "init qp" "rtr qp attr" "rtr qp" "rts qp attr" "rts qp" "cm connect"
    "establish" "disconnect" "destroy id" "destroy qp")
# What each side does, and so must time, per round.
client_qp_steps=("${all_steps[@]}")
client_cm_steps=("full connect" "create id" "bind addr" "resolve addr" "resolve route"
    "init qp attr" "rtr qp attr" "rts qp attr" "cm connect" "establish" "disconnect"
    "destroy id")
server_qp_steps=("full connect" "create qp" "init qp attr" "init qp" "rtr qp attr" "rtr qp"
    "rts qp attr" "rts qp" "cm connect" "disconnect" "destroy id" "destroy qp")
server_cm_steps=("full connect" "init qp attr" "rtr qp attr" "rts qp attr" "cm connect"
    "disconnect" "destroy id")

# check_table LOG LABEL [STEP...]: LOG has the table headed "LABEL  $n" with a row of six
# numbers for every step, and positive numbers in every column of the STEPs named.
check_table() {
    local log=$1 label=$2 step row
    shift 2
    local tbl
    tbl=$(awk -v label="$label" -v n="$n" '
        $1 == label && $2 == n { on = 1; next }
        on && /^step / { rows = 1; next }
        on && rows && NF < 7 { exit }
        on && rows { print }' "$log")
    for step in "${all_steps[@]}"; do
        row=$(grep -E "^$step +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+ +[0-9]+$" <<<"$tbl" || true)
        if [ -z "$row" ]; then
            echo "  FAIL: no '$step' row in the $label table of $(basename "$log")" >&2
            return 1
        fi
    done
    for step in "$@"; do
        row=$(grep -E "^$step +[0-9]" <<<"$tbl")
        # The six numbers are the last six fields.
        if ! awk '{ for (i = NF - 5; i <= NF; i++) if ($i + 0 <= 0) exit 1 }' <<<"$row"; then
            echo "  FAIL: $(basename "$log"): '$step' has a zero in the $label table: $row" >&2
            return 1
        fi
    done
}

ready() { wait_cm_listen "$1" 30 && wait_tcp_listen "$1" 30; }

port=7490
pair() {
    local name=$1 server=$2 client=$3
    port=$((port + 1))
    echo "$name: port $port, $n connections"
    run_pair "ready $port" \
        "$server" -b "$SERVER_IP" -p "$port" -c "$n" -q 5000 -- \
        "$client" -s "$SERVER_IP" -b "$ip" -p "$port" -c "$n"
}

pair "our client, rdma-core's server" cmtime "$ours"
check_table "$PAIR_DIR/client.log" qp_conn "${client_qp_steps[@]}"
check_table "$PAIR_DIR/client.log" cm_conn "${client_cm_steps[@]}"
check_table "$PAIR_DIR/server.log" qp_conn
check_table "$PAIR_DIR/server.log" cm_conn
echo "  ok"

pair "rdma-core's client, our server" "$ours" cmtime
check_table "$PAIR_DIR/client.log" qp_conn
check_table "$PAIR_DIR/client.log" cm_conn
check_table "$PAIR_DIR/server.log" qp_conn "${server_qp_steps[@]}"
check_table "$PAIR_DIR/server.log" cm_conn "${server_cm_steps[@]}"
echo "  ok"

pair "ours against ours" "$ours" "$ours"
check_table "$PAIR_DIR/client.log" qp_conn "${client_qp_steps[@]}"
check_table "$PAIR_DIR/client.log" cm_conn "${client_cm_steps[@]}"
check_table "$PAIR_DIR/server.log" qp_conn "${server_qp_steps[@]}"
check_table "$PAIR_DIR/server.log" cm_conn "${server_cm_steps[@]}"
echo "  ok"

# table_row LOG LABEL STEP: STEP's row in the first table headed "LABEL  $n" of LOG.
table_row() {
    awk -v label="$2" -v n="$n" -v step="$3" '
        $1 == label && $2 == n { on = 1; next }
        on && $0 ~ ("^" step " +[0-9]") { print; exit }' "$1"
}

# check_min LOG LABEL STEP US: the shortest time of STEP (the last column) is at least US.
check_min() {
    local row
    row=$(table_row "$1" "$2" "$3")
    awk -v us="$4" '{ exit !($NF + 0 >= us) }' <<<"$row" || {
        echo "  FAIL: $(basename "$1"): '$3' took less than $4 us at least once: $row" >&2
        return 1
    }
}

# check_total LOG LABEL STEP: the step's whole time (total(us), the fourth column from the
# end) is positive.
check_total() {
    local row
    row=$(table_row "$1" "$2" "$3")
    awk '{ exit !($(NF - 4) + 0 > 0) }' <<<"$row" || {
        echo "  FAIL: $(basename "$1"): '$3' has no total time: '$row'" >&2
        return 1
    }
}

n=20
mimic() {
    local name=$1 server=$2 client=$3 sflags=$4 cflags=$5
    port=$((port + 1))
    echo "-m: $name: port $port, $n connections"
    # shellcheck disable=SC2086  # the flags are words
    run_pair "ready $port" \
        "$server" -b "$SERVER_IP" -p "$port" -c "$n" -q 5000 -m 200 $sflags -- \
        "$client" -s "$SERVER_IP" -b "$ip" -p "$port" -c "$n" -m 200 $cflags
    for side in server client; do
        expect_in "$PAIR_DIR/$side.log" "^(Accept|Connect) \($n\) simulated QPs test \(delay 200 us\)$" \
            "the simulated round's title"
        # The simulated round's table is the first cm_conn table.
        check_min "$PAIR_DIR/$side.log" cm_conn "create qp" 200
    done
    check_min "$PAIR_DIR/client.log" cm_conn "init qp" 200
    check_min "$PAIR_DIR/server.log" cm_conn "rts qp" 200
}
mimic "our client (-n 4), rdma-core's server" cmtime "$ours" "" "-n 4"
expect_in "$PAIR_DIR/client.log" "^threads +4$" "our -n 4 in the table"
echo "  ok"
mimic "rdma-core's client, our server (-n 2)" "$ours" cmtime "-n 2" ""
expect_in "$PAIR_DIR/server.log" "^threads +2$" "our -n 2 in the table"
echo "  ok"

sockets() {
    local name=$1 server=$2 client=$3
    port=$((port + 1))
    echo "-S: $name: port $port, $n TCP connections"
    run_pair "wait_tcp_listen $port 30" \
        "$server" -S -b "$SERVER_IP" -p "$port" -c "$n" -- \
        "$client" -S -s "$SERVER_IP" -p "$port" -c "$n" -n 2
    expect_in "$PAIR_DIR/server.log" "^Server baseline socket results:$" "the server's results"
    expect_in "$PAIR_DIR/client.log" "^Client baseline socket results:$" "the client's results"
    check_total "$PAIR_DIR/server.log" cm_conn "full connect"
    check_total "$PAIR_DIR/client.log" cm_conn "full connect"
    check_total "$PAIR_DIR/client.log" cm_conn "cm connect"
    check_total "$PAIR_DIR/client.log" cm_conn "create id"
}
sockets "our client (-n 2), rdma-core's server" cmtime "$ours"
echo "  ok"
sockets "rdma-core's client, our server" "$ours" cmtime
echo "  ok"

echo "our client with no server"
out=$(mktemp)
rc=0
timeout 60 "$ours" -s "$SERVER_IP" -b "$ip" -p 7499 -c 5 >"$out" 2>&1 || rc=$?
sed 's/^/  /' "$out"
[ "$rc" -eq 1 ] || { echo "  FAIL: exit status $rc, wanted 1" >&2; exit 1; }
expect_in "$out" "^cmtime: .*7499" "a message naming the server"
echo "  ok"
echo "cmtime interop: all passed"
