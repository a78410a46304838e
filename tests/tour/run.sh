#!/usr/bin/env bash
# Runs the README's tour as a server and a client on the RDMA device; 77 (skipped) without one.
# VERBS_TEST_WRAPPER and VERBS_TEST_TIMEOUT_SCALE as in tests/examples/run.sh.
set -u
tour=$1
scale=${VERBS_TEST_TIMEOUT_SCALE:-1}
read -ra wrapper <<<"${VERBS_TEST_WRAPPER:-}"
addr=${VERBS_TEST_ADDR:-192.0.2.1}
if [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "skipped: no RDMA device (run in the SoftRoCE VM: scripts/rxe-vm)"; exit 77
fi
timeout $((120 * scale)) "${wrapper[@]}" "$tour" & server=$!
out=""
for ((try = 1; try <= 10 * scale; try++)); do   # the server needs a moment to listen
  sleep 1
  out=$(timeout $((120 * scale)) "${wrapper[@]}" "$tour" "$addr" 2>&1); rc=$?
  case "$out" in *"no listener"*) continue ;; esac
  break
done
wait "$server"; src=$?
echo "client (exit $rc): $out"
echo "server exit $src"
[ "$rc" -eq 0 ] && [ "$src" -eq 0 ] && [[ "$out" == *"1000 round trips"* ]]
