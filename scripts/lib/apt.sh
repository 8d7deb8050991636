# shellcheck shell=bash
# Downloading from Debian without touching the host's apt configuration: the mirror the host
# already uses, and apt-get/apt-cache run against a private sources list (the SoftRoCE rig's
# guest kernel, rdma-core's source package for scripts/rdma-core-examples). Source it after
# scripts/lib/host.sh; it defines functions and sets nothing else.

# The Debian mirror named in the host's apt configuration (never written into the repository).
host_mirror() {
    local uri
    # deb822 sources first (Debian 12 and later), then the one-line format.
    uri=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
        awk 'tolower($1) == "uris:" && $2 ~ /debian\/?$/ && $2 !~ /security/ { print $2; exit }')
    if [ -z "$uri" ]; then
        uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^(https?|file):/) {
                 if ($i ~ /debian\/?$/ && $i !~ /security/) { print $i; exit } } }')
    fi
    [ -n "$uri" ] || die "finding a Debian mirror" "no Debian archive URI in /etc/apt/sources.list" \
        "or /etc/apt/sources.list.d/*.sources; set SOFTROCE_MIRROR to a Debian mirror URL"
    printf '%s\n' "${uri%/}"
}

mirror() { printf '%s\n' "${SOFTROCE_MIRROR:-$(host_mirror)}"; }

# private_apt TOOL STATE ARGS...: runs apt-get or apt-cache (TOOL) with the sources listed in
# STATE/sources.list only, through a private configuration that leaves the host's own
# sources, lists and package state untouched; STATE holds its lists and cache.
private_apt() {
    local tool=$1 state=$2
    shift 2
    "$tool" -q -o Dir::Etc::SourceList="$state/sources.list" -o Dir::Etc::SourceParts=/dev/null \
        -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null \
        -o Dir::State="$state" -o Dir::State::Lists="$state/lists" -o Dir::Cache="$state/cache" \
        -o Dir::State::status=/dev/null -o Debug::NoLocking=true -o APT::Architecture=amd64 \
        -o APT::Sandbox::User="$(id -un)" "$@"
}

