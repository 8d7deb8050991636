#!/usr/bin/env bash
# stride-perf --data-validation: every RC bandwidth verb's data arrives byte for byte (one
# and several QPs, both directions, a size sweep), the side it lands on says how much it
# checked, and a wrong byte (the STRIDE_TEST_FLIP_BYTE test hook) ends the run on both sides,
# naming the size, the QP and the offset. Binary: ${STRIDE_BIN:-target/debug/stride-perf}.
# (It can run across two hosts, servers on the peer host; the link faults check covers that.)
# e2e-hosts: 1
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/stride.sh

# checked NAME SIDE BYTES: SIDE's log of the last pair says BYTES bytes were checked.
checked() {
    must_say "$PAIR_DIR/$2.log" "Data validation : $3 bytes checked on this side" "$1 ($2)"
}

echo "data that arrives is what was sent"
stride "write bw, validated" bw 65536 200 client write bw -s 65536 -n 200 --data-validation
checked "write bw" server 65536
must_say "$PAIR_DIR/client.log" "Data validation : the peer checks" "write bw (client)"
stride "read bw, 2 QPs, validated" bw 4096 + client read bw -s 4096 -n 200 -q 2 \
    --data-validation
checked "read bw -q 2" client 8192
stride "send bw, bidirectional, validated" bw 8192 300 both send bw -s 8192 -n 300 -b \
    --data-validation
checked "send bw -b" client 8192
checked "send bw -b" server 8192
# Every size of the sweep, 2 B to 8 MiB: 2 + 4 + ... + 2^23 = 2^24 - 2 bytes checked.
stride "write bw, every size of -a, validated" bw 8388608 20 client write bw -a -n 20 \
    --data-validation
must_say "$PAIR_DIR/server.log" "Data validation : 16777214 bytes checked" "write bw -a (server)"

echo "a wrong byte is found"
flip_pair() {
    stride_port=$((stride_port + 1))
    local dir rc_s=0 rc_c=0
    dir=$(mktemp -d)
    timeout -k 5 60 "${SERVER_ON[@]}" "$bin" write bw -s 4096 -n 100 --data-validation \
        -d "$SERVER_DEVICE" -p "$stride_port" >"$dir/server" 2>&1 &
    local pid=$!
    wait_tcp_listen "$stride_port" 30 || { fail "flipped byte: the server never listened"; return; }
    STRIDE_TEST_FLIP_BYTE=1000 timeout -k 5 60 "$bin" write bw -s 4096 -n 100 \
        --data-validation -d "$dev" -p "$stride_port" "$SERVER_ADDR" >"$dir/client" 2>&1 || rc_c=$?
    wait "$pid" || rc_s=$?
    local want='data validation failed: size 4096, QP 0: .*1 of 4096 bytes are not what the peer sent; the first at offset 1000'
    if [ "$rc_s" -eq 0 ] || [ "$rc_c" -eq 0 ]; then
        fail "flipped byte: exit statuses server $rc_s, client $rc_c (both must fail)"
        show_log server "$dir/server"
        show_log client "$dir/client"
    else
        must_say "$dir/server" "$want" "flipped byte (server)"
        must_say "$dir/client" "the peer stopped: .*$want" "flipped byte (client)"
    fi
    rm -rf "$dir"
}
flip_pair

echo "what cannot be validated is refused"
expect_error "validation of a latency test" "checks bandwidth tests" \
    "$bin" write lat -d "$dev" --data-validation
expect_error "validation over UD" "needs -c RC" \
    "$bin" send bw -d "$dev" -c UD --data-validation
pair_error "validation on one side only" 'data validation: server true, client false' \
    write bw --data-validation -- write bw
finish
