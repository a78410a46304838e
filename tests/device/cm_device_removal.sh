#!/usr/bin/env bash
# rdma_cm's DEVICE_REMOVAL, for real: removes the rxe device (rdma link delete) while a listener
# waits in accept() and both ends of a connection wait on their CQs (verbs_cm_peer --removal),
# checks that accept and the waits fail with ENODEV (not a timeout; one end of the connection
# may see the other's id go first, ECONNRESET), and puts
# the device back as scripts/rxe-vm made it.
#
# Usage: cm_device_removal.sh PEER     (PEER: the verbs_cm_peer program)
# Runs only in the scripts/rxe-vm VM, whose rxe0 it removes (exit 77 elsewhere).
set -uo pipefail
peer=$1
addr=${VERBS_TEST_ADDR:-192.0.2.1}
dev=${VERBS_TEST_DEVICE:-rxe0}
if ! { [ "$(hostname)" = rxe-vm ] && [ -d /run/rxe-vm ]; }; then
  echo "skipped: removes the RDMA device: runs only in the scripts/rxe-vm VM"
  exit 77
fi
netdev=$(cat "/sys/class/infiniband/$dev/parent" 2>/dev/null) || {
  echo "skipped: $dev has no parent netdev (not rxe)"
  exit 77
}
failed=0
out=$(mktemp)
timeout -k 5 60 "$peer" --removal "$addr" >"$out" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q '^connected$' "$out" && break; sleep 0.1; done
grep -q '^connected$' "$out" || { echo "FAIL: the peer did not connect"; failed=1; }
sleep 0.3  # the waits are in place
# Completes only once the peer has exited (librdmacm keeps the device open until then).
timeout -k 5 60 rdma link delete "$dev" &
deleting=$!
wait "$pid"
status=$?
cat "$out"
[ "$status" -eq 0 ] || {
  echo "FAIL: verbs_cm_peer --removal exited with $status (accept and at least one end must say ENODEV, no wait may time out)"
  failed=1
}
wait "$deleting" || { echo "FAIL: rdma link delete $dev failed"; failed=1; }
# Put it back, and wait for the port and its IPv4 GID, as scripts/rxe-vm does.
[ -e "/sys/class/infiniband/$dev" ] || rdma link add "$dev" type rxe netdev "$netdev" || { echo "FAIL: rdma link add"; exit 1; }
for _ in $(seq 1 300); do
  grep -q ACTIVE "/sys/class/infiniband/$dev/ports/1/state" 2>/dev/null &&
    grep -q ':ffff:' /sys/class/infiniband/"$dev"/ports/1/gids/[0-9] 2>/dev/null && break
  sleep 0.1
done
grep -q ACTIVE "/sys/class/infiniband/$dev/ports/1/state" || { echo "FAIL: $dev did not come back ACTIVE"; exit 1; }
rm -f "$out"
[ "$failed" -eq 0 ] && echo "cm_device_removal: passed"
exit "$failed"
