#!/usr/bin/env bash
# stride/scripts/rate-limit-accuracy.sh: how close stride-perf's --rate-limit lands on its
# target, beside perftest's software limiter (--rate_limit_type SW) on the same targets, in
# the same guest, alternating the two. Prints a Markdown table (docs/rate-limit.md holds one).
# Run where the RDMA device is:
#   flock -w 3600 /tmp/softroce-guest.lock timeout 1500 \
#       scripts/softroce run -- stride/scripts/rate-limit-accuracy.sh
# Binary: ${STRIDE_BIN:-target/debug/stride-perf}; ${SECS:-4} seconds per run.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. scripts/lib/peers.sh
dev=${RDMA_TEST_DEVICE:?run this through scripts/softroce run}
gid=${RDMA_TEST_GID_INDEX:-1}
bin=${STRIDE_BIN:-target/debug/stride-perf}
secs=${SECS:-4}
port=19300
PEER_TIMEOUT=60
json=$(mktemp)
trap 'rm -f "$json"' EXIT

# avg LOG SIZE: the client's printed average (MiB/s; perftest's MB/sec is 2^20 bytes too).
avg() { awk -v s="$2" '$1 == s && NF == 5 && $4 ~ /^[0-9.]+$/ { a = $4 } END { print a + 0 }' "$1"; }
# json_avg FILE: the client's average from stride-perf's JSON file (its first result, this
# side's), in MiB/s with more digits than the table prints.
json_avg() {
    awk -F': *' '/"avg_bytes_per_sec"/ { sub(/,$/, "", $2); printf "%.3f\n", $2 / 1048576; exit }' "$1"
}

# one TOOL SIZE RATE UNIT BURST: runs one pair; prints the client's average in MiB/s.
one() {
    local tool=$1 size=$2 rate=$3 unit=$4 burst=$5 args=()
    port=$((port + 1))
    if [ "$tool" = stride ]; then
        args=(write bw -s "$size" -D "$secs" -x "$gid" -d "$dev" -p "$port")
        [ "$rate" = - ] || args+=(--rate-limit "$rate" --rate-units "$unit" --burst-size "$burst")
        run_pair "wait_tcp_listen $port 30" "$bin" "${args[@]}" -- "$bin" "${args[@]}" \
            --json "$json" 127.0.0.1 >/dev/null 2>&1 || { echo fail; return; }
        json_avg "$json"
        return
    else
        args=(-s "$size" -D "$secs" -x "$gid" -d "$dev" -p "$port" -F)
        [ "$rate" = - ] || args+=(--rate_limit="$rate" --rate_units="$unit" \
            --rate_limit_type=SW --burst_size="$burst")
        run_pair "wait_tcp_listen $port 30" ib_write_bw "${args[@]}" -- ib_write_bw \
            "${args[@]}" 127.0.0.1 >/dev/null 2>&1 || { echo fail; return; }
    fi
    avg "$PAIR_DIR/client.log" "$size"
}

# target_mibs SIZE RATE UNIT: the target in MiB/s.
target_mibs() {
    awk -v s="$1" -v r="$2" -v u="$3" 'BEGIN {
        if (u == "g") print r * 1e9 / 8 / 1048576
        else if (u == "M") print r
        else print r * s / 1048576 }'
}

err() { awk -v a="$1" -v t="$2" 'BEGIN { if (a + 0 > 0) printf "%+.2f %%", (a - t) / t * 100; else print "n/a" }'; }

echo "rxe ($dev) in this guest, RDMA WRITE, $secs s per run (-D $secs), $bin"
echo
for size in 4096 65536; do
    echo "unlimited, $size B: stride-perf $(one stride "$size" - - -) MiB/s," \
        "ib_write_bw $(one perftest "$size" - - -) MiB/s"
done
echo
echo "| message | --rate-limit | target [MiB/s] | stride-perf [MiB/s] | error | ib_write_bw SW [MiB/s] | error |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
while read -r size rate unit burst; do
    t=$(target_mibs "$size" "$rate" "$unit")
    s=$(one stride "$size" "$rate" "$unit" "$burst")
    p=$(one perftest "$size" "$rate" "$unit" "$burst")
    printf '| %s B | %s %s, burst %s | %.3f | %s | %s | %s | %s |\n' "$size" "$rate" "$unit" \
        "$burst" "$t" "$s" "$(err "$s" "$t")" "$p" "$(err "$p" "$t")"
done <<'TARGETS'
4096 1 M 1
4096 4 M 1
4096 8 M 1
4096 500 p 1
4096 1000 p 8
65536 0.02 g 1
65536 0.05 g 1
65536 0.1 g 4
65536 10 M 1
TARGETS
