#!/usr/bin/env bash
# Checks of scripts/softroce itself: exit statuses carried out of the guest, timeouts that
# kill and say so, usage errors, the environment and directory a command sees, and that a run
# from the cache needs no network. Runs on the host; each `run` boots the guest once (or runs
# on the host's own RDMA device, where the guest-only checks say they were skipped).
set -uo pipefail
cd "$(dirname "$0")/../.."
rig=scripts/softroce
passed=0
failed=0
out=$(mktemp)
trap 'rm -f "$out"' EXIT

check() {
    local name=$1 want_rc=$2 want_text=$3
    shift 3
    local rc=0 t0=$SECONDS
    "$@" >"$out" 2>&1 || rc=$?
    # The emulated guest kernel itself can crash while it boots (an oops in QEMU's software
    # CPU, not in anything checked here): the rig then exits 125, and the run proves
    # nothing either way, so it runs once more, as scripts/test does for the device run.
    if [ "$rc" -eq 125 ] && [ "$want_rc" -ne 125 ] && grep -q 'Kernel panic' "$out"; then
        echo "note: $name: the guest kernel crashed while booting; running the check again"
        rc=0
        "$@" >"$out" 2>&1 || rc=$?
    fi
    if [ "$rc" -eq "$want_rc" ] && { [ -z "$want_text" ] || grep -qE -- "$want_text" "$out"; }; then
        passed=$((passed + 1))
        echo "ok: $name ($((SECONDS - t0)) s)"
    else
        failed=$((failed + 1))
        echo "FAILED: $name: exit status $rc (wanted $want_rc), output (wanted /$want_text/):"
        sed 's/^/    /' "$out"
    fi
}

on_host=$($rig status | grep -q 'commands run on the host' && echo yes || echo no)

check "no arguments: usage, exit 2" 2 '^Usage: scripts/softroce' $rig
check "unknown command: usage, exit 2" 2 "unknown command 'frobnicate'" $rig frobnicate
check "unknown option: usage, exit 2" 2 "unknown option '--bogus'" $rig run --bogus -- true
check "run without a command: exit 2" 2 'run needs a command' $rig run --
check "bad timeout: exit 2" 2 "'soon' is not a positive whole number" $rig run -t soon -- true
check "--hosts 3: exit 2" 2 "--hosts takes 1 or 2, got '3'" $rig run --hosts 3 -- true
check "scripts/on-peer-host with no peer host: exit 2, says why" 2 \
    "RDMA_TEST_PEER_NETNS .*not set: there is no peer host here" \
    env -u RDMA_TEST_PEER_NETNS scripts/on-peer-host true
check "scripts/link with no link: exit 2, says why" 2 \
    "RDMA_TEST_NETNS is not set: there is no two-host link here" \
    env -u RDMA_TEST_NETNS scripts/link down
check "scripts/link --help" 0 '^Usage: scripts/link' scripts/link --help
check "SOFTROCE_EXTRA_PACKAGES that are not package names: exit 2, says why" 2 \
    'SOFTROCE_EXTRA_PACKAGES="valgrind;true" is not a comma-separated list' \
    env SOFTROCE_EXTRA_PACKAGES='valgrind;true' $rig status
check "scripts/loop-instructions with a row it cannot run: exit 2, says why" 2 \
    '"write_bw:64" is not TEST:SIZE' scripts/loop-instructions write_bw:64
check "scripts/loop-instructions with LONG_ITERS not above SHORT_ITERS: exit 2" 2 \
    'LONG_ITERS the larger \(got 1000 and 1000\)' env LONG_ITERS=1000 scripts/loop-instructions
check "scripts/guest-tests on its own with a bad --hosts: exit 2" 2 "guest-tests: --hosts takes 2" \
    env -u RDMA_TEST_DEVICE scripts/guest-tests --hosts 3
check "run -- false: exit 1" 1 '' $rig run -- false
check "run -- sh -c 'exit 7': exit 7" 7 '' $rig run -- sh -c 'exit 7'
check "output, environment and device reach the caller" 0 \
    '^marker 42 .+ [0-9]+ [0-9.]+$' \
    $rig run -e MARKER=42 -- sh -c \
    'echo marker "$MARKER" "$RDMA_TEST_DEVICE" "$RDMA_TEST_GID_INDEX" "${RDMA_TEST_IP:-0}"'
check "runs in the caller's directory inside the repository" 0 "^$(pwd -P)/stride\$" \
    sh -c "cd stride && ../$rig run -- pwd"
check "a command past --timeout is killed and reported: exit 124" 124 \
    "'sleep 120' ran past its timeout of 3 s and was killed" $rig run -t 3 -- sleep 120
