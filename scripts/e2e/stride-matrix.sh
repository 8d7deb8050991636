#!/usr/bin/env bash
# stride-perf against itself on the device: every verb x test on RC, the UC and UD ones, and the
# options -q, -l, -b, -D, -R, -e, -a, -I, -o, --use-wr-api, --use-old-post-send, --extended-poll,
# --report-gbits and --json, each checking that the numbers are present and sane. Small sizes
# and counts keep it to about a minute on SoftRoCE.
# Binary: ${STRIDE_BIN:-target/debug/stride-perf}. Under `scripts/softroce run --hosts 2` every
# server runs on the peer host and every client here, across the link; scripts/test runs it
# on one device only (stride crosses the link in faults-lossy-link.sh and stride-cluster.sh).
# e2e-hosts: 1
set -uo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib/stride.sh

n=100
# RC: every verb and test. The server of a one-sided test prints the client's table too.
stride "write bw RC" bw 4096 $n both write bw -s 4096 -n $n
stride "read bw RC" bw 4096 $n both read bw -s 4096 -n $n
stride "send bw RC" bw 4096 $n both send bw -s 4096 -n $n
# A sweep whose receive queue holds exactly one size's messages (-r = -n): the receives a
# size leaves out are refilled after it, so every later size still finds its receives.
# Ten messages per size: with 50 sends of 8 MiB posted at once (400 MiB in flight) a loaded
# SoftRoCE, or one across the emulated two-host link, falls behind and its go-back-N resends
# livelock (no completion in 20 s); 20 at once passed across the link.
stride "send bw sweep (-a) with -r equal to -n" bw 8388608 10 both send bw -a -n 10 -r 10
stride "atomic bw RC" bw 8 $n both atomic bw -n $n
stride "write lat RC" lat 2 $n both write lat -n $n
stride "read lat RC" lat 64 $n both read lat -s 64 -n $n
stride "send lat RC" lat 2 $n both send lat -n $n
stride "atomic lat RC (compare-and-swap)" lat 8 $n both atomic lat -n $n -A CMP_AND_SWAP

# UC: WRITE and SEND (READ and atomics need RC).
stride "write bw UC" bw 4096 $n client write bw -c UC -s 4096 -n $n
stride "send bw UC" bw 4096 $n client send bw -c UC -s 4096 -n $n
stride "write lat UC" lat 2 $n both write lat -c UC -n $n

# UD: SEND only, one MTU at most. The client's rows show what it sent.
stride "send bw UD" bw 1024 $n client send bw -c UD -s 1024 -n $n
stride "send lat UD" lat 64 $n both send lat -c UD -s 64 -n $n

# Options.
stride "write bw, 4 QPs (-q 4)" bw 4096 $((4 * n)) both write bw -q 4 -s 4096 -n $n
stride "write bw, post lists of 16 (-l 16)" bw 1024 $n both write bw -l 16 -s 1024 -n $n
stride "send bw, 2 QPs, post list 8, CQ moderation 4" bw 512 $((2 * n)) both \
    send bw -q 2 -l 8 -Q 4 -s 512 -n $n
stride "write lat, inline (-I 64)" lat 32 $n both write lat -I 64 -s 32 -n $n
stride "write bw for 2 s (-D 2)" bw 4096 + both write bw -D 2 -s 4096
stride "send lat for 2 s (-D 2)" lat 2 + both send lat -D 2

# Completion events (-e): the loops sleep on the completion channel instead of spinning.
stride "send bw, completion events (-e)" bw 4096 $n both send bw -e -s 4096 -n $n
stride "write bw, 2 QPs, completion events (-e -q 2)" bw 4096 $((2 * n)) both \
    write bw -e -q 2 -s 4096 -n $n
stride "send lat, completion events (-e)" lat 2 $n both send lat -e -n $n
stride "read lat, completion events (-e)" lat 2 $n both read lat -e -n $n

