#!/usr/bin/env bash
# Runs a program of the guide (a ```cpp block of README.md or docs/*.md with main(), built as
# readme_NAME: cmake/doc_snippets.cmake) on the RDMA device; 77 (skipped) without one. Each
# program has a case here that says how to run it and what it must print.
#   readme.sh tour PROGRAM          README.md: the server (PROGRAM) and a client (PROGRAM ADDR)
#   readme.sh core PROGRAM          docs/core.md: one process, two QPs connected from their endpoints
#   readme.sh expose PROGRAM        docs/connections.md: the server (PROGRAM ADDR) and a client (PROGRAM ADDR read)
#   readme.sh private-data PROGRAM  docs/connections.md: one process (PROGRAM ADDR), a refused client and an accepted one
#   readme.sh asio PROGRAM          docs/event-driven.md: one process (PROGRAM ADDR), asio server and client coroutines
#   readme.sh ud PROGRAM            docs/datagrams.md: one process, both QPs
#   readme.sh datagram PROGRAM      docs/datagrams.md: one process (PROGRAM ADDR), UD and multicast through rdma_cm
#   readme.sh window PROGRAM        docs/memory.md: one process, both QPs: a memory window granted, then revoked
#   readme.sh rails PROGRAM         docs/rails.md: one process (PROGRAM ADDR), a Target and a Group of two rails
# VERBS_TEST_WRAPPER and VERBS_TEST_TIMEOUT_SCALE as in tests/examples/run.sh. Under
# scripts/rxe-pair (VERBS_PAIR_DIR, VERBS_PEER_ADDR) the server runs on the other host.
set -u
name=$1 prog=$2
scale=${VERBS_TEST_TIMEOUT_SCALE:-1}
read -ra wrapper <<<"${VERBS_TEST_WRAPPER:-}"
addr=${VERBS_TEST_ADDR:-192.0.2.1}
server_addr=$addr
on_server=()
if [ -n "${VERBS_PAIR_DIR:-}" ] && [ -n "${VERBS_PEER_ADDR:-}" ]; then
  server_addr=$VERBS_PEER_ADDR
  on_server=("$(cd "$(dirname "$0")/../.." && pwd)/scripts/pair" exec)
fi
if [ -z "$(ls -A /sys/class/infiniband 2>/dev/null)" ]; then
  echo "skipped: no RDMA device (run in the SoftRoCE VM: scripts/rxe-vm)"; exit 77
fi
# pair "SERVER ARGS" "CLIENT ARGS": runs both, retrying the client until the server listens;
# leaves the client's output in $out and succeeds when both exit 0.
pair() {
  local -a server_args client_args
  read -ra server_args <<<"$1"
  read -ra client_args <<<"$2"
  "${on_server[@]}" timeout $((120 * scale)) "${wrapper[@]}" "$prog" "${server_args[@]}" & local server=$!
  out="" rc=1
  for ((try = 1; try <= 10 * scale; try++)); do   # the server needs a moment to listen
    sleep 1
    out=$(timeout $((120 * scale)) "${wrapper[@]}" "$prog" "${client_args[@]}" 2>&1); rc=$?
    case "$out" in *"no listener"*) continue ;; esac
    break
  done
  wait "$server"; local src=$?
  echo "client (exit $rc): $out"
  echo "server exit $src"
  [ "$rc" -eq 0 ] && [ "$src" -eq 0 ]
}
case "$name" in
  tour) pair "" "$server_addr" && [[ "$out" == *"1000 round trips"* ]] ;;
  expose) pair "$server_addr" "$server_addr read" && [ "$out" = "read: exposed before connecting" ] ;;
  ud)
    out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" == *"b got 'ping' (5 bytes) from QP "* ]] && [[ "$out" == *"a got 'pong'"* ]]
    ;;
  window)
    out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" == *"the owner has 'granted'"* ]] &&
      [[ "$out" == *"after the revoke: remote access error"* ]]
    ;;
  rails)
    out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" "$addr" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" =~ "rails: 8388608 bytes over 2 rails: done, every byte there; rail 0 "[1-9][0-9]*" chunks, rail 1 "[1-9] ]]
    ;;
  datagram)
    out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" "$addr" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" == *"server got 'hello' from QP "* ]] && [[ "$out" == *"member got 'to all'"* ]]
    ;;
  core)
    out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" == *"a receive in RESET: queue pair state does not allow"* ]] &&
      [[ "$out" == *"b got 'over the core' (14 bytes)"* ]]
    ;;
  private-data)
    out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" "$addr" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" == *"status 28; the server said 'version 1 only'"* ]] &&
      [[ "$out" == *"client: connected; the server said 'welcome'"* ]]
    ;;
  asio)
    out=$(timeout $((60 * scale)) "${wrapper[@]}" "$prog" "$addr" 2>&1); rc=$?
    echo "exit $rc: $out"
    [ "$rc" -eq 0 ] && [[ "$out" == *"client: the echo is 'hello, asio'"* ]] &&
      [[ "$out" == *"server: echoed 12 bytes; the client has gone"* ]]
    ;;
  *) echo "readme.sh: no case for the program '$name': add one that runs it and checks its output" >&2; exit 2 ;;
esac
