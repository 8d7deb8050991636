#!/usr/bin/env bash
# trespass-preload across the two-host rig: the C ping-pong program with the library on both
# hosts (server on the peer host), beside TCP and librspreload, checked and its numbers printed
# (trespass-preload/tests/real_programs.rs, pingpong_across_two_hosts; the one-host programs run
# in the device pass).
# e2e-hosts: 2
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
if [ "${RDMA_TEST_HOSTS:-1}" != 2 ]; then
    echo "skipped: two-host checks need 'scripts/softroce run --hosts 2'"
    exit 0
fi
# The newest build of the test binary (cargo test --workspace --no-run builds it).
bin=$(ls -t target/debug/deps/real_programs-* 2>/dev/null | grep -v '\.d$' | head -n 1)
[ -x "$bin" ] || { echo "FAILED: no real_programs test binary (cargo test -p trespass-preload --no-run)" >&2; exit 1; }
exec timeout -k 5 300 "$bin" --exact pingpong_across_two_hosts --nocapture --test-threads 1
