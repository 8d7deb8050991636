# shellcheck shell=bash
# What the device half of the tests needs from the host, which has cargo and a C compiler
# (the SoftRoCE guest has neither): sourced by scripts/test and scripts/guest-tests.

# The test binaries cargo builds, as "EXECUTABLE<TAB>PACKAGE_DIR" lines for scripts/guest-tests.
list_test_binaries() {
    local list=$1
    # Only test harnesses ("test":true): cargo also reports the binaries it builds for
    # integration tests, which are programs, not tests.
    cargo test --workspace --no-run --message-format=json 2>/dev/null |
        grep '"executable":"' | grep -E '"profile":\{[^}]*"test":true' |
        sed -E 's/.*"manifest_path":"([^"]*)\/Cargo\.toml".*"executable":"([^"]*)".*/\2\t\1/' \
            >"$list"
    [ -s "$list" ] || { echo "cargo listed no test binaries" >&2; return 1; }
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
