#!/usr/bin/env bash
# verbs-perf's correctness on the RDMA device: write_bw, read_bw and send_bw (and atomic_lat's
# counter) as a server and a client with --verify, which checks the data after each run; then the
# same with data corrupted on purpose, which --verify must catch. No figure is checked.
# Exit 77 (skipped) without a device. Usage: verify-pair.sh PATH/TO/verbs-perf [--sanitized]
# --sanitized (a sanitizer build, whose processes take ~1 s each to start in the VM): one pair for
# each code path, not each variant (15 pairs instead of 25: every verb, option and post path,
# rdma_cm, and a spoiled message for each verb still run; each pair left out is another size, or
# a verb with an option or post path that other pairs run: send with a plain post list, read on
# 2 QPs, atomics polled).
# Under scripts/rxe-pair (VERBS_PAIR_DIR, VERBS_PEER_ADDR) each server runs on the other host.
set -u
perf=$1
sanitized=0
[ "${2:-}" = --sanitized ] && sanitized=1
if [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "skipped: no RDMA device (run in the SoftRoCE VM: scripts/rxe-vm)"
  exit 77
fi
dev=()
[ -n "${VERBS_TEST_DEVICE:-}" ] && dev=(-d "$VERBS_TEST_DEVICE")
log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
port=$((20000 + $$ % 20000))
on_server=()
remote=
if [ -n "${VERBS_PAIR_DIR:-}" ] && [ -n "${VERBS_PEER_ADDR:-}" ]; then
  remote=$VERBS_PEER_ADDR
  on_server=("$(cd "$(dirname "$0")/../.." && pwd)/scripts/pair" exec env ${VERBS_TEST_DEVICE:+VERBS_TEST_DEVICE=$VERBS_TEST_DEVICE})
fi
passed=0
failed=0

# pair EXPECT HOST ARGS...: a server and a client on one port; EXPECT is ok or caught.
pair() {
  local expect=$1 host=$2
  shift 2
  port=$((port + 1))
  local corrupt=()
  [ -n "${VERBS_PERF_CORRUPT:-}" ] && corrupt=("VERBS_PERF_CORRUPT=$VERBS_PERF_CORRUPT")
  if [ ${#on_server[@]} -gt 0 ]; then
    "${on_server[@]}" "${corrupt[@]}" timeout 300 "$perf" "$@" "${dev[@]}" -p "$port" >"$log/server" 2>&1 &
  else
    timeout 300 "$perf" "$@" "${dev[@]}" -p "$port" >"$log/server" 2>&1 &
  fi
  local spid=$! crc src waited=0
  # The client only once the server listens (its banner): the client tries for 5 s, and a
  # server started on the other host took longer than that once.
  until grep -q 'Waiting for client to connect' "$log/server" 2>/dev/null; do
    kill -0 "$spid" 2>/dev/null || break
    [ "$waited" -lt 600 ] || break
    waited=$((waited + 1))
    sleep 0.1
  done
  timeout 300 "$perf" "$@" "${dev[@]}" -p "$port" "$host" >"$log/client" 2>&1
  crc=$?
  wait "$spid"
  src=$?
  local verdict=bad
  if [ "$expect" = ok ] && [ $crc -eq 0 ] && [ $src -eq 0 ] && grep -q -- "--verify: the data of every size checked out" "$log/client"; then
    verdict=good
  elif [ "$expect" = caught ] && [ $crc -eq 1 ] && grep -q -- "--verify FAILED" "$log/client"; then
    verdict=good
  fi
  if [ $verdict = good ]; then
    passed=$((passed + 1))
    echo "ok      ($expect) verbs-perf $*"
  else
    failed=$((failed + 1))
    echo "FAILED  (expected $expect; client exit $crc, server exit $src) verbs-perf $*"
    sed 's/^/    client: /' "$log/client" | tail -n 15
    sed 's/^/    server: /' "$log/server" | tail -n 8
  fi
}

# The TCP exchange works over any address; the data goes over the device either way.
host=127.0.0.1
[ -n "$remote" ] && host=$remote
# Across a wire (two hosts), what the wire changes: each verb with messages of many packets on
# two QPs, small batched writes, atomics, and rdma_cm's connection. The options that change only
# how one host posts and waits (inline data, --cq-mod, a duration, completion events, --wr-api)
# and --verify's own check of spoiled data run on one host: the two-host suite is long.
# one_host ARGS...: `pair ok` on one host only.
one_host() { [ -n "$remote" ] || pair ok "$@"; }
# unsanitized CMD ARGS...: CMD unless --sanitized, where another pair takes the same path.
unsanitized() { [ $sanitized = 1 ] || "$@"; }
unsanitized one_host $host write_bw --verify -s 4096 -n 500
pair ok $host write_bw --verify -s 65536 -n 64 -q 2
pair ok $host write_bw --verify -s 8 -n 1024 -l 16
one_host $host write_bw --verify -s 1000 -n 300 -I 64 --cq-mod 10
one_host $host write_bw --verify -s 3 -D 2
unsanitized one_host $host read_bw --verify -s 1024 -n 500
unsanitized pair ok $host read_bw --verify -s 65536 -n 50 -q 2
unsanitized one_host $host send_bw --verify -s 4096 -n 500
unsanitized one_host $host send_bw --verify -s 8 -n 512 -l 16
pair ok $host send_bw --verify -s 100000 -n 40 -q 2
unsanitized one_host $host send_bw --verify -s 64 -D 2
unsanitized pair ok $host atomic_lat --verify -n 200
# -e: each completion waited for on the CQ's channel (CompletionQueue::wait), not polled.
one_host $host atomic_lat --verify -n 200 -e
# --wr-api: every post through a SendBatch (ibv_wr_*), lists and single requests, each verb.
one_host $host write_bw --verify -s 8 -n 1024 -l 16 --wr-api
unsanitized one_host $host write_bw --verify -s 1000 -n 300 -I 64 --cq-mod 10 --wr-api
one_host $host read_bw --verify -s 1024 -n 500 --wr-api
one_host $host send_bw --verify -s 8 -n 512 -l 16 --wr-api
one_host $host atomic_lat --verify -n 200 --wr-api
# rdma_cm needs the device's own address.
cm_host=${remote:-${VERBS_TEST_ADDR:-}}
if [ -n "$cm_host" ]; then
  unsanitized pair ok "$cm_host" write_bw -R --verify -s 2048 -n 300
  pair ok "$cm_host" send_bw -R --verify -s 512 -n 300 -q 2
  [ -n "$remote" ] || pair ok "$cm_host" write_bw -R --verify -s 2048 -n 300 --wr-api
fi
# --verify must notice wrong data (VERBS_PERF_CORRUPT makes the tool spoil one message).
if [ -z "$remote" ]; then
  export VERBS_PERF_CORRUPT=1
  pair caught $host write_bw --verify -s 4096 -n 500
  pair caught $host read_bw --verify -s 1024 -n 500
  pair caught $host send_bw --verify -s 4096 -n 500
  unsanitized pair caught $host write_bw --verify -s 4096 -n 500 --wr-api
  unset VERBS_PERF_CORRUPT
fi

echo "verbs-perf --verify: $passed passed, $failed failed"
[ $failed -eq 0 ]
