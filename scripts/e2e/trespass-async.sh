#!/usr/bin/env bash
# trespass's tokio front end measured beside its blocking API and TCP
# (trespass/examples/async_bench.rs): one short round of every pair (blocking, tokio
# multi-thread, tokio per-core; TCP on both runtimes), each against a fresh server process.
# A failed connection or a run without a round trip fails the program; the table it prints
# is checked for its five rows. The committed numbers (docs/trespass-async.md) come from
# `async_bench compare` with its defaults (three rounds).
# e2e-hosts: 1
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}"
# shellcheck source=../lib/trespass.sh
. scripts/lib/trespass.sh
out=$(timeout -k 5 180 "$dir/async_bench" compare "$RDMA_TEST_IP" --rounds 1 --secs 1 2>&1)
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: async_bench compare exited with status $rc"; exit 1; }
rows=$(grep -cE '^(trespass|tcp)	' <<<"$out")
[ "$rows" -eq 5 ] || { echo "FAIL: async_bench printed $rows result rows, not 5"; exit 1; }
echo "ok: async_bench compare: 5 rows"
