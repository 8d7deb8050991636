#!/usr/bin/env bash
# Our ibv_devinfo and show_gids (examples/src/bin/) on a host without an RDMA device: every way
# of running them ends in exit status 1 with "no RDMA device found" and the hint that says how
# to get one, never a panic; --help exits 0 and documents every flag; usage errors exit 2; a
# wrong RDMA_MUMMY_LIBIBVERBS is named as such.
# (With a device, scripts/e2e/examples-devinfo.sh checks them against rdma-core's tools.)
#
# EXAMPLES_BIN: where the binaries are; unset, they are built first with cargo.
set -euo pipefail
cd "$(dirname "$0")/../.."

WITH_DEVICE_CHECKS="scripts/e2e/examples-devinfo.sh"
. scripts/lib/nodevice-checks.sh
rig='scripts/softroce run'
for prog in ibv_devinfo show_gids; do
    [ -x "$bin/$prog" ] || { echo "FAILED: no $bin/$prog"; exit 1; }
    check "$prog: no device" 1 "^$prog: $no_device" "$hint" "$rig" -- "$bin/$prog"
    check "$prog -d rxe0: no device" 1 "$no_device" "$hint" -- "$bin/$prog" -d rxe0
    check "$prog -i 0: no device" 1 "$no_device" -- "$bin/$prog" -i 0
    check "$prog -i 9: no device" 1 "$no_device" -- "$bin/$prog" -i 9
    check "$prog --help" 0 '^Usage: ' '-d, --ib-dev <DEVICE>' '-i, --ib-port <PORT>' \
        '-h, --help' -- "$bin/$prog" --help
    check "$prog --bogus: usage error" 2 "unexpected argument '--bogus'" -- "$bin/$prog" --bogus
    check "$prog -i x: usage error" 2 "invalid value 'x'" -- "$bin/$prog" -i x
done
check "ibv_devinfo -l: no device" 1 "$no_device" "$hint" -- "$bin/ibv_devinfo" -l
check "ibv_devinfo -v: no device" 1 "$no_device" "$hint" -- "$bin/ibv_devinfo" -v
# RDMA_MUMMY_LIBIBVERBS naming a library that loads but is not libibverbs: said so, and
# not blamed on the kernel.
check "ibv_devinfo with RDMA_MUMMY_LIBIBVERBS=libc.so.6" 1 \
    '^ibv_devinfo: RDMA_MUMMY_LIBIBVERBS=libc\.so\.6 loaded, but it has no ibv_get_device_list: it is not libibverbs; unset it or point it at libibverbs\.so\.1$' \
    -- env RDMA_MUMMY_LIBIBVERBS=libc.so.6 "$bin/ibv_devinfo"
check "ibv_devinfo --help lists -l and -v" 0 '-l, --list' '-v, --verbose' -- \
    "$bin/ibv_devinfo" --help

echo "examples-host: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
