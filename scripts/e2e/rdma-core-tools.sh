#!/usr/bin/env bash
# Proof that the RDMA device works, with programs nobody here wrote: rdma-core's ibv_devinfo,
# ibv_rc_pingpong (RC over the verbs API, 1000 iterations) and rping (RDMA READ and WRITE
# over rdmacm). Runs where scripts/softroce runs commands; fails if any of them fails.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/peers.sh

dev=${RDMA_TEST_DEVICE:?RDMA_TEST_DEVICE is not set; run this through scripts/softroce run}
gid=${RDMA_TEST_GID_INDEX:-1}
ip=${RDMA_TEST_IP:?RDMA_TEST_IP is not set; rping needs the device IPv4 address}

echo "ibv_devinfo -d $dev"
timeout 30 ibv_devinfo -d "$dev" | tee /tmp/devinfo.log | sed 's/^/  /'
expect_in /tmp/devinfo.log 'state:[[:space:]]+PORT_ACTIVE' "an active port"

echo "ibv_rc_pingpong, 1000 iterations, GID index $gid"
run_pair "wait_tcp_listen 18515 30" \
    ibv_rc_pingpong -d "$dev" -g "$gid" -n 1000 -p 18515 -- \
    ibv_rc_pingpong -d "$dev" -g "$gid" -n 1000 -p 18515 127.0.0.1
expect_in "$PAIR_DIR/client.log" '^[0-9]+ bytes in .* = .*Mbit/sec' "the client's bandwidth line"
expect_in "$PAIR_DIR/client.log" '^1000 iters in' "1000 iterations on the client"
expect_in "$PAIR_DIR/server.log" '^1000 iters in' "1000 iterations on the server"

echo "rping, 3 pings over rdmacm on $ip"
run_pair "wait_cm_listen 7174 30" \
    rping -s -a "$ip" -p 7174 -C 3 -v -- \
    rping -c -a "$ip" -p 7174 -C 3 -v
for i in 0 1 2; do
    expect_in "$PAIR_DIR/client.log" "^ping data: rdma-ping-$i: " "ping $i on the client"
    expect_in "$PAIR_DIR/server.log" "^server ping data: rdma-ping-$i: " "ping $i on the server"
done
echo "rdma-core tools: all passed"
