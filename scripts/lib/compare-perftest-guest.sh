#!/usr/bin/env bash
# The guest side of scripts/compare-perftest (see there): runs every row of ROWS, ROUNDS rounds
# of perftest's program and stride-perf alternately, and writes the raw numbers to RAW. Runs
# where the RDMA device is (scripts/compare-perftest starts it in the SoftRoCE guest). Needs
# STRIDE_BIN, RAW, ROUNDS, ITERS, LAT_ITERS and ROWS in the environment, and RDMA_TEST_DEVICE
# and RDMA_TEST_GID_INDEX (and RDMA_TEST_PEER_* on two hosts) as scripts/softroce sets them.
set -euo pipefail
dev=$RDMA_TEST_DEVICE
gid=$RDMA_TEST_GID_INDEX
# Where servers run: on the peer host when there are two (scripts/on-peer-host, with its own
# device and GID index; clients connect to its address), else here, over loopback.
if [ -n "${RDMA_TEST_PEER_NETNS:-}" ]; then
    server_on=(scripts/on-peer-host)
    server_dev=$RDMA_TEST_PEER_DEVICE
    server_gid=$RDMA_TEST_PEER_GID_INDEX
    server_addr=$RDMA_TEST_PEER_IP
    where="servers on $RDMA_TEST_PEER_NETNS ($server_dev), clients on ${RDMA_TEST_NETNS:-this host} ($dev)"
else
    server_on=()
    server_dev=$dev
    server_gid=$gid
    server_addr=127.0.0.1
    where="both programs on one device ($dev), the client connecting over loopback"
fi
# until_listening PORT SECS: until a server listens on TCP PORT where servers run.
until_listening() {
    local deadline=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$deadline" ]; do
        [ -n "$("${server_on[@]}" ss -Hltn "sport = :$1" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    echo "nothing listened on TCP port $1 within $2 s" >&2
    return 1
}
port=18900
clocksource=/sys/devices/system/clocksource/clocksource0/current_clocksource
: >"$RAW"
{
    echo "# method: Made by \`scripts/compare-perftest\` in one SoftRoCE guest boot" \
        "(\`scripts/softroce run\`, $(nproc) vCPUs), $where: for each row, perftest's" \
        "program and the same \`stride-perf\` test ran alternately, $ROUNDS rounds of one run" \
        "each, with the same device, GID index, size, iterations and the row's flags" \
        "(\`-n\`: $ITERS for write and send latency, $LAT_ITERS for read and atomic latency;" \
        "for bandwidth 16 MiB worth of messages, between $ITERS and 5000), every other" \
        "setting at each tool's default (they match: TX depth 128, CQ moderation 100 or" \
        "1 above 8 KiB, outstanding READs/atomics the device's most, posting as perftest" \
        "does on the device (ibv_post_send on rxe), polling with ibv_poll_cq, no inline" \
        "data on rxe)."
    echo "# $(uname -r); $(ibv_devinfo -d "$dev" | grep -m1 fw_ver | xargs); $(nproc) CPUs"
    # stride-perf reads the clock through the kernel, perftest reads the TSC itself: a
    # clocksource other than the TSC, or a switch mid-run, weighs on stride alone.
    echo "# clocksource at the start: $(cat "$clocksource")"
    echo "# perftest: $(dpkg-query -W -f "\${Version}" perftest 2>/dev/null || echo "?")," \
        "rdma-core: $(dpkg-query -W -f "\${Version}" rdma-core 2>/dev/null || echo "?")"
} >>"$RAW"
# iters_for TEST SIZE: -n of a row.
iters_for() {
    local n
    case $1 in
        read_lat | atomic_lat) echo "$LAT_ITERS"; return ;;
        *_lat) echo "$ITERS"; return ;;
    esac
    n=$((16777216 / $2))
    [ "$n" -lt "$ITERS" ] && n=$ITERS
    [ "$n" -gt 5000 ] && n=5000
    echo "$n"
}
TIMEFORMAT="%3U %3S"
# one TOOL TEST SIZE FLAGS: one run of a pair; prints "RESULT CPU_SECONDS MESSAGES".
one() {
    local tool=$1 test=$2 size=$3 iters qps=1 common=() cmd=() sdev=() cdev=()
    local -a flags
    read -r -a flags <<<"$4"
    iters=$(iters_for "$test" "$size")
    [ "${flags[0]:-}" = -q ] && qps=${flags[1]}
    port=$((port + 1))
    common=(-s "$size" -n "$iters" -p "$port" "${flags[@]}")
    case $tool in
        perftest) cmd=("ib_$test") ;;
        stride) cmd=("$STRIDE_BIN" "${test%_*}" "${test#*_}") ;;
    esac
    sdev=(-d "$server_dev" -x "$server_gid")
    cdev=(-d "$dev" -x "$gid")
    { time timeout -k 5 300 "${server_on[@]}" "${cmd[@]}" "${sdev[@]}" "${common[@]}" \
        >/tmp/cmp.server 2>&1; } 2>/tmp/cmp.server.cpu &
    local server=$!
    until_listening "$port" 60 >/dev/null || true
    { time timeout -k 5 300 "${cmd[@]}" "${cdev[@]}" "${common[@]}" "$server_addr" \
        >/tmp/cmp.client 2>&1; } 2>/tmp/cmp.client.cpu || true
    wait "$server" || true
    local value cpu
    # The result row: the size, the iteration count, then the numbers.
    # (stride prints every QP's messages as #iterations, perftest those of one QP.)
    value=$(awk -v size="$size" -v iters="$iters" -v all="$((iters * qps))" \
        -v lat="${test#*_}" '
        $1 == size && ($2 == iters || $2 == all) {
            print (lat == "lat" ? $5 : $4); found = 1; exit
        }
        END { if (!found) print "nan" }' /tmp/cmp.client)
    cpu=$(cat /tmp/cmp.server.cpu /tmp/cmp.client.cpu |
        awk 'NF == 2 && $1 ~ /^[0-9.]+$/ { t += $1 + $2; n++ }
        END { if (n == 2) printf "%.3f", t; else print "nan" }')
    echo "$value $cpu $((iters * qps))"
}
IFS=";" read -r -a row_list <<<"$ROWS"
for row in "${row_list[@]}"; do
    IFS=: read -r test size flags <<<"$row"
    for round in $(seq "$ROUNDS"); do
        for tool in perftest stride; do
            read -r v cpu msgs <<<"$(one "$tool" "$test" "$size" "${flags:-}")"
            printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$test" "$size" "${flags:--}" "$tool" \
                "$round" "$v" "$cpu" "$msgs" >>"$RAW"
            echo "$test $size ${flags:-} $tool round $round: $v (cpu ${cpu} s, $msgs messages)"
        done
    done
done
echo "# clocksource at the end: $(cat "$clocksource")" >>"$RAW"
