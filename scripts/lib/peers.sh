# shellcheck shell=bash
# Running a server and a client against each other with bounded waits, for the end-to-end
# checks (sourced inside the SoftRoCE guest, or on a host with an RDMA device). Nothing here
# waits without a limit: every program runs under `timeout`, and every readiness wait gives up.

# How long one program of a pair may run, in seconds.
: "${PEER_TIMEOUT:=120}"

# wait_tcp_listen PORT SECS: until something listens on TCP PORT; fails after SECS seconds.
# (Connecting to probe would eat the server's one accept, so ask the kernel instead.)
wait_tcp_listen() {
    local port=$1 deadline=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$deadline" ]; do
        [ -n "$(ss -Hltn "sport = :$port" 2>/dev/null)" ] && return 0
        sleep 0.1
    done
    echo "nothing listened on TCP port $port within $2 s" >&2
    return 1
}

# wait_cm_listen PORT SECS: until an rdmacm id listens on PORT; fails after SECS seconds.
wait_cm_listen() {
    local port=$1 deadline=$((SECONDS + $2))
    while [ "$SECONDS" -lt "$deadline" ]; do
        rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*src-addr [^ ]*:$port " && return 0
        sleep 0.1
    done
    echo "no rdmacm id listened on port $port within $2 s" >&2
    return 1
}

# show_log NAME LOG: prints LOG indented, each line tagged with NAME.
show_log() {
    sed "s/^/  [$1] /" "$2"
}

# run_pair READY SERVER_CMD... -- CLIENT_CMD...: starts the server, waits with the READY
# command (e.g. "wait_tcp_listen 18515 30"), runs the client, then waits for the server, and
# prints both outputs. Each side runs under `timeout`. Fails, naming the side, when either side
# fails or the server never got ready; a server left waiting by a failed client is killed.
# Leaves the logs in PAIR_DIR/{server,client}.log, complete when it returns.
run_pair() {
    local ready=$1
    shift
    local server=() client=()
    while [ $# -gt 0 ] && [ "$1" != -- ]; do server+=("$1"); shift; done
    [ $# -gt 0 ] || { echo "run_pair: no -- between server and client" >&2; return 2; }
    shift
    client=("$@")
    PAIR_DIR=$(mktemp -d)
    echo "  server: ${server[*]}"
    timeout -k 5 "$PEER_TIMEOUT" "${server[@]}" >"$PAIR_DIR/server.log" 2>&1 &
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
