#!/usr/bin/env bash
# Our rping and cmtime (examples/src/bin/) on a host without an RDMA device: every way of
# running them ends in exit status 1 with "no RDMA device found" and the hint that says how to
# get one, never a panic or a hang; --help exits 0 and documents every flag; usage errors exit
# 2. (With a device, scripts/e2e/rping-interop.sh and cmtime-interop.sh run them against
# rdma-core's programs.)
#
# EXAMPLES_BIN: where the binaries are; unset, they are built first with cargo.
set -euo pipefail
cd "$(dirname "$0")/../.."

WITH_DEVICE_CHECKS="scripts/e2e/rping-interop.sh and cmtime-interop.sh"
. scripts/lib/nodevice-checks.sh
for prog in rping cmtime; do
    [ -x "$bin/$prog" ] || { echo "FAILED: no $bin/$prog"; exit 1; }
done

check "rping -s: no device" 1 "^rping: $no_device" "$hint" -- "$bin/rping" -s
check "rping -c: no device" 1 "^rping: $no_device" "$hint" -- \
    "$bin/rping" -c -a 127.0.0.1 -C 1 -v
check "rping --help" 0 '^Usage: ' '-s, --server' '-c, --client' '-a, --addr <ADDRESS>' \
    '-I, --src-addr <ADDRESS>' '-p, --port <PORT>' '-C, --count <COUNT>' '-S, --size <SIZE>' \
    '-v, --verbose' '-V, --validate' '-d, --debug' '-P, --persistent' '--timeout <SECONDS>' \
    '7174' -- "$bin/rping" --help
check "rping without -s or -c: usage error" 2 'required arguments were not provided' -- \
    "$bin/rping" -a 127.0.0.1
check "rping -s -c: usage error" 2 'cannot be used with' -- "$bin/rping" -s -c
check "rping -S 22: usage error" 2 "invalid value '22'.*23\.\.=65536" -- "$bin/rping" -c -S 22
check "rping -S 65537: usage error" 2 "invalid value '65537'" -- "$bin/rping" -c -S 65537

check "cmtime (server): no device" 1 "^cmtime: $no_device" "$hint" -- "$bin/cmtime"
check "cmtime -s: no device" 1 "^cmtime: $no_device" "$hint" -- \
    "$bin/cmtime" -s 127.0.0.1 -c 2
check "cmtime --help" 0 '^Usage: ' '-s, --server <ADDRESS>' '-b, --bind <ADDRESS>' \
    '-c, --connections' '-p, --port <PORT>' '-q, --base-qpn <QPN>' '-r, --retries' \
    '-t, --timeout <MS>' '7471' -- "$bin/cmtime" --help
check "cmtime -c 0: usage error" 2 "invalid value '0'" -- "$bin/cmtime" -c 0
check "cmtime --bogus: usage error" 2 "unexpected argument '--bogus'" -- "$bin/cmtime" --bogus

echo "rdmacm-examples-host: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
