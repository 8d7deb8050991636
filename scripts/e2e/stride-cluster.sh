#!/usr/bin/env bash
# stride-perf --cluster: four ranks on the one device, started by Open MPI's mpirun and by
# this script with Slurm's variables (SLURM_PROCID, SLURM_NTASKS, SLURM_NODELIST) set by hand;
# on two hosts (`scripts/softroce run --hosts 2`), ranks 0-1 here and 2-3 on the peer host,
# with Slurm's variables and --rendezvous, then under mpirun (its daemon on the peer host
# started through scripts/on-peer-host as the launch agent).
# Each run must exit 0 on every rank, and rank 0's report must hold a row for every pair of
# the pattern, the pair matrix and the slowest pairs; its JSON every pair, its heatmap a cell
# per pair. Then the failures: a rank killed mid-run ends every other rank within the bound,
# each naming the dead rank; a rank that never comes ends the others, naming it; --cluster
# without a launcher says which variables it looked for.
# Binary: ${STRIDE_BIN:-target/debug/stride-perf}. mpirun comes from the guest image's
# openmpi-bin.
# e2e-hosts: 1 2
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/stride.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ranks=4
# Keep the artifacts of the mpirun pairs run (docs/cluster.md is made from them).
keep=${STRIDE_CLUSTER_KEEP:-}

if ! command -v mpirun >/dev/null; then
    if [ "$(cat /etc/hostname 2>/dev/null)" = softroce ]; then
        echo "FAILED: mpirun is missing from the SoftRoCE guest (its image lists openmpi-bin;" \
            "rebuild it: scripts/softroce prepare)" >&2
        exit 1
    fi
    echo "skipped: mpirun not found (install Open MPI, Debian's openmpi-bin)"
    exit 0
fi
# As root (the guest) Open MPI wants both; two vCPUs run four ranks oversubscribed.
mpi=(mpirun --allow-run-as-root --oversubscribe -np "$ranks")

# report_ok NAME LOG JSON KIND SIZE PAIRS: rank 0's LOG has PAIRS sane KIND rows of SIZE
# bytes (one per pair), the matrix and the slowest pairs; JSON holds PAIRS pairs.
report_ok() {
    local name=$1 log=$2 json=$3 kind=$4 size=$5 pairs=$6 n
    # A pair's row is its "a -> b" and then the pair run's own columns.
    n=$(awk '$2 == "->" { $1 = ""; $2 = ""; $3 = ""; print }' "$log" |
        { cat >"$work/rows"; rows "$work/rows" "$kind" "$size" +; })
    [ "$n" -eq "$pairs" ] || fail "$name: $n sane $kind rows of $size B, want $pairs"
    must_say "$log" "Pair matrix: .* at $size B" "$name (matrix)"
    must_say "$log" "slowest .*pairs \([0-9]+ flagged\)" "$name (slowest pairs)"
    n=$(grep -c '"client_side"' "$json" 2>/dev/null || true)
    [ "${n:-0}" -eq "$pairs" ] || fail "$name: the JSON holds ${n:-0} pairs, want $pairs"
    if grep -q panicked "$log"; then fail "$name: a panic"; fi
    echo "  ok: $name: $pairs pairs in the table and the JSON"
}

# cluster_mpirun NAME KIND SIZE PAIRS ARGS...: mpirun of 4 ranks with ARGS; must succeed.
cluster_mpirun() {
    local name=$1 kind=$2 size=$3 pairs=$4 rc=0
    shift 4
    stride_port=$((stride_port + 1))
    echo "$name"
    timeout -k 5 300 "${mpi[@]}" "$bin" "$@" --cluster -d "$dev" -p "$stride_port" \
        --json "$work/run.json" --heatmap "$work/run.svg" >"$work/run.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "$name: mpirun exited $rc"
        show_log "mpirun" "$work/run.log"
        return
    fi
    report_ok "$name" "$work/run.log" "$work/run.json" "$kind" "$size" "$pairs"
    local cells
    cells=$(grep -c '<rect x=' "$work/run.svg" 2>/dev/null || true)
    # A cell per ordered pair of ranks, the diagonal too, and the legend's 10 steps.
    [ "${cells:-0}" -eq $((ranks * ranks + 10)) ] || fail "$name: the heatmap has ${cells:-0} rects"
}

