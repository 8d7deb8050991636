#!/usr/bin/env bash
# stride-perf's test buffers beyond plain host memory, on SoftRoCE (which has no GPU and
# cannot register GPU memory):
#   1. --use-cuda without the CUDA driver library fails at once, before any TCP connection,
#      on the server and on the client;
#   2. with the CUDA driver test double (stride/tests/support/fake_libcuda.c, "GPU memory"
#      that is really host memory): --use-cuda-dmabuf fails on both sides with the dma-buf
#      registration message (no NIC takes the double's memfd as a dma-buf, and rxe takes no
#      dma-buf at all); --use-cuda runs end to end, since rxe registers the double's host
#      memory with reg_mr: this proves the GPU buffer plumbing (alignment, the driver's copies
#      and memsets, no inline data), not GPUDirect;
#   3. --use-hugepages: refused with how to reserve huge pages when none are, then write bw,
#      send bw and write lat run in huge pages once some are reserved (restored afterwards),
#      and too few end both sides with the mmap failure;
#   4. write lat refuses GPU buffers, naming the alternatives; -I does too;
#   5. --use-cuda --staging (the data copied between the double's "GPU" and registered host
#      memory around each transfer): every verb runs, validated, and the double's copy counts
#      (FAKE_CUDA_COPY_LOG) show a cuMemcpyDtoH per message sent and a cuMemcpyHtoD per
#      message received or fetched, where plain --use-cuda makes none; --staging without
#      --use-cuda, or with --use-cuda-dmabuf, is refused. This is the plumbing, run without
#      a GPU: what staging costs on a real one is not measured here.
# Binary: ${STRIDE_BIN:-target/debug/stride-perf}. The test double: built here with cc when
# there is one, else ${STRIDE_FAKE_LIBCUDA:-target/fake-libcuda/libcuda.so.1}, which
# scripts/test builds on the host before the guest runs (the guest has no C compiler).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
: "${STRIDE_PORT:=18900}"
. scripts/lib/stride.sh
unset STRIDE_LIBCUDA

