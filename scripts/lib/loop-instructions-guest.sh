#!/usr/bin/env bash
# The guest side of scripts/loop-instructions (see there): runs `stride-loopcost plan`'s runs
# in order, each a server on the peer host and its client under callgrind here. Writes
# OUT/plan.tsv and OUT/PROFILE for every run. Needs a two-host guest with valgrind
# (scripts/softroce run --hosts 2, SOFTROCE_EXTRA_PACKAGES=valgrind).
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
# shellcheck source=scripts/lib/peers.sh
. scripts/lib/peers.sh # SERVER_ON, wait_tcp_listen, wait_cm_listen
# shellcheck disable=SC2086 # the rows are words
"$LOOPCOST" plan "$SHORT_ITERS" "$LONG_ITERS" $ROWS >"$OUT/plan.tsv"
while IFS=$'\t' read -r profile ready port server client; do
    read -ra server <<<"$server"
    read -ra client <<<"$client"
    timeout -k 5 900 "${SERVER_ON[@]}" "${server[@]}" </dev/null >"$OUT/server.log" 2>&1 &
    pid=$!
    "wait_${ready}_listen" "$port" 30 || { kill "$pid"; tail -n 5 "$OUT/server.log" >&2; exit 1; }
    if ! timeout -k 5 900 valgrind --tool=callgrind --dump-instr=yes --compress-pos=no \
        --callgrind-out-file="$OUT/$profile" "${client[@]}" </dev/null >"$OUT/client.log" 2>&1
    then
        echo "loop-instructions: ${client[*]} failed under callgrind:" >&2
        tail -n 5 "$OUT/client.log" "$OUT/server.log" >&2
        kill "$pid" 2>/dev/null || true
        exit 1
    fi
    wait "$pid" || { echo "loop-instructions: the server ${server[*]} failed:" >&2
        tail -n 5 "$OUT/server.log" >&2; exit 1; }
    echo "$profile: $(grep -o 'Collected : [0-9]*' "$OUT/client.log")"
done <"$OUT/plan.tsv"
