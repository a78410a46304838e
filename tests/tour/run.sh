#!/usr/bin/env bash
# Runs the README's tour as a server and a client on the RDMA device; 77 (skipped) without one.
set -u
tour=$1
addr=${VERBS_TEST_ADDR:-192.0.2.1}
if [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "skipped: no RDMA device (run in the SoftRoCE VM: scripts/rxe-vm)"; exit 77
fi
timeout 120 "$tour" & server=$!
out=""
for try in 1 2 3 4 5 6 7 8 9 10; do   # the server needs a moment to listen
  sleep 1
  out=$(timeout 120 "$tour" "$addr" 2>&1); rc=$?
  case "$out" in *"no listener"*) continue ;; esac
  break
done
wait "$server"; src=$?
echo "client (exit $rc): $out"
echo "server exit $src"
[ "$rc" -eq 0 ] && [ "$src" -eq 0 ] && [[ "$out" == *"1000 round trips"* ]]
