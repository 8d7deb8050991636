# shellcheck shell=bash
# find_gid_index, for scripts/softroce on the host and for the script it writes for the guest,
# which holds this file's text as it is: so it defines that one function, uses nothing else of
# the rig's, and runs as it is under the guest's bash.

# find_gid_index DEVICE: the index of the first IPv4-mapped RoCE v2 GID of port 1, else 0
# (InfiniBand and IPv6-only ports).
find_gid_index() {
    # Builtin reads only: a GID table can have hundreds of entries, and a process per entry
    # is slow under emulation.
    local dev=$1 gid idx value type
    for gid in /sys/class/infiniband/"$dev"/ports/1/gids/*; do
        idx=${gid##*/}
        read -r value <"$gid" 2>/dev/null || continue
        case $value in
        0000:0000:0000:0000:0000:ffff:*)
            type=
            read -r type <"/sys/class/infiniband/$dev/ports/1/gid_attrs/types/$idx" 2>/dev/null
            if [ "$type" = "RoCE v2" ]; then
                printf '%s\n' "$idx"
                return 0
            fi
            ;;
        esac
    done
    printf '0\n'
}
