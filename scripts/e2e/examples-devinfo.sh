#!/usr/bin/env bash
# Our ibv_devinfo and show_gids (examples/src/bin/) against the RDMA device and against
# rdma-core's own ibv_devinfo: the fields that matter must carry the same values, show_gids must
# list the device's IPv4 RoCE v2 GID where the rig put it, and bad input must end in a clear
# error with exit status 1, never a panic. Runs where scripts/softroce runs commands.
#
# EXAMPLES_BIN: where the binaries are (default target/debug, what `cargo build --workspace`
# makes).
set -euo pipefail
cd "$(dirname "$0")/../.."

dev=${RDMA_TEST_DEVICE:?RDMA_TEST_DEVICE is not set; run this through scripts/softroce run}
gid_index=${RDMA_TEST_GID_INDEX:?RDMA_TEST_GID_INDEX is not set; run this through scripts/softroce run}
ip=${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}
bin=${EXAMPLES_BIN:-target/debug}
for b in ibv_devinfo show_gids; do
    [ -x "$bin/$b" ] || { echo "FAIL: no $bin/$b; build it with cargo build --workspace" >&2; exit 1; }
done
command -v ibv_devinfo >/dev/null || { echo "FAIL: rdma-core's ibv_devinfo is not installed" >&2; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() {
    echo "  FAIL: $*" >&2
    failures=$((failures + 1))
}

# run_ok NAME CMD...: runs CMD into $tmp/NAME.out (stdout) and $tmp/NAME.err; fails unless it
# exits 0 without a panic.
run_ok() {
    local name=$1 rc=0
    shift
    timeout 30 "$@" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
    if [ "$rc" -ne 0 ] || grep -q panicked "$tmp/$name.out" "$tmp/$name.err"; then
        fail "'$*' exited $rc:"
        sed 's/^/    /' "$tmp/$name.err" >&2
        return 1
    fi
}

# field_values FILE LABEL: every value of "LABEL:" in an ibv_devinfo output, one a line.
field_values() {
    awk -v label="$2:" '{ sub(/^[ \t]+/, "") } index($0, label) == 1 {
        v = substr($0, length(label) + 1); sub(/^[ \t]+/, "", v); print v }' "$1"
}

echo "ibv_devinfo -d $dev -v: ours against rdma-core's"
run_ok ours "$bin/ibv_devinfo" -d "$dev" -v
run_ok theirs ibv_devinfo -d "$dev" -v
sed 's/^/  /' "$tmp/ours.out"
compared=0
for f in hca_id transport fw_ver node_guid sys_image_guid vendor_id vendor_part_id hw_ver \
    phys_port_cnt max_mr_size page_size_cap max_qp max_qp_wr device_cap_flags max_sge \
    max_cq max_cqe max_mr max_pd atomic_cap max_srq max_pkeys local_ca_ack_delay \
    num_comp_vectors port state max_mtu active_mtu sm_lid port_lid port_lmc link_layer \
    max_msg_sz port_cap_flags max_vl_num pkey_tbl_len gid_tbl_len active_width \
    active_speed phys_state; do
    want=$(field_values "$tmp/theirs.out" "$f")
    got=$(field_values "$tmp/ours.out" "$f")
    if [ -z "$want" ]; then
        fail "rdma-core's ibv_devinfo printed no $f; is this the output format the check knows?"
    elif [ "$got" != "$want" ]; then
        fail "$f differs: ours '${got//$'\n'/ | }', rdma-core's '${want//$'\n'/ | }'"
    else
        compared=$((compared + 1))
    fi
done
grep -E '^[[:space:]]+GID\[' "$tmp/theirs.out" | tr -s '\t ' ' ' >"$tmp/theirs.gids" || true
grep -E '^[[:space:]]+GID\[' "$tmp/ours.out" | tr -s '\t ' ' ' >"$tmp/ours.gids" || true
if [ ! -s "$tmp/theirs.gids" ]; then
    fail "rdma-core's ibv_devinfo -v listed no GID"
elif ! diff "$tmp/theirs.gids" "$tmp/ours.gids" >"$tmp/gids.diff"; then
    fail "the GID lines differ (< rdma-core's, > ours):"
    sed 's/^/    /' "$tmp/gids.diff" >&2
else
    compared=$((compared + $(wc -l <"$tmp/theirs.gids")))
fi
echo "  $compared fields and GID lines have rdma-core's values"
# The rest of the layout is informative: rdma-core versions differ in what else they print.
if ! diff "$tmp/theirs.out" "$tmp/ours.out" >"$tmp/all.diff"; then
    echo "  note: other differences from rdma-core's output (< theirs, > ours):"
    sed 's/^/    /' "$tmp/all.diff"
fi

echo "ibv_devinfo -l and -d $dev -i 1 (no -v)"
run_ok list "$bin/ibv_devinfo" -l
run_ok list_theirs ibv_devinfo -l
diff "$tmp/list_theirs.out" "$tmp/list.out" >/dev/null ||
    fail "ibv_devinfo -l differs: ours '$(cat "$tmp/list.out")', rdma-core's '$(cat "$tmp/list_theirs.out")'"