work=$(mktemp -d)
hugepages_before=$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)
cleanup() {
    echo "$hugepages_before" >/proc/sys/vm/nr_hugepages 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT

echo "no CUDA driver library"
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 '; then
    echo "  skipped: this machine has libcuda.so.1 (the NVIDIA driver is installed)"
else
    missing='the CUDA driver library libcuda\.so\.1 was not found \(.*\): install the NVIDIA driver, or run without --use-cuda'
    # The server form: it must stop before it listens (it says "waiting for a client" just
    # before it binds the port).
    stride_port=$((stride_port + 1))
    t0=$SECONDS
    rc=0
    out=$(timeout -k 5 30 "$bin" write bw --use-cuda 0 -d "$dev" -p "$stride_port" 2>&1) || rc=$?
    elapsed=$((SECONDS - t0))
    if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
        fail "server without libcuda: exit status $rc: $out"
    elif ! grep -qE -- "$missing" <<<"$out"; then
        fail "server without libcuda: no message matching '$missing' in: $out"
    elif grep -qE 'waiting for a client|panicked' <<<"$out"; then
        fail "server without libcuda: it went on to listen (or panicked): $out"
    elif [ "$elapsed" -gt 5 ]; then
        fail "server without libcuda: took $elapsed s"
    else
        echo "  ok: server without libcuda, in ${elapsed} s: $out"
    fi
    # The client form, against a plain server that must see no connection at all.
    stride_port=$((stride_port + 1))
    timeout -k 5 60 "$bin" write bw -d "$dev" -p "$stride_port" >"$work/decoy" 2>&1 &
    decoy=$!
    if wait_tcp_listen "$stride_port" 30; then
        t0=$SECONDS
        rc=0
        out=$(timeout -k 5 30 "$bin" write bw --use-cuda 0 -d "$dev" -p "$stride_port" \
            127.0.0.1 2>&1) || rc=$?
        elapsed=$((SECONDS - t0))
        sleep 1
        if [ "$rc" -eq 0 ] || [ "$rc" -ge 124 ]; then
            fail "client without libcuda: exit status $rc: $out"
        elif ! grep -qE -- "$missing" <<<"$out" || grep -q panicked <<<"$out"; then
            fail "client without libcuda: no message matching '$missing' (or a panic) in: $out"
        elif [ "$elapsed" -gt 5 ]; then
            fail "client without libcuda: took $elapsed s"
        elif ! kill -0 "$decoy" 2>/dev/null || grep -q 'error' "$work/decoy"; then
            fail "client without libcuda: the server heard from it"
            show_log server "$work/decoy"
        else
            echo "  ok: client without libcuda, in ${elapsed} s, and the server never saw it"
        fi
    else
        fail "client without libcuda: the plain server never listened"
    fi
    kill "$decoy" 2>/dev/null
    wait "$decoy" 2>/dev/null
fi

echo "write lat and inline data refuse GPU buffers"
expect_error "write lat with --use-cuda" \
    'write lat polls the last byte .* use send lat or read lat with --use-cuda, or drop --use-cuda' \
    "$bin" write lat -d "$dev" --use-cuda 0
expect_error "write lat with --use-cuda-dmabuf" 'use send lat or read lat with --use-cuda-dmabuf' \
    "$bin" write lat -d "$dev" --use-cuda-dmabuf 0
expect_error "-I with --use-cuda" 'drop -I with --use-cuda' \
    "$bin" send bw -d "$dev" --use-cuda 0 -I 64
expect_error "--use-cuda with --use-hugepages" "cannot be used with" \
    "$bin" write bw -d "$dev" --use-cuda 0 --use-hugepages
expect_error "--staging without --use-cuda" \
    'this run has no GPU buffer: add --use-cuda GPU, or drop --staging' \
    "$bin" write bw -d "$dev" --staging
expect_error "--staging with --use-cuda-dmabuf" 'use --use-cuda GPU --staging' \
    "$bin" write bw -d "$dev" --use-cuda-dmabuf 0 --staging

# staged NAME KIND SIZE ITERS WHO ARGS...: as stride(), both sides with the test double
# logging their copies (FAKE_CUDA_COPY_LOG) to $work/server.copies and $work/client.copies.
staged() {
    local name=$1 kind=$2 size=$3 iters=$4 who=$5
    shift 5
    rm -f "$work/server.copies" "$work/client.copies"
    stride_port=$((stride_port + 1))
    echo "$name"
    if ! run_pair "wait_tcp_listen $stride_port 30" \
        env FAKE_CUDA_COPY_LOG="$work/server.copies" "$bin" "$@" -d "$SERVER_DEVICE" \
        -p "$stride_port" -- \
        env FAKE_CUDA_COPY_LOG="$work/client.copies" "$bin" "$@" -d "$dev" -p "$stride_port" \
        "${host:-$SERVER_ADDR}"; then
        fail "$name: a side failed"
        return
    fi
    local sides=(client)
    [ "$who" = both ] && sides=(client server)
    for side in "${sides[@]}"; do
        [ "$(rows "$PAIR_DIR/$side.log" "$kind" "$size" "$iters")" -ge 1 ] ||
            fail "$name: no sane $kind row for $size B x $iters on the $side"
    done
    if grep -q panicked "$PAIR_DIR"/*.log; then fail "$name: a panic"; fi
}

# copies SIDE FIELD: the side's count of FIELD (dtoh_calls, dtoh_bytes, htod_calls,
# htod_bytes) as the test double logged it; empty when it logged nothing.
copies() {
    awk -v f="$2" '{ for (i = 1; i < NF; i++) if ($i == f) v = $(i + 1) } END { print v }' \
        "$work/$1.copies" 2>/dev/null
}

# at_least SIDE FIELD MIN / exactly SIDE FIELD N
at_least() {
    local v
    v=$(copies "$1" "$2")
    if [ -n "$v" ] && [ "$v" -ge "$3" ]; then
        echo "  ok: the $1 made $v $2 (at least $3)"
    else
        fail "the $1's $2: '${v:-no log line}', fewer than $3"
    fi
}
exactly() {
    local v
    v=$(copies "$1" "$2")
    if [ "$v" = "$3" ]; then
        echo "  ok: the $1 made $v $2"
    else
        fail "the $1's $2: '${v:-no log line}', not $3"
    fi
}

echo "the CUDA driver test double"
fake=${STRIDE_FAKE_LIBCUDA:-target/fake-libcuda/libcuda.so.1}
fake_src=stride/tests/support/fake_libcuda.c
have_fake=1
if command -v cc >/dev/null 2>&1; then
    mkdir -p "$(dirname "$fake")"
    if ! cc -shared -fPIC -O1 -Wall -Werror -pthread -o "$fake" "$fake_src"; then
        fail "cc could not build $fake from $fake_src"
        have_fake=0
    fi
elif [ ! -e "$fake" ] || [ "$fake" -ot "$fake_src" ]; then
    fail "no C compiler here, and no $fake newer than $fake_src: build it where there is one" \
        "(cc -shared -fPIC -pthread -o $fake $fake_src; scripts/test does)"
    have_fake=0
fi
if [ "$have_fake" -eq 1 ]; then
    fake=$(realpath "$fake")
    echo "  using $fake"
    export STRIDE_LIBCUDA=$fake
    pair_error "dma-buf registration on rxe" 'does not support dma-buf registration' \
        write bw --use-cuda-dmabuf 0 -- write bw --use-cuda-dmabuf 0
    expect_error "a GPU index out of range" 'there is no GPU 3: this machine has 1 GPU' \
        "$bin" write bw -d "$dev" --use-cuda 3
    banner='Buffers +: GPU 0 \(Fake GPU 0 \(stride test double\), PCI 0000:1b:00\.0\), GPUDirect reg_mr'
    stride "write bw, both sides in (test double) GPU memory" bw 65536 1000 client \
        write bw -s 65536 -n 1000 --use-cuda 0
    grep -qE "$banner" "$PAIR_DIR/client.log" || fail "write bw on the GPU: no '$banner' line"
    stride "send bw, GPU memory" bw 4096 1000 both send bw -s 4096 --use-cuda 0
    stride "send lat, GPU memory" lat 2 1000 both send lat --use-cuda 0
    stride "read lat, GPU memory" lat 2 1000 client read lat --use-cuda 0
    stride "read bw, GPU memory" bw 65536 1000 client read bw -s 65536 --use-cuda 0
    stride "write bw -q 3, one GPU region shared, validated" bw 65536 3000 client \
        write bw -s 65536 -n 1000 -q 3 --use-cuda 0 --data-validation
    stride "send bw -q 3 --mr-per-qp, GPU memory, validated" bw 4096 3000 both \
        send bw -s 4096 -n 1000 -q 3 --mr-per-qp --use-cuda 0 --data-validation
    # Each side chooses its own memory: the server in host memory, the client on the GPU.
    stride_port=$((stride_port + 1))
    echo "write bw, host memory server, GPU memory client"
    if run_pair "wait_tcp_listen $stride_port 30" \
        "$bin" write bw -s 65536 -n 1000 -d "$dev" -p "$stride_port" -- \
        "$bin" write bw -s 65536 -n 1000 --use-cuda 0 -d "$dev" -p "$stride_port" 127.0.0.1; then
        [ "$(rows "$PAIR_DIR/client.log" bw 65536 1000)" -ge 1 ] ||
            fail "mixed memory: no sane row on the client"
        grep -qE 'Buffers +: host' "$PAIR_DIR/server.log" || fail "mixed memory: the server's banner"
    else
        fail "mixed memory: a side failed"
    fi

    echo "--staging: the same tests with the data copied between the GPU and host memory"
    staged_banner='Buffers +: GPU 0 \(Fake GPU 0 \(stride test double\), PCI 0000:1b:00\.0\), staging through host memory'
    # Plain --use-cuda first: GPUDirect makes no copies at all.
    staged "write bw, GPUDirect (no staging)" bw 65536 1000 client write bw -s 65536 -n 1000 \
        --use-cuda 0
    exactly client dtoh_calls 0
    exactly server htod_calls 0
    staged "write bw --staging" bw 65536 1000 client write bw -s 65536 -n 1000 --use-cuda 0 \
        --staging
    grep -qE "$staged_banner" "$PAIR_DIR/client.log" || fail "write bw --staging: no '$staged_banner'"
    grep -qE "$staged_banner" "$PAIR_DIR/server.log" || fail "write bw --staging: the server's banner"
    # A copy from the GPU per message sent, 1000 of 64 KiB; and on each side the target half
    # (64 KiB), which sees no event, from the GPU before the size and to it after.
    exactly client dtoh_calls 1001
    exactly client dtoh_bytes $((1001 * 65536))
    exactly client htod_calls 1
    exactly server dtoh_calls 1
    exactly server htod_calls 1
    exactly server htod_bytes 65536
    staged "write bw -q 2 --mr-per-qp --staging, validated" bw 65536 2000 client \
        write bw -s 65536 -n 1000 -q 2 --mr-per-qp --use-cuda 0 --staging --data-validation
    staged "send bw -q 3 --staging, validated" bw 4096 3000 both send bw -s 4096 -n 1000 -q 3 \
        --use-cuda 0 --staging --data-validation
    at_least client dtoh_calls 3000
    at_least client dtoh_bytes 12288000
    # A copy to the GPU per message received.
    at_least server htod_calls 3000
    at_least server htod_bytes 12288000
    staged "read bw --staging, validated" bw 65536 1000 client read bw -s 65536 -n 1000 \
        --use-cuda 0 --staging --data-validation
    # A copy to the GPU per READ completed.
    at_least client htod_calls 1000
    at_least client htod_bytes 65536000
    at_least server dtoh_calls 1
    staged "atomic bw --staging, validated" bw 8 1000 client atomic bw -n 1000 --use-cuda 0 \
        --staging --data-validation
    at_least client htod_calls 1000
    at_least client htod_bytes 8000
    staged "send bw UD --staging" bw 1024 + client send bw -c UD -s 1024 -n 500 --use-cuda 0 \
        --staging
    at_least client dtoh_calls 500
    # write lat polls host memory: refused on the GPU, it runs staged.
    staged "write lat --staging, validated" lat 2 1000 both write lat -n 1000 --use-cuda 0 \
        --staging --data-validation
    for side in client server; do
        at_least "$side" dtoh_calls 1000
        at_least "$side" htod_calls 1000
    done
    staged "send lat --staging with inline data" lat 64 1000 both send lat -s 64 -n 1000 \
        --use-cuda 0 --staging -I 64
    for side in client server; do
        at_least "$side" dtoh_calls 1000
        at_least "$side" htod_calls 1000
    done
    unset STRIDE_LIBCUDA
fi

echo "huge pages"
if [ ! -w /proc/sys/vm/nr_hugepages ]; then
    fail "cannot set /proc/sys/vm/nr_hugepages (not root?)"
else
    echo 0 >/proc/sys/vm/nr_hugepages
    expect_error "no huge pages reserved" \
        'no huge pages are reserved .*echo N > /proc/sys/vm/nr_hugepages' \
        "$bin" write bw -d "$dev" --use-hugepages
    # One page: with --mr-per-qp a side with four QPs needs four (a 128 KiB region each,
    # one 2 MiB page); without it their four 128 KiB slices share one region (a page).
    echo 1 >/proc/sys/vm/nr_hugepages
    pair_error "too few huge pages" 'cannot map [0-9]+ bytes of huge pages .*nr_hugepages' \
        write bw -q 4 --mr-per-qp --use-hugepages -- write bw -q 4 --mr-per-qp --use-hugepages
    echo 64 >/proc/sys/vm/nr_hugepages
    reserved=$(cat /proc/sys/vm/nr_hugepages)
    if [ "$reserved" -lt 8 ]; then
        fail "only $reserved huge pages could be reserved"
    else
        json=$work/huge.json
        stride "write bw in huge pages" bw 65536 1000 client \
            write bw -s 65536 -n 1000 --use-hugepages --json "$json"
        grep -qE 'Buffers +: huge pages \([0-9]+ KiB\)' "$PAIR_DIR/client.log" ||
            fail "write bw in huge pages: no 'Buffers : huge pages' banner line"
        grep -qE '"buffer": "huge pages \([0-9]+ KiB\)"' "$json" ||
            fail "write bw in huge pages: the JSON file does not record the buffers"
        stride "send bw in huge pages" bw 65536 1000 both send bw -s 65536 --use-hugepages
        stride "write lat in huge pages" lat 2 1000 both write lat --use-hugepages
        stride "write bw -q 4 in huge pages (a mapping per QP)" bw 4096 4000 client \
            write bw -s 4096 -n 1000 -q 4 --mr-per-qp --use-hugepages --data-validation
        stride "write bw -q 4 in huge pages (one mapping shared)" bw 4096 4000 client \
            write bw -s 4096 -n 1000 -q 4 --use-hugepages --data-validation
        grep -qE 'Memory regions  : one memory region shared by 4 QPs' "$PAIR_DIR/client.log" ||
            fail "write bw -q 4 in huge pages: no shared region in the banner"
    fi
fi
finish
