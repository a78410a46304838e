#!/usr/bin/env bash
# Runs one of the README's snippets on the RDMA device; 77 (skipped) without one.
#   snippet.sh expose PROGRAM   the server (PROGRAM ADDR) and a client (PROGRAM ADDR read)
#   snippet.sh ud PROGRAM       one process, both QPs
# VERBS_TEST_WRAPPER and VERBS_TEST_TIMEOUT_SCALE as in tests/examples/run.sh.
set -u
name=$1 prog=$2
scale=${VERBS_TEST_TIMEOUT_SCALE:-1}
read -ra wrapper <<<"${VERBS_TEST_WRAPPER:-}"
addr=${VERBS_TEST_ADDR:-192.0.2.1}
if [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "skipped: no RDMA device (run in the SoftRoCE VM: scripts/rxe-vm)"; exit 77
fi
case "$name" in
  expose)
    timeout $((120 * scale)) "${wrapper[@]}" "$prog" "$addr" & server=$!
    out="" rc=1
    for ((try = 1; try <= 10 * scale; try++)); do   # the server needs a moment to listen
      sleep 1
      out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" "$addr" read 2>&1); rc=$?
      case "$out" in *"no listener"*) continue ;; esac
      break
    done
    wait "$server"; src=$?
    echo "client (exit $rc): $out"
    echo "server exit $src"
    [ "$rc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$out" = "read: exposed before connecting" ]
    ;;
  ud)
    out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" == *"b got 'ping' (5 bytes) from QP "* ]] && [[ "$out" == *"a got 'pong'"* ]]
    ;;
  *) echo "snippet.sh: unknown snippet $name" >&2; exit 2 ;;
esac
