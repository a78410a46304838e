#!/usr/bin/env bash
# Runs one rping server and one rping client against each other and checks both the exit
# status and the ping data.  Usage: interop.sh OURS_RPING SERVER_KIND CLIENT_KIND
# where a KIND is "ours" (examples/rping) or "debian" (rdma-core's rping from rdmacm-utils).
# Exits 77 (skipped) without an RDMA device or without rdma-core's rping.
# VERBS_TEST_WRAPPER and VERBS_TEST_TIMEOUT_SCALE as in tests/examples/run.sh (the wrapper only
# for ours). Under scripts/rxe-pair (VERBS_PAIR_DIR, VERBS_PEER_ADDR) the server runs on the
# other host.
set -u
ours=$1 server_kind=$2 client_kind=$3
scale=${VERBS_TEST_TIMEOUT_SCALE:-1}
read -ra wrapper <<<"${VERBS_TEST_WRAPPER:-}"
addr=${VERBS_TEST_ADDR:-192.0.2.1}
count=5

if [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "skipped: no RDMA device (run in the SoftRoCE VM: scripts/rxe-vm)"; exit 77
fi
if ! command -v rping >/dev/null; then
  echo "skipped: rdma-core's rping is not installed (rdmacm-utils)"; exit 77
fi
server_addr=$addr
on_server=()
if [ -n "${VERBS_PAIR_DIR:-}" ] && [ -n "${VERBS_PEER_ADDR:-}" ]; then
  server_addr=$VERBS_PEER_ADDR
  on_server=("$(cd "$(dirname "$0")/../.." && pwd)/scripts/pair" exec)
fi
# run KIND ARGS...: that rping, under timeout (and ours under the wrapper).
# serve KIND ARGS...: the same where the server runs.
rping_of() {
  if [ "$1" = ours ]; then
    rping_cmd=(timeout $((120 * scale)) "${wrapper[@]}" "$ours")
  else
    rping_cmd=(timeout $((120 * scale)) "$(command -v rping)")
  fi
}
run() {
  rping_of "$1"
  shift
  "${rping_cmd[@]}" "$@"
}
# Run in the background: exec, so that $! is the server (or its pair exec), which the EXIT
# trap's kill reaches.
serve() {
  rping_of "$1"
  shift
  exec "${on_server[@]}" "${rping_cmd[@]}" "$@"
}

# A port nobody else in this run uses: tests run one at a time in the VM, but be safe.
port=$(( 20000 + RANDOM % 20000 ))
log=$(mktemp -d)
trap 'kill $spid 2>/dev/null; rm -rf "$log"' EXIT

serve "$server_kind" -s -a "$server_addr" -p "$port" -v >"$log/server" 2>&1 &
spid=$!
# rdma-core's rping prints nothing when it starts listening: give it a moment, then retry
# the client while the server is not up yet (REJECTED).
for ((try = 1; try <= 10 * scale; try++)); do
  sleep 1
  run "$client_kind" -c -a "$server_addr" -p "$port" -C "$count" -v -V >"$log/client" 2>&1
  crc=$?
  grep -q "REJECTED\|no listener" "$log/client" || break
done
wait "$spid"; src=$?

echo "--- server ($server_kind), exit $src"; cat "$log/server"
echo "--- client ($client_kind), exit $crc"; cat "$log/client"
fail=0
[ "$crc" -eq 0 ] || { echo "FAIL: client exit $crc"; fail=1; }
[ "$src" -eq 0 ] || { echo "FAIL: server exit $src"; fail=1; }
for i in $(seq 0 $((count - 1))); do
  grep -q "^ping data: rdma-ping-$i: " "$log/client" || { echo "FAIL: client lacks ping $i"; fail=1; }
  grep -q "server ping data: rdma-ping-$i: " "$log/server" || { echo "FAIL: server lacks ping $i"; fail=1; }
done
exit $fail
