# shellcheck shell=bash
# Running a server and a client against each other with bounded waits, for the end-to-end
# checks (sourced inside the SoftRoCE guest, or on a host with an RDMA device). Nothing here
# waits without a limit: every program runs under `timeout`, and every readiness wait gives up.

# How long one program of a pair may run, in seconds.
: "${PEER_TIMEOUT:=120}"

# Where a pair's server runs. On two hosts (`scripts/softroce run --hosts 2`, which sets
# RDMA_TEST_PEER_*), the server runs on the peer host through scripts/on-peer-host with the
# peer's device, and the client here connects across the link to the peer's address. On one
# device both sides run here, and the client connects over loopback.
#   SERVER_ON       the command prefix that runs a server where it belongs (empty: here)
#   SERVER_DEVICE   SERVER_GID_INDEX  SERVER_IP: the server's device, GID index and address
#   SERVER_ADDR     where a client connects a TCP side channel to the server
# (Used by the scripts that source this file.)
# shellcheck disable=SC2034
if [ -n "${RDMA_TEST_PEER_NETNS:-}" ]; then
    SERVER_ON=("$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)/on-peer-host")
    SERVER_DEVICE=${RDMA_TEST_PEER_DEVICE:?RDMA_TEST_PEER_NETNS is set, RDMA_TEST_PEER_DEVICE not}
    SERVER_GID_INDEX=${RDMA_TEST_PEER_GID_INDEX:?RDMA_TEST_PEER_GID_INDEX is not set}
    SERVER_IP=${RDMA_TEST_PEER_IP:?RDMA_TEST_PEER_IP is not set}
    SERVER_ADDR=$SERVER_IP
    echo "two hosts: servers on ${RDMA_TEST_PEER_NETNS} ($SERVER_DEVICE, $SERVER_IP)," \
        "clients on ${RDMA_TEST_NETNS:-this host} (${RDMA_TEST_DEVICE:-}, ${RDMA_TEST_IP:-})"
else
    SERVER_ON=()
    SERVER_DEVICE=${RDMA_TEST_DEVICE:-}
    SERVER_GID_INDEX=${RDMA_TEST_GID_INDEX:-1}
    SERVER_IP=${RDMA_TEST_IP:-}
    SERVER_ADDR=127.0.0.1
fi

# wait_tcp_listen PORT SECS: until something listens on TCP PORT on the server's host; fails
# after SECS seconds. (Connecting to probe would eat the server's one accept, so ask the
# kernel instead.)
wait_tcp_listen() {
    local port=$1 deadline=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$deadline" ]; do
        [ -n "$("${SERVER_ON[@]}" ss -Hltn "sport = :$port" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    echo "nothing listened on TCP port $port within $2 s" >&2
    return 1
}

# wait_cm_listen PORT SECS: until an rdmacm id listens on PORT; fails after SECS seconds.
wait_cm_listen() {
    local port=$1 deadline=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$deadline" ]; do
        "${SERVER_ON[@]}" rdma res show cm_id 2>/dev/null |
            grep -q "state LISTEN .*src-addr [^ ]*:$port " && return 0
        sleep 0.1
    done
    echo "no rdmacm id listened on port $port within $2 s" >&2
    return 1
}

# show_log NAME LOG: prints LOG indented, each line tagged with NAME.
show_log() {
    sed "s/^/  [$1] /" "$2"
}

# run_pair READY SERVER_CMD... -- CLIENT_CMD...: starts the server (on the peer host when
# there are two: SERVER_ON), waits with the READY
# command (e.g. "wait_tcp_listen 18515 30"), runs the client, then waits for the server, and
# prints both outputs. Each side runs under `timeout`. Fails, naming the side, when either side
# fails or the server never got ready; a server left waiting by a failed client is killed.
# Leaves the logs in PAIR_DIR/{server,client}.log, complete when it returns, and the sides'
# exit statuses in PAIR_CLIENT_RC and PAIR_SERVER_RC (empty when the client never ran).
run_pair() {
    local ready=$1
    shift
    PAIR_CLIENT_RC='' PAIR_SERVER_RC=''
    local server=() client=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do server+=("$1"); shift; done
    [ $# -gt 0 ] || { echo "run_pair: no -- between server and client" >&2; return 2; }
    shift
    client=("$@")
    PAIR_DIR=$(mktemp -d)
    echo "  server${SERVER_ON[0]:+ (on ${RDMA_TEST_PEER_NETNS:-the peer})}: ${server[*]}"
    timeout -k 5 "$PEER_TIMEOUT" "${SERVER_ON[@]}" "${server[@]}" >"$PAIR_DIR/server.log" 2>&1 &
    local server_pid=$!
    if ! $ready; then
        kill "$server_pid" 2>/dev/null
        wait "$server_pid" 2>/dev/null
        show_log server "$PAIR_DIR/server.log"
        echo "  FAIL: the server did not get ready" >&2
        return 1
    fi
    echo "  client: ${client[*]}"
    local client_rc=0 server_rc=0
    timeout -k 5 "$PEER_TIMEOUT" "${client[@]}" >"$PAIR_DIR/client.log" 2>&1 || client_rc=$?
    if [ "$client_rc" -ne 0 ]; then
        # A server whose client failed may wait forever for it; don't let it hold the run.
        sleep 1
        kill "$server_pid" 2>/dev/null || true
    fi
    wait "$server_pid" || server_rc=$?
    show_log server "$PAIR_DIR/server.log"
    show_log client "$PAIR_DIR/client.log"
    PAIR_CLIENT_RC=$client_rc PAIR_SERVER_RC=$server_rc
    if [ "$client_rc" -ne 0 ] || [ "$server_rc" -ne 0 ]; then
        echo "  FAIL: client exited $client_rc, server exited $server_rc" \
            "(124: ran past ${PEER_TIMEOUT} s)" >&2
        return 1
    fi
}

# expect_not_in LOG PATTERN WHAT: fails with the first offending line unless LOG has no line
# matching PATTERN.
expect_not_in() {
    grep -qE "$2" "$1" || return 0
    echo "  FAIL: $3: $(grep -E -m1 "$2" "$1") in $(basename "$1")" >&2
    return 1
}

# expect_in LOG PATTERN WHAT: fails with a message unless LOG has a line matching PATTERN.
expect_in() {
    grep -qE "$2" "$1" && return 0
    echo "  FAIL: expected $3 (pattern '$2') in $(basename "$1")" >&2
    return 1
}