if [ "$on_host" = yes ]; then
    echo "skipped: the guest's outer timeout and offline boot (commands run on the host's device)"
else
    check "a guest past --vm-timeout is killed and reported: exit 124" 124 \
        'the guest did not finish within 8 s and was killed' \
        $rig run -t 100 --vm-timeout 8 -- sleep 100
    if unshare -n true 2>/dev/null; then
        check "a run from the cache needs no network (in an empty network namespace)" 0 \
            '^offline ok$' unshare -n $rig run -- echo offline ok
    else
        echo "skipped: no network namespace here (unshare -n not permitted) for the offline check"
    fi
    # A caller that gives up on the rig (its own `timeout`, a kill) takes the guest with it.
    # The caller is killed once the guest runs the command (it writes "started" into the run's
    # control directory just before), not after a fixed wait; the guest must be gone 10 s on.
    check "killing the rig's caller ends its guest" 0 '^guest gone$' sh -c '
        tmp=$(mktemp -d)
        TMPDIR=$tmp '"$rig"' run -- sleep 300 &
        caller=$!
        i=0
        while [ "$i" -lt 600 ] && ! ls "$tmp"/softroce-run.*/started >/dev/null 2>&1; do
            sleep 0.1
            i=$((i + 1))
        done
        [ "$i" -lt 600 ] || echo "the guest did not start its command within 60 s"
        kill -TERM "$caller"
        wait "$caller"
        i=0
        while [ "$i" -lt 100 ] && pgrep -f "path=$tmp/softroce-run" >/dev/null; do
            sleep 0.1
            i=$((i + 1))
        done
        if pgrep -f "path=$tmp/softroce-run" >/dev/null; then
            echo "the guest still runs after its caller was killed"
            pkill -f "path=$tmp/softroce-run"
            exit 1
        fi
        rm -rf "$tmp"
        echo guest gone'
    # A guest kernel that crashes while booting (seen: int3 oopses under TCG) is booted again,
    # and only while the command has not started; with one try it is the rig's failure.
    check "a guest that dies while booting is booted again" 0 \
        'booting again \(attempt 2 of 3\)' env SOFTROCE_TEST_DIE_AT_BOOT=1 $rig run -- true
    check "a boot that keeps dying ends the run: exit 125" 125 \
        'the guest stopped \(QEMU exit status 0\) before the command finished' \
        env SOFTROCE_TEST_DIE_AT_BOOT=1 SOFTROCE_BOOT_TRIES=1 $rig run -- true
    # Without tsc=reliable the guest's clocksource watchdog, under load, trades the TSC for
    # the emulated HPET mid-run (slow clock reads, skewed timings, a live kernel patch).
    check "the guest keeps the TSC clocksource (booted with tsc=reliable)" 0 \
        '^tsc tsc=reliable$' $rig run -- sh -c \
        'echo "$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource)" \
            "$(grep -ow "tsc=reliable" /proc/cmdline)"'
fi
# Failures of the first-run steps must name the step and say what to do.
if [ "$(id -u)" -eq 0 ]; then
    fake=$(mktemp -d)
    printf '#!/bin/sh\nexit 1\n' >"$fake/dpkg-query"
    printf '#!/bin/sh\necho "E: Unable to locate package (simulated)" >&2\nexit 100\n' >"$fake/apt-get"
    chmod +x "$fake/dpkg-query" "$fake/apt-get"
    check "packages that cannot be installed: the step is named, exit 125" 125 \
        "installing packages for the SoftRoCE rig failed: .*install .*by hand" \
        env PATH="$fake:$PATH" $rig prepare
    rm -rf "$fake"
else
    echo "skipped: the failing-install check (needs root, so that no sudo resets PATH)"
fi
rootfs=$($rig status | sed -n 's/^  root filesystem: \(\/.*\)$/\1/p')
if [ -n "$rootfs" ] && [ "$on_host" = no ]; then
    # A cache with the root filesystem but no kernel, and a mirror on a closed local port.
    cache=$(mktemp -d)
    ln -s "$rootfs" "$cache/${rootfs##*/}"
    check "a kernel that cannot be downloaded: the step is named, exit 125" 125 \
        "downloading the guest kernel failed: .*check the network, or set SOFTROCE_MIRROR" \
        env SOFTROCE_CACHE="$cache" SOFTROCE_MIRROR=http://127.0.0.1:9/debian $rig prepare
    rm -rf "$cache"
else
    echo "skipped: the failed-kernel-download check (no guest root filesystem in the cache)"
fi
echo "softroce rig: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
