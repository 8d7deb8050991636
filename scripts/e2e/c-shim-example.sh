#!/usr/bin/env bash
# The shim as a C library: rdma-mummy-sys/rdma-core-mummy's example (build/devinfo), linked
# against librdma-core-mummy.a instead of -libverbs, must list $RDMA_TEST_DEVICE with an active
# port and a GID table, and must not depend on libibverbs or librdmacm at load time.
# Runs where scripts/softroce runs commands, after `make -C rdma-mummy-sys/rdma-core-mummy`.
set -euo pipefail
cd "$(dirname "$0")/../.."

dev=${RDMA_TEST_DEVICE:?RDMA_TEST_DEVICE is not set; run this through scripts/softroce run}
example=rdma-mummy-sys/rdma-core-mummy/build/devinfo
log=$(mktemp)
trap 'rm -f "$log"' EXIT

fail() {
    echo "c-shim-example: FAILED: $*" >&2
    exit 1
}

[ -x "$example" ] || fail "$example is missing; run 'make -C rdma-mummy-sys/rdma-core-mummy' first"

echo "ldd $example"
ldd "$example" | sed 's/^/  /'
if ldd "$example" | grep -Eq 'libibverbs|librdmacm'; then
    fail "$example links libibverbs or librdmacm; the shim must replace them"
fi

echo "$example"
if ! timeout 30 "$example" >"$log" 2>&1; then
    sed 's/^/  /' "$log"
    fail "$example exited with an error"
fi
sed 's/^/  /' "$log"

# The device's block: from its hca_id line up to the next device's.
block=$(awk -v dev="$dev" '/^hca_id:/ { on = ($2 == dev) } on' "$log")
[ -n "$block" ] || fail "$dev is not listed"
# The example prints ibv_port_state_str() and the number; the text differs between rdma-core
# versions ("PORT_ACTIVE", "active"), IBV_PORT_ACTIVE (4) does not.
grep -Eq 'state:[[:space:]]+[^(]*\(4\)' <<<"$block" || fail "$dev has no active port"
grep -Eq 'GID\[ *[0-9]+\]: [0-9a-f:.]+, (IB|RoCE v1|RoCE v2)' <<<"$block" ||
    fail "$dev shows no GID table entry"
echo "c-shim-example: passed ($dev listed with an active port and its GIDs, no rdma-core in ldd)"
