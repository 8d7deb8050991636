# shellcheck shell=bash
# What the device half of the tests needs from the host, which has cargo and a C compiler
# (the SoftRoCE guest has neither): sourced by scripts/test and scripts/guest-tests.

# The test binaries cargo builds, as "EXECUTABLE<TAB>PACKAGE_DIR" lines for scripts/guest-tests:
# the test harnesses among cargo's JSON messages (xtask test-binaries), not the programs cargo
# builds for integration tests to run. Needs scripts/lib/host.sh.
list_test_binaries() {
    local list=$1
    build_xtask || return 1
    cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
        xtask test-binaries >"$list" || return 1
    echo "$(wc -l <"$list") test binaries"
}

# The CUDA driver test double for the stride tests that load a libcuda.so.1
# (scripts/e2e/stride-gpu.sh, cuda_loader, buffer_device), built on the host: the guest has no
# C compiler.
build_fake_libcuda() {
    mkdir -p target/fake-libcuda &&
        cc -shared -fPIC -O1 -Wall -Werror -pthread -o target/fake-libcuda/libcuda.so.1 \
            stride/tests/support/fake_libcuda.c
}