# slurm_ranks DIR N ARGS...: starts the first N of 4 ranks as srun would (Slurm's variables,
# one node named softroce, the guest's own name), each with ARGS, logs in DIR/rank-R; the
# PIDs (of their `timeout`) in PIDS. On two hosts, ranks 2 and 3 run on the peer host, and
# every rank finds rank 0 through --rendezvous at this host's address.
slurm_ranks() {
    local dir=$1 n=$2 r on dev_r extra=()
    shift 2
    PIDS=()
    [ "$two_hosts" = 1 ] && extra=(--rendezvous "$RDMA_TEST_IP:$stride_port")
    for r in $(seq 0 $((n - 1))); do
        on=() dev_r=$dev
        if [ "$two_hosts" = 1 ] && [ "$r" -ge 2 ]; then
            on=("${SERVER_ON[@]}") dev_r=$SERVER_DEVICE
        fi
        "${on[@]}" env SLURM_PROCID="$r" SLURM_NTASKS="$ranks" SLURM_NODELIST=softroce \
            SLURM_JOB_NUM_NODES=1 timeout -k 5 300 "$bin" "$@" --cluster -d "$dev_r" \
            -p "$stride_port" "${extra[@]}" >"$dir/rank-$r" 2>&1 &
        PIDS+=($!)
    done
}

# wait_ranks NAME: every rank of PIDS must exit 0; rank 0's log must hold the report.
wait_ranks() {
    local name=$1 pid rc rcs=()
    for pid in "${PIDS[@]}"; do rc=0; wait "$pid" || rc=$?; rcs+=("$rc"); done
    if [ "${rcs[*]}" != "0 0 0 0" ]; then
        fail "$name: exit statuses ${rcs[*]}"
        for r in $(seq 0 $((ranks - 1))); do show_log "rank $r" "$work/rank-$r"; done
        return 1
    fi
}

# kill_rank VICTIM: 4 ranks with Slurm's variables, every pair in turn for 4 s each; rank
# VICTIM is killed (SIGKILL) once everyone registered. Every other rank must end within 30 s
# (the bound is 10 s; a dead rank's closed connection is seen at once), exit non-zero and
# name the dead rank with its host and process id.
kill_rank() {
    local victim=$1 t0 t_kill victim_pid pid rc r
    stride_port=$((stride_port + 1))
    slurm_ranks "$work" 4 write bw -s 4096 -D 4 --pattern pairs --cluster-timeout 10
    t0=$SECONDS
    while ! grep -q "ranks registered" "$work/rank-0" 2>/dev/null &&
        [ $((SECONDS - t0)) -lt 60 ]; do
        sleep 0.2
    done
    sleep 1
    # PIDS holds the ranks' `timeout`; the rank is its child.
    victim_pid=$(pgrep -P "${PIDS[$victim]}" -x stride-perf || true)
    [ -n "$victim_pid" ] || victim_pid=${PIDS[$victim]}
    kill -9 "$victim_pid"
    t_kill=$SECONDS
    for r in 0 1 2 3; do
        [ "$r" = "$victim" ] && continue
        pid=${PIDS[$r]}
        while kill -0 "$pid" 2>/dev/null && [ $((SECONDS - t_kill)) -lt 30 ]; do sleep 0.1; done
        rc=0
        if kill -0 "$pid" 2>/dev/null; then
            fail "rank $r still runs 30 s after rank $victim was killed"
            kill -9 "$pid"
            wait "$pid" 2>/dev/null
            continue
        fi
        wait "$pid" || rc=$?
        if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            fail "rank $r: exit status $rc after rank $victim died"
            show_log "rank $r" "$work/rank-$r"
        elif ! must_say "$work/rank-$r" \
            "rank $victim \(host softroce, pid $victim_pid\) closed the connection" \
            "rank $r names the dead rank"; then
            show_log "rank $r" "$work/rank-$r"
        else
            echo "  ok: rank $r ended (exit $rc) $((SECONDS - t_kill)) s after the kill"
        fi
    done
    wait "${PIDS[$victim]}" 2>/dev/null
}

two_hosts=0
if [ "${RDMA_TEST_HOSTS:-1}" = 2 ]; then
    two_hosts=1
    echo "two hosts, Slurm's variables: write bw, every pair in turn"
    stride_port=$((stride_port + 1))
    slurm_ranks "$work" 4 write bw -s 65536 -n 300 --pattern pairs --json "$work/two.json"
    if wait_ranks "two hosts"; then
        report_ok "two hosts: write bw, pairs" "$work/rank-0" "$work/two.json" bw 65536 12
        for ip in "$RDMA_TEST_IP" "$SERVER_IP"; do
            must_say "$work/rank-0" "softroce +[0-9]+ +$ip:" "two hosts: a rank at $ip"
        done
        [ -n "$keep" ] && mkdir -p "$keep" && cp "$work/rank-0" "$keep/two-hosts.log"
    fi
    echo "two hosts, Slurm's variables: send bw, all-to-all"
    stride_port=$((stride_port + 1))
    slurm_ranks "$work" 4 send bw -s 4096 -n 200 --pattern all-to-all --json "$work/two.json"
    if wait_ranks "two hosts"; then
        report_ok "two hosts: send bw, all-to-all" "$work/rank-0" "$work/two.json" bw 4096 12
    fi
    echo "two hosts, mpirun: write lat, every pair in turn"
    # Open MPI starts its daemon on the peer host through a launch agent (ssh's place):
    # "AGENT HOST COMMAND" runs COMMAND there, under a host name of its own (the rig's two
    # hosts share the guest's, and Open MPI would take them for one node).
    agent=$work/peer-agent
    cat >"$agent" <<EOF
