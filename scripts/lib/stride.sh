# shellcheck shell=bash
# Helpers of the stride-perf end-to-end checks, sourced by scripts/e2e/stride-*.sh from the
# repository root.
# shellcheck source=peers.sh
. scripts/lib/peers.sh

dev=${RDMA_TEST_DEVICE:?RDMA_TEST_DEVICE is not set; run this through scripts/softroce run}
bin=${STRIDE_BIN:-target/debug/stride-perf}
[ -x "$bin" ] || { echo "FAILED: $bin is missing (cargo build -p stride-perf)" >&2; exit 1; }
PEER_TIMEOUT=${PEER_TIMEOUT:-60}
stride_port=${STRIDE_PORT:-18700}
failures=0

fail() {
    echo "  FAIL: $*" >&2
    failures=$((failures + 1))
}

# must_say LOG PATTERN WHAT / must_not_say LOG PATTERN WHAT: expect_in and expect_not_in
# (peers.sh), each miss counted among this script's failures.
must_say() {
    expect_in "$@" && return 0
    failures=$((failures + 1))
    return 1
}
must_not_say() {
    expect_not_in "$@" && return 0
    failures=$((failures + 1))
    return 1
}

# rows LOG KIND SIZE ITERS: the number of sane result rows in LOG: KIND bw rows have the size,
# the iteration count (or any positive count when ITERS is '+'), and a positive average and
# message rate; lat rows the size, the count, and seven positive latencies in order
# t_min <= t_typical <= t_max.
rows() {
    awk -v kind="$2" -v size="$3" -v iters="$4" '
        function pos(x) { return x ~ /^[0-9]+(\.[0-9]+)?$/ && x + 0 > 0 }
        $1 == size && (iters == "+" ? pos($2) : $2 == iters) {
            if (kind == "bw" && NF == 5 && pos($4) && pos($5)) n++
            if (kind == "lat" && NF == 9 && pos($3) && pos($4) && pos($5) && pos($6) \
                && pos($8) && pos($9) && $3 + 0 <= $5 + 0 && $5 + 0 <= $4 + 0) n++
        }
        END { print n + 0 }' "$1"
}

# stride NAME KIND SIZE ITERS WHO ARGS...: runs a server and a client with ARGS, and checks
# that the sides named in WHO ("client", "both") printed a sane row, and that no side printed
# a panic. ITERS is what the rows must show ('+': any positive count, for duration runs).
# The server runs where peers.sh puts servers (the peer host, when there are two); the client
# connects to ${host:-$SERVER_ADDR} (rdma_cm runs, -R, need the server device's address).
stride() {
    local name=$1 kind=$2 size=$3 iters=$4 who=$5
    shift 5
    stride_port=$((stride_port + 1))
    echo "$name"
    if ! run_pair "wait_tcp_listen $stride_port 30" \
        "$bin" "$@" -d "$SERVER_DEVICE" -p "$stride_port" -- \
        "$bin" "$@" -d "$dev" -p "$stride_port" "${host:-$SERVER_ADDR}"; then
        fail "$name: a side failed"
        return
    fi
    local sides=(client)
    [ "$who" = both ] && sides=(client server)
    for side in "${sides[@]}"; do
        local n
        n=$(rows "$PAIR_DIR/$side.log" "$kind" "$size" "$iters")
        [ "$n" -ge 1 ] || fail "$name: no sane $kind row for $size B x $iters on the $side"
    done
    if grep -q panicked "$PAIR_DIR"/*.log; then fail "$name: a panic"; fi
}

# expect_error NAME PATTERN CMD...: CMD must exit non-zero (not by timeout) within 30 s and
# say PATTERN.
expect_error() {
    local name=$1 pattern=$2 out rc=0
    shift 2
    out=$(timeout -k 5 30 "$@" 2>&1) || rc=$?
    if [ "$rc" -eq 0 ]; then
        fail "$name: exit status 0"
    elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        fail "$name: still running after 30 s"
    elif ! grep -qE -- "$pattern" <<<"$out"; then
        fail "$name: no message matching '$pattern' in: $out"
    elif grep -q panicked <<<"$out"; then
        fail "$name: a panic: $out"
    else
        echo "  ok: $name: $(grep -E -- "$pattern" <<<"$out" | head -1)"
    fi
}

# pair_error NAME PATTERN SERVER_ARGS -- CLIENT_ARGS: both sides must fail, in bounded time,
# and both must say PATTERN. The server runs where run_pair's would.
pair_error() {
    local name=$1 pattern=$2 server=() client=()
    shift 2
    while [ "$1" != -- ]; do server+=("$1"); shift; done
    shift
    client=("$@")
    stride_port=$((stride_port + 1))
    local dir
    dir=$(mktemp -d)
    timeout -k 5 30 "${SERVER_ON[@]}" "$bin" "${server[@]}" -d "$SERVER_DEVICE" -p "$stride_port" \
        >"$dir/server" 2>&1 &
    local pid=$! src=0 crc=0
    wait_tcp_listen "$stride_port" 30 || { fail "$name: the server never listened"; return; }
    timeout -k 5 30 "$bin" "${client[@]}" -d "$dev" -p "$stride_port" "$SERVER_ADDR" \
        >"$dir/client" 2>&1 || crc=$?
    wait "$pid" || src=$?
    for side in server client; do
        local rc=$src
        [ "$side" = client ] && rc=$crc
        if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            fail "$name: the $side exited $rc"
            show_log "$side" "$dir/$side"
        elif ! grep -qE "$pattern" "$dir/$side"; then
            fail "$name: the $side did not say '$pattern'"
            show_log "$side" "$dir/$side"
        else
            echo "  ok: $name ($side): $(grep -E "$pattern" "$dir/$side" | head -1)"
        fi
    done
    rm -rf "$dir"
}

finish() {
    if [ "$failures" -ne 0 ]; then
        echo "FAILED: $failures check(s)" >&2
        exit 1
    fi
    echo "all checks passed"
}
