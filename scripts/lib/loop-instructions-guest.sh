#!/usr/bin/env bash
# The guest side of scripts/loop-instructions (see there): for every row of ROWS, perftest's
# program and stride-perf, each client twice under callgrind (-n SHORT_ITERS, -n LONG_ITERS),
# its server on the peer host. Writes OUT/TOOL-TEST-SIZE-ITERS.out. Needs a two-host guest
# with valgrind (scripts/softroce run --hosts 2, SOFTROCE_EXTRA_PACKAGES=valgrind).
set -euo pipefail
command -v valgrind >/dev/null || {
    echo "loop-instructions: no valgrind in the guest; run through scripts/loop-instructions" \
        "(it sets SOFTROCE_EXTRA_PACKAGES=valgrind)" >&2
    exit 2
}
[ -n "${RDMA_TEST_PEER_NETNS:-}" ] || {
    echo "loop-instructions: needs two hosts (scripts/softroce run --hosts 2)" >&2
    exit 2
}
port=19700
for row in $ROWS; do
    test=${row%%:*} size=${row#*:}
    size_flag=(-s "$size")
    [ "$test" = atomic_lat ] && size_flag=()
    for tool in perftest stride; do
        case $tool in
            perftest) cmd=("ib_$test") ;;
            stride) cmd=("$STRIDE_BIN" "${test%_*}" "${test#*_}") ;;
        esac
        for n in "$SHORT_ITERS" "$LONG_ITERS"; do
            port=$((port + 1))
            common=(-p "$port" "${size_flag[@]}" -n "$n")
            timeout -k 5 900 scripts/on-peer-host "${cmd[@]}" -d "$RDMA_TEST_PEER_DEVICE" \
                -x "$RDMA_TEST_PEER_GID_INDEX" "${common[@]}" >"$OUT/server.log" 2>&1 &
            server=$!
            for _ in $(seq 100); do
                [ -n "$(scripts/on-peer-host ss -Hltn "sport = :$port" 2>/dev/null)" ] && break
                sleep 0.1
            done
            profile=$OUT/$tool-$test-$size-$n.out
            if ! timeout -k 5 900 valgrind --tool=callgrind --dump-instr=yes \
                --compress-pos=no --callgrind-out-file="$profile" "${cmd[@]}" \
                -d "$RDMA_TEST_DEVICE" -x "$RDMA_TEST_GID_INDEX" "${common[@]}" \
                "$RDMA_TEST_PEER_IP" >"$OUT/client.log" 2>&1; then
                echo "loop-instructions: $tool $test $size -n $n failed under callgrind:" >&2
                tail -n 5 "$OUT/client.log" "$OUT/server.log" >&2
                exit 1
            fi
            wait "$server" || { echo "loop-instructions: the $tool server failed:" >&2
                tail -n 5 "$OUT/server.log" >&2; exit 1; }
            echo "$tool $test $size -n $n: $(grep -o 'Collected : [0-9]*' "$OUT/client.log")"
        done
    done
done
