# shellcheck shell=bash
# What a device offers of on-demand paging and completion timestamps, read from rdma-core's
# own `ibv_devinfo -v` (not from our programs, which are under test), and how to check that
# our ping-pong and rdma-core's end alike where the device lacks a feature. Sourced by
# scripts/e2e/rc-pingpong-interop.sh and scripts/e2e/pingpong-interop.sh, after peers.sh.

# device_features DEVICE: sets HAS_ODP_RC (general ODP_SUPPORT, and RC SEND and RECV),
# HAS_ODP_SRQ (ODP_SUPPORT, RC SEND and SRQ), HAS_IMPLICIT_ODP (ODP_SUPPORT_IMPLICIT) and
# HAS_TIMESTAMPS (a completion timestamp mask) to 1 or 0, and prints them.
device_features() {
    local info general rc
    info=$(ibv_devinfo -v -d "$1") || { echo "FAILED: ibv_devinfo -v -d $1" >&2; return 1; }
    # The flag lines under "general_odp_caps:" and "rc_odp_caps:", up to the next field.
    general=$(awk '/^\tgeneral_odp_caps:/ {f = 1; next} /^\t[a-z_]+:/ {f = 0} f' <<<"$info")
    rc=$(awk '/^\trc_odp_caps:/ {f = 1; next} /^\t[a-z_]+:/ {f = 0} f' <<<"$info")
    HAS_ODP_RC=0 HAS_ODP_SRQ=0 HAS_IMPLICIT_ODP=0 HAS_TIMESTAMPS=0
    if grep -qw ODP_SUPPORT <<<"$general"; then
        grep -qw SUPPORT_SEND <<<"$rc" && grep -qw SUPPORT_RECV <<<"$rc" && HAS_ODP_RC=1
        grep -qw SUPPORT_SEND <<<"$rc" && grep -qw SUPPORT_SRQ <<<"$rc" && HAS_ODP_SRQ=1
        grep -qw ODP_SUPPORT_IMPLICIT <<<"$general" && HAS_IMPLICIT_ODP=1
    fi
    # rdma-core prints "completion timestamp_mask:" with the mask, or this line without one.
    grep -q 'completion_timestamp_mask not supported' <<<"$info" || HAS_TIMESTAMPS=1
    echo "$1 (rdma-core's ibv_devinfo -v): ODP for RC send/recv $HAS_ODP_RC, for SRQ" \
        "$HAS_ODP_SRQ, implicit ODP $HAS_IMPLICIT_ODP, completion timestamps $HAS_TIMESTAMPS"
}

# same_end MESSAGE OURS... -- THEIRS...: runs each program alone (as a server: it must stop
# before waiting for a peer) and checks that both exit 1 with MESSAGE on stderr, as rdma-core
# words it (ours prefixes its name).
same_end() {
    local message=$1
    shift
    local ours_cmd=()
    while [ "$1" != -- ]; do ours_cmd+=("$1"); shift; done
    shift
    ends_with "$message" "${ours_cmd[@]}" && ends_with "$message" "$@" &&
        echo "  ok: both end with exit 1 and \"$message\""
}

# ends_with MESSAGE CMD...: runs CMD and checks that it exits 1 with MESSAGE on stderr.
ends_with() {
    local message=$1 out rc=0
    shift
    out=$(timeout -k 5 30 "$@" 2>&1 >/dev/null) || rc=$?
    if [ "$rc" -ne 1 ] || ! grep -qF -- "$message" <<<"$out"; then
        echo "  FAIL: $*: exit $rc (expected 1) and '$out' (expected '$message')" >&2
        return 1
    fi
}
