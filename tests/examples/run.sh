#!/usr/bin/env bash
# Runs one example program as a server and its clients on the RDMA device, and passes only if
# every process exits as expected and prints what it should.
#
# Usage: run.sh CASE BIN_DIR
#   CASE     write_pingpong, write_pingpong.mismatch, write_pingpong.killed, send_recv, echo_epoll, echo_asio, kv_asio, echo_threads, read_remote,
#            atomic_counter, srq_server, datagram, datagram.udaddy, multicast, multicast.mckey, rail_mover, or help (every example's --help and a bad option; needs no device)
#   BIN_DIR  where the example programs are
# Exit status: 0 passed, 1 failed, 77 skipped (no RDMA device).
# Two hosts: under scripts/rxe-pair (VERBS_PAIR_DIR and VERBS_PEER_ADDR set), the server runs
# on the other host (scripts/pair exec) at VERBS_PEER_ADDR, the clients here.
# Environment: VERBS_TEST_ADDR (the device's IPv4 address, default 192.0.2.1),
#              VERBS_EXAMPLE_TIMEOUT (seconds any one process may run, default 90),
#              VERBS_TEST_WRAPPER (a command each example runs under, e.g. valgrind and its
#              options; split at spaces), VERBS_TEST_TIMEOUT_SCALE (an integer every time limit
#              is multiplied by, default 1: valgrind is about 6x slower under TCG), the
#              examples' own -t (30 s) included, VERBS_EXAMPLE_ROUND_BOUND_MS (what no round of
#              an echo server's loop may reach, default 1000 ms times that scale).
#
# The server listens on a port it picks (-p 0) and prints "NAME: listening on ADDR:PORT"; the
# clients start once that line is there, several at once where the example is about several
# clients. Every process runs under timeout(1), so nothing outlives the test.
set -uo pipefail
shopt -s nullglob
case_name=$1
bin=$2
addr=${VERBS_TEST_ADDR:-192.0.2.1}
scale=${VERBS_TEST_TIMEOUT_SCALE:-1}
limit=$((${VERBS_EXAMPLE_TIMEOUT:-90} * scale))
read -ra wrapper <<<"${VERBS_TEST_WRAPPER:-}"
# Under a wrapper (valgrind: each process takes 15-20 s to start in the VM, and they share its
# one CPU) the cases of several clients run two of them, and write_pingpong its multi-packet run
# alone: the same code paths, in half the processes (the step took 6:48, these four 3:43 of it).
few=0
((${#wrapper[@]} > 0)) && few=1
prog=${case_name%%.*}
# Where the server runs and listens: here, or on the other host of a pair.
server_addr=$addr
on_server=()
if [ -n "${VERBS_PAIR_DIR:-}" ] && [ -n "${VERBS_PEER_ADDR:-}" ]; then
  server_addr=$VERBS_PEER_ADDR
  on_server=("$(cd "$(dirname "$0")/../.." && pwd)/scripts/pair" exec --name server)
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/verbs-example.XXXXXX")
pids=() labels=() failed=0
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  failed=1
}

# start LABEL ARGS...: runs $prog ARGS in the background; output in $work/LABEL.out and .err.
start() {
  local label=$1 remote=()
  shift
  [ "$label" = server ] && remote=("${on_server[@]}")
  # Scaled runs scale the programs' own limit on any one wait for the peer (-t, default 30 s)
  # too: four clients under valgrind in the VM took 35 s from the server's "listening" line to
  # their first request, and the server had given up at 30 s.
  ((scale > 1)) && set -- -t $((30 * scale)) "$@"
  echo "\$ $prog $*   # $label${remote[*]:+ (on $server_addr)}"
  "${remote[@]}" timeout -k 5 "$limit" "${wrapper[@]}" "$bin/$prog" "$@" >"$work/$label.out" 2>"$work/$label.err" &
  pids+=($!)
  labels+=("$label")
}

# start_server ARGS...: starts the server on $addr and a free port, and waits until it is
# listening; sets $port.
start_server() {
  start server -a "$server_addr" -p 0 "$@"
  local deadline=$((SECONDS + 30 * scale))
  port=
  while [ -z "$port" ]; do
    port=$(sed -n 's/^.*: listening on .*:\([0-9][0-9]*\)$/\1/p' "$work/server.out")
    [ -n "$port" ] && break
    if ! kill -0 "${pids[0]}" 2>/dev/null || ((SECONDS >= deadline)); then
      kill -TERM "${pids[@]}" 2>/dev/null
      finish 0
      fail "the server did not print its 'listening on' line within $((30 * scale)) s"
      exit 1
    fi
    sleep 0.1
  done
}

# start_tool LABEL CMD...: as start, for a program of rdma-core's (udaddy, mckey) instead of an
# example: CMD as given, under timeout(1) only.
start_tool() {
  local label=$1 remote=()
  shift
  [ "$label" = server ] && remote=("${on_server[@]}")
  echo "\$ $*   # $label${remote[*]:+ (on $server_addr)}"
  "${remote[@]}" timeout -k 5 "$limit" "$@" >"$work/$label.out" 2>"$work/$label.err" &
  pids+=($!)
  labels+=("$label")
}

# wait_line LABEL REGEX: waits until LABEL's stdout has a line matching REGEX, for at most
# 30 s (scaled); fails the test and stops everything when it does not come, or LABEL ends first.
wait_line() {
  local deadline=$((SECONDS + 30 * scale)) i pid=
  for i in "${!labels[@]}"; do [ "${labels[$i]}" = "$1" ] && pid=${pids[$i]}; done
  until grep -Eq -- "$2" "$work/$1.out" 2>/dev/null; do
    if ((SECONDS >= deadline)) ||
       { [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null && ! grep -Eq -- "$2" "$work/$1.out" 2>/dev/null; }; then
      kill -TERM "${pids[@]}" 2>/dev/null
      finish 0
      fail "$1 did not print /$2/ within $((30 * scale)) s"
      exit 1
    fi
    sleep 0.1
  done
}

# listening PORT: waits until something on the server's host listens on rdma_cm port PORT
# (`rdma resource show cm_id`), for at most 30 s (scaled): for a tool that says nothing when it
# does (udaddy).
listening() {
  local deadline=$((SECONDS + 30 * scale)) out
  while ((SECONDS < deadline)); do
    if [ ${#on_server[@]} -gt 0 ]; then
      out=$("${on_server[0]}" run -t 5 rdma resource show cm_id 2>/dev/null)
    else
      out=$(rdma resource show cm_id 2>/dev/null)
    fi
    grep -Eq "state LISTEN .*src-addr [^ ]+:$1( |\$)" <<<"$out" && return 0
    sleep 0.2
  done
  kill -TERM "${pids[@]}" 2>/dev/null
  finish 0
  fail "nothing listened on port $1 within $((30 * scale)) s"
  exit 1
}

# finish STATUS: waits for every process started, shows its output, and checks its status (any:
# only that it finished in time; each one's status is then in exit_of[LABEL]).
declare -A exit_of=()
finish() {
  local expected=$1 i status
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    status=$?
    exit_of[${labels[$i]}]=$status
    echo "---- ${labels[$i]}: exit $status"
    cat "$work/${labels[$i]}.out"
    sed 's/^/stderr: /' "$work/${labels[$i]}.err"
    if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
      fail "${labels[$i]} did not finish within $limit s"
    elif [ "$expected" != any ] && [ "$status" -ne "$expected" ]; then
      fail "${labels[$i]} exited with $status, expected $expected"
    fi
  done
  pids=() labels=()
}

# echoing PID SECONDS: waits until a connection of process PID (a client started here) is in the
# middle of its traffic: one of its RC queue pairs (`rdma resource show qp` names the thread that
# made it) is in RTS, and the device has received 20 packets more since then (rxe's rcvd_pkts
# counter: more than a handshake's exchange, so the echoes or the ping-pong run). The QP's
# rq-psn is no such sign: across two hosts `rdma` showed it unchanged while the ping-pong ran.
# Returns 1 if that did not happen within SECONDS.
echoing() {
  local pid=$1 deadline=$((SECONDS + $2)) base="" now task rts counters
  counters=(/sys/class/infiniband/*/ports/1/hw_counters/rcvd_pkts)
  if [ ${#counters[@]} -eq 0 ]; then
    echo "echoing: the device has no rcvd_pkts counter (/sys/class/infiniband/*/ports/1/hw_counters)"
    return 1
  fi
  while ((SECONDS < deadline)) && kill -0 "$pid" 2>/dev/null; do
    rts=0
    while read -r task; do
      [ -e "/proc/$pid/task/$task" ] && rts=1
    done < <(rdma resource show qp 2>/dev/null | sed -En 's/^.* type RC state RTS .* pid ([0-9]+) .*$/\1/p')
    if ((rts)); then
      now=$(cat "${counters[0]}")
      if [ -z "$base" ]; then base=$now; elif ((now - base >= 20)); then return 0; fi
    fi
    sleep 0.2
  done
  echo "echoing: pid $pid had no RC QP in RTS with 20 packets received since (rcvd_pkts from ${base:-none} to ${now:-none}); this host's QPs:"
  rdma resource show qp 2>&1 | sed 's/^/  /'
  return 1
}

# child_of PID: prints the process that PID (a timeout(1) started here) runs, waiting up to 5 s
# for it; returns 1 if there is none.
child_of() {
  local child _
  for _ in {1..50}; do
    child=$(pgrep -P "$1") && { echo "$child"; return 0; }
    sleep 0.1
  done
  return 1
}

# expect LABEL REGEX [COUNT]: LABEL's stdout has COUNT (default 1) lines matching REGEX.
expect() {
  local n
  n=$(grep -Ec -- "$2" "$work/$1.out")
  [ "$n" -eq "${3:-1}" ] || fail "$1 printed $n lines matching /$2/, expected ${3:-1}"
}
# expect_err LABEL REGEX: LABEL's stderr matches REGEX.
expect_err() {
  grep -Eq -- "$2" "$work/$1.err" || fail "$1 did not say /$2/ on stderr"
}

if [ "$case_name" != help ]; then
  devices=(/sys/class/infiniband/*)
  if [ ${#devices[@]} -eq 0 ]; then
    echo "$case_name: skipped: no RDMA device (run it in the SoftRoCE VM: scripts/rxe-vm)"
    exit 77
  fi
fi

case $case_name in
  help)
    for prog in write_pingpong send_recv echo_epoll echo_threads read_remote atomic_counter srq_server datagram rail_mover $( [ -x "$bin/echo_asio" ] && echo echo_asio kv_asio); do
      start help --help
      finish 0
      expect help "^Usage: $prog \[-p PORT\] \[-a BIND_ADDR\] \[options\] +\(server\)$"
      expect help "^  -t SECONDS "
      start bad -q 1
      finish 1
      expect_err bad "^$prog: unknown option -q \(see --help\)$"
    done
    prog=multicast  # no server or client: a receiver or a sender
    start help --help
    finish 0
    expect help '^Usage: multicast \[-a BIND_ADDR\] \[-n MESSAGES\] \[-s SIZE\] \[-t SECONDS\] GROUP +\(receiver\)$'
    start bad -q 1
    finish 1
    expect_err bad '^multicast: unknown option -q \(see --help\)$'
    ;;
  write_pingpong)
    # Small messages for the latency, then multi-packet ones (rxe's MTU is 1024 here).
    runs=("1000 8" "50 65536")
    ((few)) && runs=("50 65536")
    for run in "${runs[@]}"; do
      read -r n size <<<"$run"
      start_server -n "$n" -s "$size"
      start client -p "$port" -n "$n" -s "$size" "$server_addr"
      finish 0
      expect client "^write_pingpong: $n iterations of $size bytes: latency median [0-9.]+ us, p99 [0-9.]+ us, min [0-9.]+ us, avg [0-9.]+ us \(half round trip\)$"
      expect server "^write_pingpong: answered $n messages of $size bytes from $addr:[0-9]+$"
    done
    ;;
  write_pingpong.mismatch)
    # Each side checks the other's parameters from the handshake, and both refuse.
    start_server -n 10
    start client -p "$port" -n 20 "$server_addr"
    finish 1
    expect_err server "^write_pingpong: the peer runs with 'iters 20 size 8', we with 'iters 10 size 8': give both the same -n and -s$"
    expect_err client "^write_pingpong: the peer runs with 'iters 10 size 8', we with 'iters 20 size 8'"
    ;;
  write_pingpong.killed)
    # The server dies (kill -9) in the middle of a long run. rdma_cm tells the client within
    # milliseconds; the client, busy-polling for the server's answer, must say that the peer
    # disconnected, not fail seconds later on a flushed request (7.9 s, "Work Request Flushed",
    # before spin()). The message is the check. The time is printed; its bound only catches a
    # hang, since the kill reaches the peer only once the kernel has torn the dying process
    # down, which took from 1.7 to 6.9 s for an ASan build's server (55 ms for a plain one).
    start_server -n 100000000
    start client -p "$port" -n 100000000 "$server_addr"
    # Killed once the client is in the middle of the ping-pong: a fixed 3 s was not enough under
    # ASan in CI, and the client connected only after the kill ("no listener on that port").
    client=$(child_of "${pids[1]}") || fail "the client's process was not found under its timeout(1) (pid ${pids[1]})"
    [ -n "$client" ] && { echoing "$client" $((30 * scale)) || fail "the client (pid $client) was not in its ping-pong within $((30 * scale)) s"; }
    if [ ${#on_server[@]} -gt 0 ]; then
      "${on_server[0]}" kill server KILL  # on the other host: the job's process group
    else
      pkill -KILL -P "${pids[0]}"  # the server itself, not the timeout(1) that runs it
    fi
    killed=$(date +%s%N)
    wait "${pids[1]}"
    status=$?
    took_ms=$((($(date +%s%N) - killed) / 1000000))
    wait "${pids[0]}" 2>/dev/null
    echo "---- client: exit $status, ${took_ms} ms after the server was killed"
    sed 's/^/stderr: /' "$work/client.err"
    pids=() labels=()
    [ "$status" -eq 1 ] || fail "the client exited with $status, expected 1"
    expect_err client "the peer disconnected"
    [ "$took_ms" -lt $((20000 * scale)) ] || fail "the client took $took_ms ms to notice (expected < $((20000 * scale)))"
    ;;
  send_recv)
    # Three clients at once, each with its own message size and count.
    # (Under a wrapper the first two.)
    clients=3 total=600
    ((few)) && clients=2 total=400
    start_server -c $clients
    start client1 -p "$port" -n 300 -s 64 "$server_addr"
    start client2 -p "$port" -n 100 -s 4096 "$server_addr"
    ((few)) || start client3 -p "$port" -n 200 -s 1 "$server_addr"
    finish 0
    expect client1 '^send_recv: 300 messages of 64 bytes echoed and checked$'
    expect client2 '^send_recv: 100 messages of 4096 bytes echoed and checked$'
    ((few)) || expect client3 '^send_recv: 200 messages of 1 bytes echoed and checked$'
    expect server "^send_recv: $addr:[0-9]+ left after (300|100|200) echoes$" $clients
    expect server "^send_recv: served $clients clients, $total messages$"
    ;;
  echo_epoll | echo_asio | echo_threads)
    # One thread (echo_threads: a thread per connection) serves 53 clients: one silent (dropped at the server's 5 s idle limit), one
    # killed mid-run (the server notices on its rdma_cm fd and goes on), 50 at once with every
    # echo checked, then one more, which proves the server still serves. No round of its loop
    # may take 1 s (echo_epoll: it never blocks but in epoll_wait; echo_asio: its heartbeat
    # never wakes 1 s late); sanitized builds set their own bound (tests/examples/tests.cmake).
    start_server -c 53 -i 5
    start silent -p "$port" -n 0 -w 12 "$server_addr"
    start victim -p "$port" -n 100000000 "$server_addr"
    # Killed once it is echoing: a fixed 2 s was not enough under ASan in CI, and the victim died
    # in its handshake (the server said "the handshake failed", not "gone").
    if ! victim=$(child_of "${pids[2]}"); then  # the victim itself, not the timeout(1) that runs it
      fail "the victim's process was not found under its timeout(1) (pid ${pids[2]})"
    else
      echoing "$victim" $((30 * scale)) || fail "the victim (pid $victim) was not echoing within $((30 * scale)) s"
      kill -KILL "$victim" 2>/dev/null
    fi
    start many -p "$port" -c 50 -n 100 -s 256 "$server_addr"
    wait "${pids[3]}" || fail "the 50 clients failed"
    start last -p "$port" -n 10 "$server_addr"
    wait "${pids[4]}" || fail "the last client failed"
    wait "${pids[1]}" || fail "the silent client failed"
    wait "${pids[2]}" 2>/dev/null
    wait "${pids[0]}" || fail "the server failed"
    for label in server silent many last; do
      echo "---- $label:"
      cat "$work/$label.out"
      sed 's/^/stderr: /' "$work/$label.err"
    done
    pids=() labels=()
    expect many "^$prog: 50 connections, 100 messages of 256 bytes each, echoed and checked\$"
    expect last "^$prog: 1 connections, 10 messages of 64 bytes each, echoed and checked\$"
    expect server ': 0 echoes; silent for 5 s: dropped$'
    expect server ': [0-9]+ echoes; (gone|a request failed: .*)$' 52
    if [ "$prog" = echo_threads ]; then  # no loop to take long: each connection blocks on its own
      expect server "^$prog: served 53 clients, [0-9]+ messages \\(1 silent and dropped, [0-9]+ gone\\)\$"
    else
      expect server "^$prog: served 53 clients, [0-9]+ messages \\(1 silent and dropped, [0-9]+ gone\\); longest (step|stall) [0-9]+ ms\$"
      longest=$(sed -En 's/^.*: served .*; longest (step|stall) ([0-9]*) ms$/\2/p' "$work/server.out")
      bound=${VERBS_EXAMPLE_ROUND_BOUND_MS:-$((1000 * scale))}
      [ -n "$longest" ] && [ "$longest" -lt "$bound" ] || fail "a round of the server's loop took ${longest:-?} ms (bound $bound ms)"
    fi
    ;;
  rail_mover)
    # verbs::rails: two rails, 4 QPs each. On one host both lead to the server's one address;
    # across two hosts with a second wire (VERBS_PEER_ADDR2), one rail per wire.
    hosts=$server_addr,${VERBS_PEER_ADDR2:-$server_addr}
    start_server -a "$server_addr${VERBS_PEER_ADDR2:+,$VERBS_PEER_ADDR2}" -s 8M
    start client -p "$port" -s 8M -n 3 "$hosts"
    finish 0
    expect client '^rail_mover: 2 of 2 rails up, 4 QPs each; a silent rail is noticed within [0-9]+ ms$'
    expect client '^rail_mover: round [123]: 8388608 bytes in [0-9.]+ s \([0-9.]+ MB/s\), chunks per rail [1-9][0-9]*, [1-9][0-9]*, checked$' 3
    expect client '^rail_mover: 3 rounds of 8388608 bytes over 2 rails, every byte checked$'
    expect server '^rail_mover: served 8 connections; the client went$'
    ;;
  datagram)
    # UD through rdma_cm: the client resolves the server's QP (SIDR), sends, and gets as many
    # replies, sent to the QP number in its immediate data.
    start_server -n 20 -s 256
    start client -p "$port" -n 20 -s 256 "$server_addr"
    finish 0
    expect client '^datagram: resolved .*: QP [0-9]+, Q_Key 0x1234567$'
    expect client '^datagram: sent 20 messages of 256 bytes and received as many replies$'
    expect server "^datagram: $addr:[0-9]+: received 20 messages of 256 bytes and answered each\$"
    ;;
  datagram.udaddy)
    # rdma-core's udaddy against ours both ways, on its port (7174): its server and our client,
    # then our server and its client. udaddy says "return status 0" when all went through.
    command -v udaddy >/dev/null || { echo "$case_name: skipped: no udaddy (rdmacm-utils)"; exit 77; }
    start_tool server udaddy -b "$server_addr"
    listening 7174
    start client -p 7174 "$server_addr"
    finish 0
    expect client '^datagram: sent 10 messages of 100 bytes and received as many replies$'
    expect server '^return status 0$'
    start_server -p 7174
    start_tool client udaddy -s "$server_addr" -b "$addr"
    finish 0
    expect client '^return status 0$'
    expect server "^datagram: $addr:[0-9]+: received 10 messages of 100 bytes and answered each\$"
    ;;
  multicast)
    # Two receivers (one on the server's host) join a group, then a sender sends to it.
    group=239.1.3.1
    start server -a "$server_addr" -n 20 -s 200 "$group"
    start receiver -a "$addr" -n 20 -s 200 "$group"
    wait_line server '^multicast: joined '
    wait_line receiver '^multicast: joined '
    start sender -S -a "$addr" -n 20 -s 200 "$group"
    finish 0
    expect sender "^multicast: sent 20 messages of 200 bytes to $group\$"
    expect server "^multicast: received 20 messages of 200 bytes from $group\$"
    expect receiver "^multicast: received 20 messages of 200 bytes from $group\$"
    ;;
  multicast.mckey)
    # rdma-core's mckey against ours both ways: its receiver and our sender, then ours and its.
    command -v mckey >/dev/null || { echo "$case_name: skipped: no mckey (rdmacm-utils)"; exit 77; }
    group=239.1.3.2
    start_tool server stdbuf -oL mckey -m "$group" -b "$server_addr"  # its lines as they come, not at exit
    wait_line server '^mckey: joined dgid'
    start client -S -a "$addr" "$group"
    finish 0
    expect server '^return status 0$'
    expect client "^multicast: sent 10 messages of 100 bytes to $group\$"
    # mckey as the sender posts its sends unsignaled and destroys its QP at once. rxe of Linux
    # 6.12 and later sends from a work queue, after that: some or all of mckey's sends are lost
    # there (mckey against itself too), which is mckey's own loss, not a failure to interoperate
    # (the direction above carries that verdict). There our receiver waits 10 s, and either takes
    # all 10 or says how many came.
    lossy=0
    IFS=. read -r major minor _ <<<"$(uname -r)"
    if [ "${major:-0}" -gt 6 ] || { [ "${major:-0}" -eq 6 ] && [ "${minor:-0}" -ge 12 ]; }; then lossy=1; fi
    if [ "$lossy" = 1 ]; then start server -a "$server_addr" -t 10 "$group"; else start server -a "$server_addr" "$group"; fi
    wait_line server '^multicast: joined '
    start_tool client mckey -m "$group" -b "$addr" -s
    if [ "$lossy" = 0 ]; then
      finish 0
      expect client '^return status 0$'
      expect server "^multicast: received 10 messages of 100 bytes from $group\$"
    else
      finish any
      [ "${exit_of[client]}" -eq 0 ] || fail "mckey exited with ${exit_of[client]}, expected 0"
      expect client '^return status 0$'
      if [ "${exit_of[server]}" -eq 0 ]; then
        expect server "^multicast: received 10 messages of 100 bytes from $group\$"
      else
        [ "${exit_of[server]}" -eq 1 ] || fail "our receiver exited with ${exit_of[server]}, expected 0 or 1"
        expect_err server '^multicast: received [0-9] of 10 messages; nothing more within 10 s$'
        echo "$case_name: mckey's own loss on Linux $(uname -r): $(grep -o 'received [0-9]* of 10' "$work/server.err")"
      fi
    fi
    ;;
  kv_asio)
    # Eight connections from coroutines on one thread, each reading 100 entries of the exposed
    # table with a deadline on every wait; the server watches each one leave.
    start_server -c 8
    start client -p "$port" -c 8 -n 100 "$server_addr"
    finish 0
    expect client '^kv_asio: 8 connections read 800 entries \(100 each\), all as expected, in [0-9]+ ms$'
    expect server '^kv_asio: served 8 clients$'
    [ "$(grep -c ' left$' "$work/server.out")" = 8 ] || fail "the server did not see 8 clients leave"
    ;;
  read_remote)
    # The default 1 MiB, in reads of a size that does not divide it.
    start_server
    start client -p "$port" -k 100000 "$server_addr"
    finish 0
    expect client '^read_remote: read 1048576 bytes in 11 reads of up to 100000 bytes \([0-9.]+ MB/s\): all as expected$'
    expect server "^read_remote: $addr:[0-9]+ read and checked 1048576 of 1048576 bytes$"
    ;;
  atomic_counter)
    clients=(1 2 3 4)
    ((few)) && clients=(1 2)
    start_server -c ${#clients[@]}
    for k in "${clients[@]}"; do start client$k -p "$port" -n 250 "$server_addr"; done
    finish 0
    for k in "${clients[@]}"; do
      expect client$k '^atomic_counter: 250 adds returned distinct, increasing values from [0-9]+ to [0-9]+$'
    done
    total=$((250 * ${#clients[@]}))
    expect server "^atomic_counter: ${#clients[@]} clients announced $total adds; counter = $total\$"
    ;;
  srq_server)
    counts=(100 100 50 150)
    ((few)) && counts=(100 150)
    start_server -c ${#counts[@]}
    k=0
    for n in "${counts[@]}"; do start client$((++k)) -p "$port" -n $n "$server_addr"; done
    finish 0
    for ((k = 1; k <= ${#counts[@]}; k++)); do expect client$k '^srq_server: sent [0-9]+ messages$'; done
    expect server "^srq_server: QP [0-9]+ \($addr:[0-9]+\): (100|50|150) messages, all in order$" ${#counts[@]}
    total=0
    for n in "${counts[@]}"; do total=$((total + n)); done
    expect server "^srq_server: ${#counts[@]} connections, $total messages through one shared receive queue\$"
    ;;
  *)
    echo "run.sh: unknown case '$case_name'" >&2
    exit 2
    ;;
esac

if [ "$failed" -ne 0 ]; then
  echo "$case_name: FAILED"
  exit 1
fi
echo "$case_name: passed"
