#!/usr/bin/env bash
# stride-perf --data-validation: every verb's data arrives byte for byte (RC, UC and UD, one
# and several QPs, both directions, a size sweep, the latency ping-pongs, atomics' final
# values), the side it lands on says how much it checked, and a wrong byte (the
# STRIDE_TEST_FLIP_BYTE test hook) ends the run on both sides, naming the size, the QP and
# the offset. Binary: ${STRIDE_BIN:-target/debug/stride-perf}.
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

echo "every transport, the latency tests and atomics"
stride "write bw UC, 2 QPs, validated" bw 4096 + client write bw -c UC -s 4096 -n 100 -q 2 \
    --data-validation
checked "write bw UC -q 2" server 8192
# UD data lands after the 40-byte GRH.
stride "send bw UD, 3 QPs, validated" bw 1024 + both send bw -c UD -s 1024 -n 100 -q 3 \
    --data-validation
checked "send bw UD -q 3" server 3072
stride "send bw UC, validated" bw 4096 + both send bw -c UC -s 4096 -n 100 --data-validation
checked "send bw UC" server 4096
stride "send bw -D 2, validated" bw 4096 + both send bw -s 4096 -D 2 --data-validation
checked "send bw -D" server 4096
# The WRITE ping-pong: every byte but the counter, on both sides.
stride "write lat, validated" lat 64 100 both write lat -s 64 -n 100 --data-validation
checked "write lat" client 63
checked "write lat" server 63
stride "send lat UD, validated" lat 512 100 both send lat -c UD -s 512 -n 100 --data-validation
checked "send lat UD" client 512
checked "send lat UD" server 512
stride "read lat, validated" lat 4096 100 client read lat -s 4096 -n 100 --data-validation
checked "read lat" client 4096
# Atomics: the target's final value (the server) and the last value fetched (the client).
stride "atomic bw fetch-and-add, 2 QPs, validated" bw 8 + client atomic bw -n 300 -q 2 \
    --data-validation
checked "atomic bw -q 2" server 16
checked "atomic bw -q 2" client 16
stride "atomic lat compare-and-swap, validated" lat 8 100 client atomic lat -n 100 \
    -A CMP_AND_SWAP --data-validation
checked "atomic lat CAS" server 8
checked "atomic lat CAS" client 8

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

# A wrong starting value of an atomic target (the server's, flipped at byte 3): both sides
# see the wrong final value, the server naming the byte.
flip_atomic() {
    stride_port=$((stride_port + 1))
    local dir rc_s=0 rc_c=0
    dir=$(mktemp -d)
    STRIDE_TEST_FLIP_BYTE=3 timeout -k 5 60 "${SERVER_ON[@]}" "$bin" atomic bw -n 100 \
        --data-validation -d "$SERVER_DEVICE" -p "$stride_port" >"$dir/server" 2>&1 &
    local pid=$!
    wait_tcp_listen "$stride_port" 30 || { fail "flipped atomic: the server never listened"; return; }
    timeout -k 5 60 "$bin" atomic bw -n 100 --data-validation -d "$dev" -p "$stride_port" \
        "$SERVER_ADDR" >"$dir/client" 2>&1 || rc_c=$?
    wait "$pid" || rc_s=$?
    if [ "$rc_s" -eq 0 ] || [ "$rc_c" -eq 0 ]; then
        fail "flipped atomic: exit statuses server $rc_s, client $rc_c (both must fail)"
        show_log server "$dir/server"
        show_log client "$dir/client"
    else
        must_say "$dir/server" "data validation failed: QP 0: the target of the peer's 100 fetch-and-add operations holds 0x[0-9a-f]+, expected 0x[0-9a-f]+ .*the first wrong byte at offset 3" "flipped atomic (server)" ||
            show_log server "$dir/server"
        must_say "$dir/client" "data validation failed" "flipped atomic (client)" ||
            show_log client "$dir/client"
    fi
    rm -rf "$dir"
}
flip_atomic

echo "what cannot be validated is refused"
expect_error "validation of timed atomics" "which a timed run does not fix: use -n" \
    "$bin" atomic bw -d "$dev" -D 2 --data-validation
pair_error "validation on one side only" 'data validation: server true, client false' \
    write bw --data-validation -- write bw
finish
