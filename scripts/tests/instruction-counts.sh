#!/usr/bin/env bash
# The data path's deterministic costs, in an optimised build:
# 1. benches' tests in release (`cargo test -p benches --release`): the zero-allocation
#    checks and their positive controls, and that sideway and both C baselines hand the null
#    provider the same work, with the optimiser on as in the benchmarks;
# 2. instructions per data-path operation, counted with Valgrind's callgrind for sideway and
#    for the same operation in C (verbs.h's inlines, and pointers read once), compared with
#    the committed counts (benches/instruction-counts.txt): fails when sideway's count of an
#    operation grew past the margin (2 %, at least one instruction), naming the operation and
#    by how much, or when docs/benchmarks.md's tables are not those of the committed counts.
#
# --write: measure and rewrite benches/instruction-counts.txt and the tables in
# docs/benchmarks.md instead of checking (after a wanted change, or a new rustc or cc).
# Installs Debian's valgrind when it is missing (apt-get, as scripts/test does).
set -euo pipefail
SCRIPT_NAME=instruction-counts
cd "$(dirname "$0")/../.."
# shellcheck source=../lib/host.sh
. scripts/lib/host.sh

mode=check
case "${1:-}" in
    "") ;;
    --write) mode=write ;;
    *) echo "usage: $0 [--write]" >&2; exit 2 ;;
esac

command -v valgrind >/dev/null 2>&1 || ensure_packages "counting instructions" valgrind

if [ "$mode" = check ]; then
    cargo test -p benches --release --locked
fi
cargo build -p benches --release --locked --bin instruction-counts
target/release/instruction-counts "$mode"
