# shellcheck shell=bash
# The frame of the host-side checks of the example programs (scripts/tests/*-host.sh) on a
# machine without an RDMA device: skips (saying where the programs are checked instead) when
# the host has a device, finds or builds the binaries, and defines `check` and the expected
# no-device message. The sourcing script sets WITH_DEVICE_CHECKS first (the e2e scripts that
# check the programs where a device is) and prints its summary line at the end.
#
# EXAMPLES_BIN: where the binaries are; unset, they are built first with cargo.

if compgen -G '/sys/class/infiniband/*' >/dev/null; then
    echo "skipped: this host has RDMA devices ($(ls /sys/class/infiniband | tr '\n' ' ')); " \
        "${WITH_DEVICE_CHECKS:?} check the programs there"
    exit 0
fi

if [ -n "${EXAMPLES_BIN:-}" ]; then
    bin=$EXAMPLES_BIN
else
    cargo build --quiet -p sideway-examples --bins
    bin=${CARGO_TARGET_DIR:-target}/debug
fi

out=$(mktemp)
trap 'rm -f "$out"' EXIT
passed=0
failed=0

# check NAME WANT_RC PATTERN... -- CMD...: CMD must exit WANT_RC within 30 s, print every
# PATTERN (extended regular expressions, stdout and stderr together) and never panic.
check() {
    local name=$1 want_rc=$2 patterns=() rc=0 why=""
    shift 2
    while [ "$1" != -- ]; do patterns+=("$1"); shift; done
    shift
    timeout 30 "$@" >"$out" 2>&1 || rc=$?
    [ "$rc" -eq "$want_rc" ] || why="exit status $rc, wanted $want_rc"
    grep -q panicked "$out" && why="it panicked"
    local p
    for p in "${patterns[@]}"; do
        grep -qE -- "$p" "$out" || why="${why:+$why; }no /$p/ in the output"
    done
    if [ -z "$why" ]; then
        passed=$((passed + 1))
        echo "ok: $name"
    else
        failed=$((failed + 1))
        echo "FAILED: $name: $why; the output:"
        sed 's/^/    /' "$out"
    fi
}

no_device='no RDMA device found'
hint='rdma link add .* type rxe'
