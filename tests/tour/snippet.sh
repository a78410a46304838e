#!/usr/bin/env bash
# Runs one of the README's snippets on the RDMA device; 77 (skipped) without one.
#   snippet.sh expose PROGRAM   the server (PROGRAM ADDR) and a client (PROGRAM ADDR read)
#   snippet.sh ud PROGRAM       one process, both QPs
set -u
name=$1 prog=$2
addr=${VERBS_TEST_ADDR:-192.0.2.1}
if [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "skipped: no RDMA device (run in the SoftRoCE VM: scripts/rxe-vm)"; exit 77
fi
case "$name" in
  expose)
    timeout 120 "$prog" "$addr" & server=$!
    out="" rc=1
    for try in 1 2 3 4 5 6 7 8 9 10; do   # the server needs a moment to listen
      sleep 1
      out=$(timeout 60 "$prog" "$addr" read 2>&1); rc=$?
      case "$out" in *"no listener"*) continue ;; esac
      break
    done
    wait "$server"; src=$?
    echo "client (exit $rc): $out"
    echo "server exit $src"
    [ "$rc" -eq 0 ] && [ "$src" -eq 0 ] && [ "$out" = "read: exposed before connecting" ]
    ;;
  ud)
    out=$(timeout 60 "$prog" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" == *"b got 'ping' (5 bytes) from QP "* ]] && [[ "$out" == *"a got 'pong'"* ]]
    ;;
  *) echo "snippet.sh: unknown snippet $name" >&2; exit 2 ;;
esac
