# shellcheck shell=bash
# What trespass's end-to-end checks share (sourced by scripts/e2e/trespass-streams.sh and
# scripts/lib/trespass-faults.sh from the repository root): where servers and clients run
# (peers.sh), and the example programs.
#   dir  where cargo put trespass's examples: TRESPASS_BIN (scripts/test passes the release
#        build's target/release/examples, which moves the GiB about twice as fast in the
#        emulated guest as the debug build); default: that, else target/debug/examples
#   bin  $dir/stream_check
# shellcheck source=peers.sh
. scripts/lib/peers.sh
dir=${TRESPASS_BIN:-}
if [ -z "$dir" ]; then
    dir=target/release/examples
    [ -x "$dir/stream_check" ] || dir=target/debug/examples
fi
bin=$dir/stream_check
[ -x "$bin" ] || { echo "FAIL: no $bin (build with cargo build --release -p trespass --examples)" >&2; exit 1; }
