# shellcheck shell=bash
# Helpers shared by the host-side scripts (softroce, test, demo): messages, running as root,
# and installing Debian packages only when they are missing. Source it; it defines functions
# and sets nothing else.

# The name printed in front of every message; each script sets its own before sourcing.
: "${SCRIPT_NAME:=scripts}"

note() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }

# die STEP MESSAGE...: a failed step, what happened and what to do; exit status 125 marks
# "the tooling failed", distinct from the exit status of a command we ran for the user.
die() {
    local step=$1
    shift
    printf '%s: error: %s failed: %s\n' "$SCRIPT_NAME" "$step" "$*" >&2
    exit 125
}

# as_root CMD...: runs CMD as root (directly when we are root, else through sudo).
as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        note "needs root for: $*; run as root or install sudo"
        return 1
    fi
}

# package_installed PKG: true when dpkg knows PKG as installed.
package_installed() {
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null)" = installed ]
}

# ensure_packages WHAT PKG...: installs those of the Debian packages PKG... that are missing,
# with apt-get (no recommends), and says which step failed and what to do if it cannot.
# Touches no network when everything is installed already.
ensure_packages() {
    local what=$1
    shift
    if ! command -v dpkg-query >/dev/null 2>&1; then
        note "not a Debian-based system: make sure these (Debian names) are installed for $what: $*"
        return 0
    fi
    local missing=() pkg
    for pkg in "$@"; do
        package_installed "$pkg" || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    note "installing for $what: ${missing[*]}"
    local log
    log=$(mktemp)
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        die "installing packages for $what" "'apt-get update' failed (output above); check the" \
            "network and the apt sources, or install by hand: apt-get install ${missing[*]}"
    fi
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
        --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -f "$log"
        die "installing packages for $what" "'apt-get install ${missing[*]}' failed (output" \
            "above); install them by hand, then run this again"
    fi
    rm -f "$log"
}

# build_xtask: builds the workspace's tool for the scripts' parsing jobs (xtask/: cargo's JSON
# messages, test outputs), a no-op when it is up to date. Not inside a pipe from another
# cargo: the two would wait on each other's lock of target/.
build_xtask() {
    cargo build --quiet --locked --release --manifest-path "$(repo_root)/Cargo.toml" -p xtask
}

# xtask ARGS...: runs it (build_xtask first).
xtask() { "$(repo_root)/target/release/xtask" "$@"; }

repo_root() { (cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P); }
