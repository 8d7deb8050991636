#!/usr/bin/env bash
# stride-perf's smaller perftest options, each checked where it shows: --tclass (read back
# from the QP; in the UD address handles), --tos with -R (the traffic class rdma_cm made of it), --pin-cores and --numa-node (the CPU mask read
# back), --cpu-util (a utilization per size), --report-both (the peer's rows, and both
# directions' sum under -b), --perform-warm-up, --use-srq, --mr-per-qp (and the default of
# one memory region shared by every QP, each QP's data kept apart: validated with -q for
# every verb); bad values refused. Binary: ${STRIDE_BIN:-target/debug/stride-perf}.
# e2e-hosts: 1
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
. scripts/lib/stride.sh

echo "--tclass: the traffic class in the GRH"
stride "write bw --tclass 96" bw 4096 100 client write bw -s 4096 -n 100 --tclass 96
must_say "$PAIR_DIR/client.log" '^ Traffic class   : 96 \(--tclass 96; read back from QP 0\)' "the traffic class read back"
stride "send bw UD --tclass 32" bw 1024 + client send bw -c UD -s 1024 -n 100 --tclass 32
must_say "$PAIR_DIR/client.log" '^ Traffic class   : 32 \(--tclass; in each UD address handle\)' "the UD traffic class"

# With -R, rdma_cm builds the path: --tos becomes its traffic class.
host=$SERVER_IP stride "write bw -R --tos 96" bw 4096 100 client write bw -s 4096 -n 100 -R \
    --tos 96
must_say "$PAIR_DIR/client.log" "^ Type of service : 96 \(--tos, through rdma_cm; QP 0's traffic class reads 96\)" "the type of service read back"

echo "--pin-cores and --numa-node: the mask read back"
last=$(($(nproc) - 1))
stride "write bw --pin-cores $last" bw 4096 100 client write bw -s 4096 -n 100 --pin-cores "$last"
must_say "$PAIR_DIR/client.log" "^ CPU pinning     : cores $last \\(--pin-cores; read back\\)" "the pinned core"
if [ -r /sys/devices/system/node/node0/cpulist ]; then
    stride "write bw --numa-node 0" bw 4096 100 client write bw -s 4096 -n 100 --numa-node 0
    must_say "$PAIR_DIR/client.log" "^ CPU pinning     : cores $(cat /sys/devices/system/node/node0/cpulist) \\(--numa-node 0; read back\\)" "node 0's cores"
else
    echo "  skipped: --numa-node: this kernel shows no NUMA nodes in sysfs"
fi

echo "--cpu-util and --report-both"
stride "send bw -b --cpu-util --report-both" bw 4096 200 both send bw -s 4096 -n 200 -b \
    --cpu-util --report-both
must_say "$PAIR_DIR/client.log" '^ CPU utilization : [0-9.]+ % of all CPUs during the measured loop' "the CPU utilization"
must_say "$PAIR_DIR/client.log" "^ The server's results \\(--report-both\\):" "the peer's rows"
must_say "$PAIR_DIR/client.log" '^ Both directions : 4096 B: [0-9.]+ MiB/sec' "both directions' sum"
stride "write bw --report-both (a passive server)" bw 4096 100 client write bw -s 4096 -n 100 \
    --report-both
must_say "$PAIR_DIR/client.log" "^ The server measured nothing" "a passive peer"

echo "--perform-warm-up: one unmeasured round first"
stride "read bw -q 2 --perform-warm-up" bw 4096 200 client read bw -s 4096 -n 100 -q 2 \
    --perform-warm-up
must_say "$PAIR_DIR/client.log" '^ Warm-up         : one unmeasured round' "the warm-up line"
stride "atomic bw --perform-warm-up" bw 8 100 client atomic bw -n 100 --perform-warm-up

echo "--use-srq: one receive queue for every QP"
stride "send bw -q 4 --use-srq" bw 4096 400 both send bw -s 4096 -n 100 -q 4 --use-srq
must_say "$PAIR_DIR/server.log" '^ Receives        : one shared receive queue \(--use-srq\), [0-9]+ entries' "the shared receive queue"
stride "send bw UD -q 2 --use-srq" bw 1024 + both send bw -c UD -s 1024 -n 200 -q 2 -r 64 --use-srq
stride "send bw --use-srq, validated" bw 8192 100 both send bw -s 8192 -n 100 --use-srq \
    --data-validation