run_ok port1 "$bin/ibv_devinfo" -d "$dev" -i 1
run_ok port1_theirs ibv_devinfo -d "$dev" -i 1
diff "$tmp/port1_theirs.out" "$tmp/port1.out" >"$tmp/port1.diff" || {
    fail "ibv_devinfo -d $dev -i 1 differs from rdma-core's (< theirs, > ours):"
    sed 's/^/    /' "$tmp/port1.diff" >&2
}

echo "show_gids"
run_ok gids "$bin/show_gids"
sed 's/^/  /' "$tmp/gids.out"
IFS=. read -r a b c d <<<"$ip"
ip_gid=$(printf '0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x' "$a" "$b" "$c" "$d")
awk -v dev="$dev" -v idx="$gid_index" -v gid="$ip_gid" -v ip="$ip" \
    '$1 == dev && $3 == idx && $4 == gid && $5 == ip && $6 == "v2"' "$tmp/gids.out" | grep -q . ||
    fail "show_gids has no row '$dev <port> $gid_index $ip_gid $ip v2'"
n=$(sed -n 's/^n_gids_found=\([0-9][0-9]*\)$/\1/p' "$tmp/gids.out")
rows=$(awk -v dev="$dev" '$1 == dev' "$tmp/gids.out" | wc -l)
if [ -z "$n" ]; then
    fail "show_gids printed no n_gids_found=N line"
elif [ "$n" -lt 2 ]; then
    fail "show_gids found $n GIDs, expected at least 2 (link-local and $ip)"
elif [ "$n" -ne "$rows" ]; then
    fail "n_gids_found=$n but show_gids printed $rows rows for $dev"
fi
# With one device, show_gids and rdma-core's ibv_devinfo -v must count the same GIDs.
if [ "$(grep -c . "$tmp/list_theirs.out")" -eq 2 ] && [ -n "$n" ] &&
    [ "$n" -ne "$(wc -l <"$tmp/theirs.gids")" ]; then
    fail "show_gids found $n GIDs, rdma-core's ibv_devinfo -v lists $(wc -l <"$tmp/theirs.gids")"
fi
run_ok gids_dev "$bin/show_gids" -d "$dev" -i 1
grep -q "^n_gids_found=$n\$" "$tmp/gids_dev.out" ||
    fail "show_gids -d $dev -i 1 did not find the same $n GIDs"

# expect_error NAME PATTERN CMD...: CMD must exit 1 with PATTERN in its stderr and no panic.
expect_error() {
    local name=$1 pattern=$2 rc=0
    shift 2
    timeout 30 "$@" >"$tmp/err.out" 2>&1 || rc=$?
    if grep -q panicked "$tmp/err.out"; then
        fail "$name: '$*' panicked: $(cat "$tmp/err.out")"
    elif [ "$rc" -ne 1 ]; then
        fail "$name: '$*' exited $rc, expected 1: $(cat "$tmp/err.out")"
    elif ! grep -qE -- "$pattern" "$tmp/err.out"; then
        fail "$name: '$*' said '$(cat "$tmp/err.out")', expected /$pattern/"
    else
        echo "  ok: $name: $(head -1 "$tmp/err.out")"
    fi
}

echo "bad input"
for prog in ibv_devinfo show_gids; do
    expect_error "$prog, unknown device" "no RDMA device named \"nosuchdev\"; available: .*\\b$dev\\b" \
        "$bin/$prog" -d nosuchdev
    expect_error "$prog, port 0" "$dev has no port 0" "$bin/$prog" -d "$dev" -i 0
    expect_error "$prog, port 9" "$dev has no port 9" "$bin/$prog" -d "$dev" -i 9
done
expect_error "ibv_devinfo -v, port 9, every device" "has no port 9" "$bin/ibv_devinfo" -v -i 9

echo "output that cannot be written"
# A reader that is gone before the first line (| true after a pause): quiet exit 0.
rc=0
{ sleep 0.3; "$bin/ibv_devinfo" -v 2>"$tmp/pipe.err"; } | true || rc=$?
if [ "$rc" -ne 0 ] || [ -s "$tmp/pipe.err" ]; then
    fail "ibv_devinfo -v into a closed pipe: exit status $rc, stderr '$(cat "$tmp/pipe.err")'"
fi
# A full disk: a clear error, exit 1.
if [ -w /dev/full ]; then
    for prog in ibv_devinfo show_gids; do
        rc=0
        "$bin/$prog" >/dev/full 2>"$tmp/full.err" || rc=$?
        if [ "$rc" -ne 1 ] || grep -q panicked "$tmp/full.err" ||
            ! grep -q "failed to write the output" "$tmp/full.err"; then
            fail "$prog >/dev/full: exit status $rc, stderr '$(cat "$tmp/full.err")'"
        fi
    done
fi

if [ "$failures" -ne 0 ]; then
    echo "examples-devinfo: $failures checks failed" >&2
    exit 1
fi
echo "examples-devinfo: all passed"
