#!/usr/bin/env bash
# stride-perf and the clock it timestamps with:
#   1. every banner names the kernel's clocksource and what one reading costs, the JSON file
#      records it, and a fast clock (the TSC) brings no warning;
#   2. with a slow clocksource (HPET: every reading a system call and a device read) both
#      sides warn, with the cost and the clocksource, and still run;
#   3. when the kernel switches clocksource during a run (as its watchdog does when it finds
#      the TSC unstable), both sides say so at the end, and the JSON file records it.
# 2 and 3 change the kernel's clocksource, so they run only in the SoftRoCE guest (restored
# afterwards). Binary: ${STRIDE_BIN:-target/debug/stride-perf}.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${STRIDE_PORT:=19000}"
. scripts/lib/stride.sh

cs_dir=/sys/devices/system/clocksource/clocksource0
work=$(mktemp -d)
source_before=$(cat "$cs_dir/current_clocksource" 2>/dev/null)
cleanup() {
    if [ -n "$source_before" ] &&
        [ "$(cat "$cs_dir/current_clocksource" 2>/dev/null)" != "$source_before" ]; then
        echo "$source_before" >"$cs_dir/current_clocksource"
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# clock_line LOG SOURCE WHAT: LOG's banner names SOURCE and a cost in ns.
clock_line() {
    must_say "$1" "^ Clock +: $2, [0-9]+ ns per read$" "$3: a 'Clock : $2, N ns per read' line"
}

echo "the clock in the banner and the JSON file"
if [ -z "$source_before" ]; then
    fail "this kernel names no clocksource in $cs_dir"
else
    json=$work/plain.json
    stride "write bw, the clock as found" bw 65536 1000 client \
        write bw -s 65536 -n 1000 --json "$json"
    for side in client server; do
        clock_line "$PAIR_DIR/$side.log" "$source_before" "the $side's banner"
    done
    grep -qE "\"clock\": \"$source_before, [0-9]+ ns per read\"" "$json" ||
        fail "the JSON file does not record the clock ($source_before)"
    if [ "$source_before" = tsc ]; then
        for side in client server; do
            must_not_say "$PAIR_DIR/$side.log" 'warning: .*clock' \
                "a clock warning with the TSC ($side)"
        done
    fi
fi

if [ "${SOFTROCE_GUEST:-}" != 1 ]; then
    echo "  skipped: a slow clocksource and a switch mid-run (they change the kernel's" \
        "clocksource; run in the SoftRoCE guest)"
elif ! grep -qw hpet "$cs_dir/available_clocksource" || [ "$source_before" = hpet ]; then
    fail "the guest should offer the HPET beside the TSC: available" \
        "'$(cat "$cs_dir/available_clocksource")', current '$source_before'"
else
    echo "a slow clocksource (HPET)"
    echo hpet >"$cs_dir/current_clocksource"
    stride "send bw with the HPET clock" bw 4096 1000 both send bw -s 4096 -n 1000
    for side in client server; do
        must_say "$PAIR_DIR/$side.log" \
            'warning: one reading of the clock takes [0-9]+ ns here \(the kernel.s clocksource is hpet\)' \
            "the $side's slow-clock warning"
        clock_line "$PAIR_DIR/$side.log" hpet "the $side's banner"
    done
    echo "$source_before" >"$cs_dir/current_clocksource"

    echo "a clocksource switch during the run"
    stride_port=$((stride_port + 1))
    json=$work/switch.json
    timeout -k 5 60 "$bin" write bw -D 3 -d "$dev" -p "$stride_port" >"$work/server" 2>&1 &
    spid=$!
    if wait_tcp_listen "$stride_port" 30; then
        timeout -k 5 60 "$bin" write bw -D 3 -d "$dev" -p "$stride_port" --json "$json" \
            127.0.0.1 >"$work/client" 2>&1 &
        cpid=$!
        # Once both banners are out (each side measured its clock before them).
        for _ in $(seq 100); do
            grep -q '^ Clock' "$work/client" && grep -q '^ Clock' "$work/server" && break
            sleep 0.1
        done
        sleep 1
        echo hpet >"$cs_dir/current_clocksource"
        crc=0 src=0
        wait "$cpid" || crc=$?
        wait "$spid" || src=$?
        echo "$source_before" >"$cs_dir/current_clocksource"
        if [ "$crc" -ne 0 ] || [ "$src" -ne 0 ]; then
            fail "switch mid-run: client exited $crc, server $src"
            show_log server "$work/server"
            show_log client "$work/client"
        else
            for side in client server; do
                must_say "$work/$side" \
                    "warning: the kernel switched its clocksource from $source_before to hpet during the run" \
                    "the $side's switch warning" &&
                    echo "  ok: $side: $(grep -m1 'switched its clocksource' "$work/$side")"
            done
            grep -qE "\"clock\": \"$source_before, [0-9]+ ns per read; switched to hpet during the run\"" \
                "$json" || fail "switch mid-run: the JSON file does not record the switch"
            [ "$(rows "$work/client" bw 65536 +)" -ge 1 ] || fail "switch mid-run: no sane row"
        fi
    else
        fail "switch mid-run: the server never listened"
        kill "$spid" 2>/dev/null
        wait "$spid" 2>/dev/null
    fi
fi
finish
