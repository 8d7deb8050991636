#!/usr/bin/env bash
# sideway's unsafe code under a dynamic checker: Miri (nightly) over sideway's unit tests,
# which need no device (the C calls, sockets and sysfs tests are ignored under Miri, each
# saying why: #[cfg_attr(miri, ignore = "...")]). Miri checks every unsafe block those tests
# reach against Rust's aliasing and validity rules (stacked borrows), for leaks, and for
# use after free; it found the batch storages' and CmId's aliasing bugs.
#
# Where Miri cannot be had (no nightly toolchain, or rustup cannot fetch the component),
# Valgrind's memcheck runs the same tests natively instead, and the run says so: it catches
# invalid reads and writes and use after free, not aliasing.
set -euo pipefail
SCRIPT_NAME=miri
cd "$(dirname "$0")/../.."
. scripts/lib/host.sh

miri_ready() {
    rustup toolchain list 2>/dev/null | grep -q '^nightly' || return 1
    if ! cargo +nightly miri --version >/dev/null 2>&1; then
        note "adding the miri component to the nightly toolchain"
        rustup component add --toolchain nightly miri rust-src >&2 || return 1
    fi
    cargo +nightly miri setup >&2
}

if miri_ready; then
    echo "Miri: sideway's unit tests (no device)"
    cargo +nightly miri test -p sideway-rdma --lib
else
    note "Miri is not available here (no nightly toolchain, or its component could not be" \
        "fetched): running Valgrind's memcheck over the same tests instead"
    command -v valgrind >/dev/null 2>&1 || ensure_packages "checking memory" valgrind
    build_xtask || die "building xtask" "cargo build -p xtask failed (above)"
    bin=$(cargo test -p sideway-rdma --lib --locked --no-run --message-format=json 2>/dev/null |
        xtask test-binaries --executables)
    [ -x "$bin" ] || die "could not find sideway's unit-test binary"
    valgrind --error-exitcode=1 --errors-for-leak-kinds=definite --leak-check=full -q "$bin"
fi