# The verbs API and perftest's defaults: as perftest, ibv_post_send on a device it does not
# post ibv_wr_* on (rxe), ibv_poll_cq; --use-wr-api posts through ibv_wr_* on extended QPs,
# --extended-poll polls extended CQs; outstanding READs default to the device's most (rxe:
# 128), and a larger -o is lowered to it with a warning.
stride "read bw, perftest's defaults" bw 4096 $n both read bw -s 4096 -n $n
for side in server client; do
    must_say "$PAIR_DIR/$side.log" '^ Posting +: ibv_post_send \(classic QPs, as perftest on this device\)$' \
        "the $side's banner: ibv_post_send posting, as perftest on rxe"
    must_say "$PAIR_DIR/$side.log" '^ Polling +: ibv_poll_cq \(classic CQs\)$' \
        "the $side's banner: ibv_poll_cq polling"
    must_say "$PAIR_DIR/$side.log" "^ Outstand reads +: $(ibv_devinfo -v -d "$dev" |
        awk '$1 == "max_qp_rd_atom:" { print $2; exit }')\$" \
        "the $side's banner: the device's most outstanding reads"
done
stride "send bw, ibv_wr_* posting (--use-wr-api)" bw 4096 $n both \
    send bw -s 4096 -n $n --use-wr-api
must_say "$PAIR_DIR/client.log" '^ Posting +: ibv_wr_\* \(extended QPs, --use-wr-api\)$' \
    "--use-wr-api: the banner's Posting line"
stride "atomic bw, ibv_wr_* posting, extended polling, -o 100000" bw 8 $n both \
    atomic bw -n $n --use-wr-api --extended-poll -o 100000
must_say "$PAIR_DIR/client.log" '^ Polling +: ibv_start_poll \(extended CQs, --extended-poll\)$' \
    "--extended-poll: the banner's Polling line"
must_say "$PAIR_DIR/client.log" 'o 100000 is more outstanding READs/atomics than' \
    "-o above the device's most: a warning"
stride "write lat, ibv_wr_* posting, inline, extended polling" lat 32 $n both \
    write lat -n $n -s 32 -I 64 --use-wr-api --extended-poll
stride "read lat, ibv_wr_* posting" lat 8 $n both read lat -n $n -s 8 --use-wr-api
stride "send lat UD, ibv_wr_* posting" lat 64 $n both send lat -c UD -s 64 -n $n --use-wr-api
stride "write bw, classic posting (--use-old-post-send)" bw 4096 $n both \
    write bw -s 4096 -n $n --use-old-post-send
must_say "$PAIR_DIR/client.log" '^ Posting +: ibv_post_send \(classic QPs, --use-old-post-send\)$' \
    "--use-old-post-send: the banner's Posting line"

# rdma_cm connection setup: the client names the server device's address.
: "${RDMA_TEST_IP:?RDMA_TEST_IP is not set; run this through scripts/softroce run}"
ip=$SERVER_IP
host=$ip stride "write bw, rdma_cm setup (-R)" bw 4096 $n both write bw -R -s 4096 -n $n
host=$ip stride "read bw, 2 QPs, rdma_cm setup (-R -q 2)" bw 4096 $((2 * n)) both \
    read bw -R -q 2 -s 4096 -n $n
host=$ip stride "send lat, rdma_cm setup (-R)" lat 2 $n both send lat -R -n $n

json=$(mktemp -d)
stride "write bw bidirectional (-b), JSON" bw 4096 $n both \
    write bw -b -s 4096 -n $n --report-gbits --json "$json/r.json"
for side in server client; do
    grep -q "\"role\": \"$side\"" "$json/r.json" 2>/dev/null \
        || fail "-b: the JSON file lacks the $side's results"
done
grep -q 'BW average\[Gb/sec\]' "$PAIR_DIR/client.log" || fail "--report-gbits: no Gb/sec header"
stride "send bw bidirectional (-b)" bw 4096 $n both send bw -b -s 4096 -n $n

# A short sweep: -a on atomics is the one 8-byte size; on read lat the sizes 2 B..8 MiB are
# too slow for this check, so the sweep is exercised on atomic and by scripts/demo.
stride "atomic lat sweep (-a)" lat 8 $n both atomic lat -a -n $n
# Piped output carries no progress line.
if grep -q 'measuring' "$PAIR_DIR/client.log"; then fail "-a: a progress line in piped output"; fi

echo "plot"
if "$bin" plot "$json/r.json" -o "$json/r.svg" >/dev/null && grep -q '<svg' "$json/r.svg"; then
    echo "  ok: plot wrote $(wc -c <"$json/r.svg") bytes of SVG"
else
    fail "plot did not write an SVG"
fi
rm -rf "$json"
finish