must_say "$PAIR_DIR/server.log" "Data validation : 8192 bytes checked" "validated through the SRQ"

echo "one memory region for every QP (perftest's default), or one per QP (--mr-per-qp)"
for verb in write send read; do
    json=$(mktemp)
    stride "$verb bw -q 4, one shared region, validated" bw 4096 400 client \
        $verb bw -s 4096 -n 100 -q 4 --data-validation --json "$json"
    must_say "$PAIR_DIR/client.log" '^ Memory regions  : one memory region shared by 4 QPs$' \
        "$verb bw: the shared region"
    must_say "$PAIR_DIR/client.log" "Data validation : " "$verb bw: the validation line"
    must_say "$json" '"memory_regions": "one memory region shared by 4 QPs"' \
        "$verb bw: the JSON's memory regions"
    stride "$verb bw -q 4 --mr-per-qp, validated" bw 4096 400 client \
        $verb bw -s 4096 -n 100 -q 4 --mr-per-qp --data-validation --json "$json"
    must_say "$PAIR_DIR/client.log" '^ Memory regions  : 4 memory regions, one per QP \(--mr-per-qp\)$' \
        "$verb bw: a region per QP"
    must_say "$json" '"memory_regions": "4 memory regions, one per QP \(--mr-per-qp\)"' \
        "$verb bw: the JSON's regions per QP"
    rm -f "$json"
done
stride "atomic bw -q 3, one shared region, validated" bw 8 300 client \
    atomic bw -n 100 -q 3 --data-validation
stride "atomic bw -q 3 --mr-per-qp, validated" bw 8 300 client \
    atomic bw -n 100 -q 3 --mr-per-qp --data-validation
# Each side chooses its own layout: the peer only sees an address and a key per QP.
stride_port=$((stride_port + 1))
echo "write bw -q 2: a shared region on the server, a region per QP on the client"
if run_pair "wait_tcp_listen $stride_port 30" \
    "$bin" write bw -s 4096 -n 100 -q 2 --data-validation -d "$SERVER_DEVICE" -p "$stride_port" -- \
    "$bin" write bw -s 4096 -n 100 -q 2 --mr-per-qp --data-validation -d "$dev" \
    -p "$stride_port" "${host:-$SERVER_ADDR}"; then
    must_say "$PAIR_DIR/server.log" '^ Memory regions  : one memory region shared by 2 QPs$' \
        "mixed layouts: the server's shared region"
    must_say "$PAIR_DIR/client.log" '^ Memory regions  : 2 memory regions, one per QP' \
        "mixed layouts: the client's regions"
else
    fail "mixed layouts: a side failed"
fi

echo "bad values are refused"
expect_error "--mr-per-qp of a latency test" "a latency test runs one QP" \
    "$bin" write lat --mr-per-qp
expect_error "a traffic class past 255" "--tclass" "$bin" write bw --tclass 256
expect_error "--tclass with -R" "rdma_cm builds the path" "$bin" write bw -d "$dev" -R --tclass 8
expect_error "--tos without -R" "--rdma-cm" "$bin" write bw --tos 8
expect_error "a bad core list" "--pin-cores: '1-x' in '1-x' is not a CPU number" \
    "$bin" write bw -d "$dev" --pin-cores 1-x
expect_error "a core that is not there" "cannot pin to CPUs 1000" \
    "$bin" write bw -d "$dev" --pin-cores 1000
expect_error "a NUMA node that is not there" "NUMA node 99 does not exist here" \
    "$bin" write bw -d "$dev" --numa-node 99
expect_error "a SEND warm-up" "warms up one-sided bandwidth tests" \
    "$bin" send bw -d "$dev" --perform-warm-up
expect_error "--use-srq of a WRITE test" "SEND bandwidth tests" "$bin" write bw --use-srq
expect_error "--cpu-util of a latency test" "measures bandwidth tests" \
    "$bin" send lat -d "$dev" --cpu-util
finish