#!/bin/sh
shift
exec $PWD/scripts/on-peer-host unshare --uts /bin/sh -c \
    "echo softroce-b >/proc/sys/kernel/hostname; \$*"
EOF
    chmod +x "$agent"
    stride_port=$((stride_port + 1))
    # Each rank runs on its own host's device (on-peer-host swapped RDMA_TEST_DEVICE there).
    rc=0
    # shellcheck disable=SC2016 # expanded by the rank's own shell, on its host
    timeout -k 5 300 mpirun --allow-run-as-root --prtemca plm_ssh_agent "$agent" \
        --host "softroce:2,$SERVER_IP:2" -np 4 \
        sh -c 'exec "$0" "$@" -d "$RDMA_TEST_DEVICE"' "$bin" write lat -n 200 --pattern pairs \
        --cluster -p "$stride_port" --rendezvous "$RDMA_TEST_IP:$stride_port" \
        --json "$work/mpi2.json" --heatmap "$work/mpi2.svg" >"$work/mpi2.log" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        fail "two hosts, mpirun: exited $rc"
        show_log mpirun "$work/mpi2.log"
    else
        report_ok "two hosts, mpirun: write lat, pairs" "$work/mpi2.log" "$work/mpi2.json" \
            lat 2 12
        must_say "$work/mpi2.log" "softroce-b +[0-9]+ +$SERVER_IP:[0-9]+ +$SERVER_DEVICE" \
            "two hosts, mpirun: ranks on the peer host"
        must_say "$work/mpi2.log" "softroce +[0-9]+ +$RDMA_TEST_IP:[0-9]+ +$dev" \
            "two hosts, mpirun: ranks on this host"
        if [ -n "$keep" ]; then
            mkdir -p "$keep"
            cp "$work/mpi2.log" "$work/mpi2.json" "$work/mpi2.svg" "$keep/"
        fi
    fi
    echo "two hosts: a rank killed on the peer host ends every other rank, naming it"
    kill_rank 3
    finish
    exit
fi

echo "mpirun: every pair in turn, ring, all-to-all"
cluster_mpirun "mpirun: write bw, pairs" bw 4096 12 write bw -s 4096 -n 200 --pattern pairs
if [ -n "$keep" ]; then
    mkdir -p "$keep"
    cp "$work/run.log" "$work/run.json" "$work/run.svg" "$keep/"
fi
cluster_mpirun "mpirun: send lat, ring" lat 2 4 send lat -n 200 --pattern ring
cluster_mpirun "mpirun: read bw -q 2, validated, all-to-all" bw 8192 12 read bw -s 8192 -n 100 -q 2 \
    --data-validation --pattern all-to-all

echo "Slurm's variables: atomic bw, every pair in turn"
stride_port=$((stride_port + 1))
slurm_ranks "$work" 4 atomic bw -n 100 --pattern pairs --json "$work/slurm.json"
if wait_ranks "Slurm ranks"; then
    report_ok "Slurm ranks: atomic bw, pairs" "$work/rank-0" "$work/slurm.json" bw 8 12
    must_say "$work/rank-0" "4 ranks \(Slurm\), pattern pairs" "Slurm ranks (title)"
fi

echo "a rank killed mid-run ends every other rank within the bound, naming it"
kill_rank 2

echo "a rank that never comes ends the others, naming it"
stride_port=$((stride_port + 1))
t0=$SECONDS
slurm_ranks "$work" 3 write bw -s 4096 -n 100 --cluster-timeout 5
for r in 0 1 2; do
    rc=0
    wait "${PIDS[$r]}" || rc=$?
    if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        fail "never-arriving rank: rank $r exited $rc"
        show_log "rank $r" "$work/rank-$r"
    else
        must_say "$work/rank-$r" "rank 3 never arrived at rank 0 within 5 s" \
            "rank $r names the rank that never came"
    fi
done
[ $((SECONDS - t0)) -le 30 ] || fail "never-arriving rank: the others took $((SECONDS - t0)) s"

echo "bad launches"
expect_error "--cluster without a launcher" \
    "none of OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE .* PMI_RANK/PMI_SIZE .* SLURM_PROCID" \
    env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u PMI_RANK -u PMI_SIZE \
    -u SLURM_PROCID "$bin" write bw --cluster -d "$dev"
expect_error "--cluster, rank past the world size" \
    "SLURM_PROCID=4 is not below SLURM_NTASKS=4" \
    env SLURM_PROCID=4 SLURM_NTASKS=4 "$bin" write bw --cluster -d "$dev"
expect_error "--pattern without --cluster" "applies to cluster runs only" \
    "$bin" write bw --pattern ring -d "$dev"
finish
