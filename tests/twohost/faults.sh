#!/usr/bin/env bash
# The faults a network brings, between the two hosts of scripts/rxe-pair: run on host b (the
# client side, 192.0.2.2) by tests/twohost/run.sh, with host a (192.0.2.1) driven by scripts/pair.
# Traffic is tests/twohost/wire_peer (every byte and every atomic checked); each case prints how
# long the transfer, or the failure, took.
#
# Usage: faults.sh CASE WIRE_PEER VERBS_INFO
# Each of loss1, loss5, delay, reorder, duplicate and soak first runs its traffic with no fault (a
# control, whose rxe counters must stay at 0; an unclean one runs again, up to 5 in all), then
# with the fault, whose counters must show it.
#   loss1, loss5          netem loss of 1% / 5% on both hosts' eth0: every round completes, checked
#                         (loss5 with messages of at most 4 KiB: see there); netem dropped packets
#                         and rxe recovered
#   delay                 15 ms each way and 1-15 ms of jitter, in order: every round completes
#   reorder               5% of packets overtake the rest (5 ms late)
#   duplicate             5% of packets twice: the responders saw duplicates, and in a phase of
#                         atomics alone host a saw one twice; no atomic executes twice
#   link_down_survives    host a's eth0 down for 2 s mid-run, with an ack timeout of 1.07 s (retry
#                         budget > 7 s): data intact; each connection survives or exhausts its
#                         retries within the budget, and the next one works. By hand only (not in
#                         ctest): on rxe 6.1 it fails, for the kernel's reasons: a QP that sends
#                         while its netdev is down fails at once (LOC_QP_OP_ERR), and in 2 of 3
#                         flaps a 48 KiB read completed successfully with wrong data, while host b's
#                         kernel logged a WARNING in rxe_completer (rxe_comp.c:756); see
#                         tests/twohost/tests.cmake
#   link_cut_survives     all of host a's packets lost for 2 s mid-run, ACK timeout 17 (a retry
#                         budget of about 15 s): both connections survive, every round checked
#   link_cut_fails        all of host a's packets lost for 17 s (the wire cut), ACK timeout 17
#                         (see emu below): the client fails within its retry bound, the server
#                         drops the connections, and once the wire is back a new one works
#   host_killed           host a powered off while the client awaits an echo: the client (its probe)
#                         fails within the retry bound; host a boots again and the next connection
#                         works
#   server_survives       the server on host b, its client on host a; host a powered off: the
#                         server drops that connection within its idle limit of the client's last
#                         message (the server's own measure) and, once host a is back, serves the
#                         next client
#   connect_down_host     connecting to host a while it is off: an address-resolution failure
#                         within the connect's time limits
#   connect_no_listener   connecting to a port nobody listens on: rejected at once
#   mtu_mismatch          host a's eth0 set to MTU 9000 (RDMA MTU 4096), host b's at 1500 (1024):
#                         `verbs-info --check --peer` names it on both hosts; traffic
#                         checked with each host as the client (verbs uses the smaller MTU); then
#                         host a back at 1500, and the check passes
#   soak                  8 connections of mixed traffic (messages of at most 16 KiB) for VERBS_SOAK_SECONDS (default 60:
#                         the suite's budget is short; 120, the default until session 24, found nothing 60 did not) with
#                         1% loss: 0 lost, 0 wrong
# Exit status: 0 passed, 1 failed.
set -uo pipefail
case_name=$1
peer=$2
info=$3
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
pair=$top/scripts/pair
a=${VERBS_PEER_ADDR:?run under scripts/rxe-pair}
b=${VERBS_TEST_ADDR:?}
[[ -x $peer ]] || { echo "faults.sh: $peer is not built" >&2; exit 1; }
work=$(mktemp -d)
spid=
failed=0
# The cases run on the pair that other tests share (tests/twohost/tests.cmake): each leaves the
# wire and host a as it found them, whatever happened: no netem qdisc on either host's eth0 (the
# cases that put one on host a say so in a_wire), no server of its own on host a (its port would
# refuse the next case's), host a up (the cases that power it off) with its eth0 at MTU 1500
# (a_mtu: mtu_mismatch). A case that cannot undo its fault fails.
a_wire=0 a_mtu=0
cleanup() {
  if [[ -n $spid ]]; then
    "$pair" kill server KILL
    kill "$spid" 2>/dev/null
  fi
  wait  # a fault still being made on host a (the wire cuts) is made before it is taken away
  # (After that wait: a power-off still being asked for is done before host a boots again.)
  if [[ -e ${VERBS_PAIR_DIR:-}/a.off ]]; then
    "$pair" boot >/dev/null && echo "host a booted again (the next case finds it up)" ||
      { echo "FAIL: host a, powered off, did not boot again"; failed=1; }
  fi
  # The server gone before the next case starts one on its port (a kill is only asked for).
  if [[ -n $spid && ! -e ${VERBS_PAIR_DIR:-}/a.off ]]; then
    "$pair" wait server 30 >/dev/null 2>&1
    (($? == 124)) && { echo "FAIL: the server on host a did not end within 30 s of its kill"; failed=1; }
  fi
  tc qdisc del dev eth0 root 2>/dev/null
  if ((a_wire)) && [[ ! -e ${VERBS_PAIR_DIR:-}/a.off ]]; then
    "$pair" run -t 60 sh -c 'tc qdisc del dev eth0 root 2>/dev/null; ! tc qdisc show dev eth0 | grep netem' ||
      { echo "FAIL: the netem qdisc on host a's eth0 could not be taken away"; failed=1; }
  fi
  if ((a_mtu)) && ! "$pair" run -t 60 sh -c 'ip link set eth0 mtu 1500 && grep -qx 1500 /sys/class/net/eth0/mtu'; then
    echo "FAIL: host a's eth0 could not be set back to MTU 1500"
    failed=1
  fi
  rm -rf "$work"
  ((failed == 0)) || exit 1
}
trap cleanup EXIT
# ... and checks that it found them so, on both hosts: on a faulty wire a case would measure an
# earlier case's fault, not its own.
[[ $(tc qdisc show dev eth0) == *netem* ]] && { echo "FAIL: this host's eth0 has a netem qdisc an earlier test left"; exit 1; }
if ! "$pair" run -t 60 sh -c '! tc qdisc show dev eth0 | grep netem'; then
  a_wire=1  # taken away on exit: the cases after this one find a clean wire
  echo "FAIL: host a's eth0 has a netem qdisc an earlier test left (or host a did not answer)"
  exit 1
fi
fail() {
  echo "FAIL: $*"
  failed=1
}
now_ms() { date +%s%3N; }

# The cases about data (loss, delay, reordering, duplication, the soak) give the transport an ACK
# timeout of 537 ms (17): an emulated host (QEMU TCG, two guests on two CPUs) stalls for half a
# second now and then, which the default's 7 tries of 67 ms do not outlast (measured: in the
# soak, 7 of 8 connections failed at once, 0.48 s after their last post). On a NIC the default
# is right; here it would test the emulation's scheduling, not RC's retransmission. The server
# takes it too: its echoes are requests of its own (link_cut_survives showed what a server at the
# defaults does to its clients).
emu=(--ack-timeout 17)
# The failure cases (link_cut_fails, host_killed) use it too: with the defaults, a stall before
# the fault once failed a connection 3.1 s before it (RETRY_EXC_ERR 486 ms after its last post).
# Their bound is the one wire_peer prints for its options, plus its probe interval: while a
# client waits for an echo it probes the server with a read (nothing else of it is outstanding).

# client_bound NAME: the bound wire_peer run printed for its options, plus the 200 ms between its
# probes, in ms (status 1 and nothing printed when it printed none).
client_bound() {
  sed -n 's/^wire_peer: a request fails within \([0-9]*\) ms of a silent peer; an echo awaited probes it every [0-9]* ms$/\1/p' "$work/$1" |
    { read -r b && echo $((b + 200)); }
}

# netem ARGS...: the same netem qdisc on both hosts' eth0 (loss or delay both ways).
netem() {
  echo "netem on both hosts: $*"
  a_wire=1
  tc qdisc add dev eth0 root netem "$@" || { fail "tc netem $* here"; return 1; }
  "$pair" run tc qdisc add dev eth0 root netem "$@" || { fail "tc netem $* on host a"; return 1; }
}

# Every fault case shows that its fault happened, and a control shows the same traffic without
# it sees none of that: counters are read on both hosts before and after a phase. rxe's own
# (hw_counters of rxe0's port: requests a responder saw twice or out of order, NAKs for a
# sequence error a requester received, its retransmissions after an ACK timeout) and netem's
# (tc -s: packets it dropped, and those it sent ahead of the others, its "requeues": a
# reordering).
# Read with bash's builtins and one tc: a process costs about 0.1 s in an emulated guest, and
# a snapshot is taken twice a phase on both hosts.
counters_here() {
  local h=$1 d=/sys/class/infiniband/rxe0/ports/1/hw_counters f v q
  for f in duplicate_request out_of_seq_request rcvd_seq_err completer_retry_err; do
    v=missing
    [[ -r $d/$f ]] && read -r v <"$d/$f"
    echo "$h.$f $v"
  done
  q=$(tc -s qdisc show dev eth0)
  [[ $q =~ \(dropped\ ([0-9]+), ]] && v=${BASH_REMATCH[1]} || v=0
  echo "$h.netem_dropped $v"
  # (The first qdisc's requeues: netem's packets put ahead while it is there, the default
  # qdisc's device requeues before, a few in a control.)
  [[ $q =~ requeues\ ([0-9]+)\) ]] && v=${BASH_REMATCH[1]} || v=0
  echo "$h.netem_reordered $v"
}
counters_fn=$(declare -f counters_here)
# snapshot FILE: both hosts' counters ("a.NAME VALUE", "b.NAME VALUE").
snapshot() {
  { counters_here b; "$pair" run bash -c "$counters_fn; counters_here a"; } >"$1"
}
# deltas BEFORE AFTER: "NAME DIFFERENCE" for each counter (printed by the caller).
deltas() { awk 'NR == FNR { v[$1] = $2; next } { print $1, $2 - v[$1] }' "$1" "$2"; }
# sum_of DELTAS NAME...: the sum of those counters' differences (NAME like a.duplicate_request).
sum_of() {
  local file=$1
  shift
  awk -v names=" $* " 'index(names, " " $1 " ") { s += $2 } END { print s + 0 }' "$file"
}
# phase NAME CMD...: runs a checked client phase between two snapshots; the differences are in
# $work/NAME.deltas, printed on one line.
phase() {
  local name=$1
  shift
  snapshot "$work/$name.before" || { fail "cannot read the counters before $name"; return 1; }
  checked "$name" "$@"
  snapshot "$work/$name.after" || { fail "cannot read the counters after $name"; return 1; }
  deltas "$work/$name.before" "$work/$name.after" >"$work/$name.deltas"
  grep -q missing "$work/$name.after" && fail "a counter is missing: $(grep missing "$work/$name.after" | tr '\n' ' ')"
  echo "counters over $name: $(tr '\n' ' ' <"$work/$name.deltas")"
}
# seen NAME WHAT NAMES...: the fault showed in those counters over phase NAME (their sum > 0).
seen() {
  local name=$1 what=$2 n
  shift 2
  n=$(sum_of "$work/$name.deltas" "$@")
  echo "$what: $n ($*)"
  ((n > 0)) || fail "$what: none over $name ($*): did the fault happen?"
}
# more_than_resent NAME WHAT: over phase NAME the responders saw more duplicates than the
# requesters' own retransmissions (after an ACK timeout or a NAK) can account for: so netem made
# some of them, not a stall of the emulation. Strict only where each request is one packet and
# one is outstanding at a time (the atomics phase): a retry resends at most one.
more_than_resent() {
  local dup resent
  dup=$(sum_of "$work/$1.deltas" a.duplicate_request b.duplicate_request)
  resent=$(sum_of "$work/$1.deltas" {a,b}.{completer_retry_err,rcvd_seq_err})
  echo "$2: $dup, retransmissions that could explain some: $resent"
  ((dup > resent)) || fail "$2: $dup, no more than the $resent retransmissions: did netem duplicate anything?"
}
# control ARGS...: the case's traffic with no fault on the wire (before it is made): every rxe
# counter above must stay at 0, or the fault case's counts would prove nothing. A stall of the
# emulation longer than the ACK timeout (a guest not scheduled for half a second on a loaded
# host; seen once in CI: one retransmission, 47 duplicates, one round of 575 ms) makes a
# requester resend with no fault on the wire. So does something else, with no long round: host
# a resends one 4-packet message and host b counts 4 duplicates (or 1 and 1), in about one
# control of 2 to 4 (reorder's, 30 rounds, on an idle machine; a clean warm-up run just before
# does not prevent it), and in 3 of 3 of a 100-round control on a busy machine, identically.
# Its cause is not known (an ACK lost in the emulated wire?). So an unclean control is run
# again, up to five times in all: the case fails only if none is clean, which a cause in the
# traffic would do.
control() {
  local n attempt
  for attempt in 1 2 3 4 5; do
    phase control "$@" || return
    n=$(sum_of "$work/control.deltas" {a,b}.{duplicate_request,out_of_seq_request,rcvd_seq_err,completer_retry_err} {a,b}.netem_dropped)
    ((n == 0)) && return 0
    echo "control, attempt $attempt of 5: $n duplicates, sequence errors or retransmissions with no fault on the wire"
  done
  fail "the control (no fault) saw duplicates, sequence errors or retransmissions in each of 5 runs: the fault cases' counts prove nothing"
}
# mean_round_ms NAME CONNECTIONS: a phase's mean round on each connection (its whole time, set up
# included, over its rounds), from wire_peer's summary line.
mean_round_ms() {
  sed -n 's/^wire_peer: [0-9]* connections*, \([0-9]*\) rounds ([0-9]* operations) in \([0-9.]*\) s: .*/\1 \2/p' "$work/$1" |
    awk -v c="$2" '$1 > 0 { printf "%d\n", $2 * 1000 * c / $1 }'
}

# serve_on_a [ARGS...]: wire_peer's server on host a, in the background (job "server").
serve_on_a() {
  # What an earlier server left (before host a lost power: its output, its status) must not
  # count as this one's: the wait below starts before `pair exec` has started the new one.
  local out
  out=$("$pair" out server)
  rm -f "$out" "${out%.out}.status" "${out%.out}.taken" "${out%.out}.pid"
  "$pair" exec --name server "$peer" serve -a "$a" -p 7480 "$@" >"$work/server.out" 2>&1 &
  spid=$!
  "$pair" grep server 'listening on' 60 >/dev/null || { fail "the server on host a did not start"; cat "$work/server.out"; exit 1; }
}
stop_server() {
  [[ -n $spid ]] || return 0
  "$pair" kill server TERM
  wait "$spid" 2>/dev/null
  spid=
  echo "---- server (host a):"
  cat "$work/server.out"
}

# client NAME ARGS...: wire_peer run on this host, output in $work/NAME (and shown).
client() {
  local name=$1 rc
  shift
  local t0
  t0=$(now_ms)
  timeout 600 "$peer" run "$a" "$@" >"$work/$name" 2>&1
  rc=$?
  echo "---- $name: exit $rc after $(($(now_ms) - t0)) ms: wire_peer run $a $*"
  cat "$work/$name"
  return "$rc"
}

# checked NAME ARGS...: a client run that must complete with everything checked.
checked() {
  local name=$1
  client "$@" || fail "$name failed"
  grep -q ': 0 lost, 0 wrong$' "$work/$name" || fail "$name did not check out"
}

# failed_within NAME LIMIT_MS SINCE_MS [EARLY_MS]: every connection of NAME failed, each at a
# wall clock at most LIMIT_MS after SINCE_MS and not before it (less EARLY_MS, the error of a
# clock offset): a failure before the fault is not the fault's. Prints the times.
failed_within() {
  local name=$1 limit=$2 since=$3 early=${4:-0} at took n=0
  while read -r at; do
    n=$((n + 1))
    took=$((at - since))
    echo "time to error: $took ms after the fault (bound $limit ms)"
    ((took <= limit)) || fail "$name failed $took ms after the fault, over the bound of $limit ms"
    ((took >= -early)) || fail "$name failed $((-took)) ms before the fault: not the fault's doing"
  done < <(sed -n 's/^wire_peer: connection [0-9]*: FAILED .*; at \([0-9]*\)$/\1/p' "$work/$name")
  ((n > 0)) || fail "$name did not fail"
  grep -q '^wire_peer: connection [0-9]*: [0-9]* rounds, ' "$work/$name" && fail "a connection of $name did not fail"
  return 0
}

case $case_name in
  loss1)
    serve_on_a "${emu[@]}"
    control -c 2 -n 20 "${emu[@]}"
    netem loss 1%
    phase client -c 2 -n 60 "${emu[@]}"
    seen client "packets netem dropped" a.netem_dropped b.netem_dropped
    seen client "rxe's recoveries (sequence errors, retransmissions, duplicates)" \
      {a,b}.{out_of_seq_request,rcvd_seq_err,completer_retry_err,duplicate_request}
    stop_server
    ;;
  loss5)
    # Messages of at most 4 KiB (4 packets): on rxe every sequence-error NAK costs a transport
    # retry, so at 5% loss a 48 KiB message (48 packets, ~2.4 lost per try) ran out of its 7
    # tries now and then (RETRY_EXC_ERR after 3.3 s, 1 run in 3).
    serve_on_a "${emu[@]}"
    control -c 2 -n 20 --max-size 4096 "${emu[@]}"
    netem loss 5%
    phase client -c 2 -n 60 --max-size 4096 "${emu[@]}"
    seen client "packets netem dropped" a.netem_dropped b.netem_dropped
    seen client "rxe's recoveries (sequence errors, retransmissions, duplicates)" \
      {a,b}.{out_of_seq_request,rcvd_seq_err,completer_retry_err,duplicate_request}
    stop_server
    ;;
  delay)
    # 15 ms each way plus 1-15 ms of jitter, in order (netem's slots hold packets back in a
    # queue; its plain jitter would reorder them, which is the reorder case): round trips of
    # 32-60 ms. netem counts no delays: the proof is the rounds' length, which a delay can only
    # add to. A round is at least four round trips (write, read, send and its echo, atomic): so
    # at least 4 x 30 ms.
    serve_on_a "${emu[@]}"
    control -c 2 -n 30 "${emu[@]}"
    netem delay 15ms slot 1ms 15ms
    phase client -c 2 -n 30 "${emu[@]}"
    fast=$(mean_round_ms control 2) slow=$(mean_round_ms client 2)
    echo "mean round: ${fast:-?} ms without the delay, ${slow:-?} ms with it (the same rounds)"
    [[ -n $fast && -n $slow ]] || fail "no mean round from wire_peer's summaries"
    ((${slow:-0} >= ${fast:-0} + 120)) ||
      fail "the mean round took ${slow:-?} ms with 15 ms each way, ${fast:-?} ms without: not 4 round trips of 30 ms more: was there a delay?"
    stop_server
    ;;
  reorder)
    # 2% of packets overtake the others (sent at once, the rest 5 ms late). A packet that comes
    # early makes the responder NAK a sequence error and the requester go back: on rxe every such
    # NAK costs a transport retry, so heavy reordering ends a connection (25% did, in 0.6 s; 5%
    # on Linux 6.12 in 1 run of 3, RETRY_EXC_ERR after 3.5 s, while 6.1 came through). No
    # correlation: netem's ("reorder 5% 50%", this case until then) averages each draw with the
    # last, and so made almost none (0 of 1008 UDP packets on 6.1 and 6.12; 54 without it): the
    # recoveries 6.1 showed then were not from reordering. Its control at 30 rounds, as delay's
    # (not the fault phase's 100): a longer control is more often unclean (see control()), and
    # 30 clean rounds show the traffic alone makes none of the fault phase's hundreds of
    # recoveries.
    serve_on_a "${emu[@]}"
    control -c 2 -n 30 "${emu[@]}"
    netem delay 5ms reorder 2%
    phase client -c 2 -n 100 "${emu[@]}"
    seen client "packets netem sent ahead of the others" a.netem_reordered b.netem_reordered
    # rxe's recoveries show the reordering arrived (none in the control). They are
    # mostly retransmissions: an ACK or read response that comes early makes the requester go
    # back (completer_retry_err) and the responder see those requests again (duplicate_request);
    # a request that comes early is out_of_seq_request, NAKed (rcvd_seq_err). Measured by hand:
    # 16 duplicates and 4 retries over 40 rounds at 5% (2 and 5 in two other runs: so 100 rounds
    # here), and all four kinds by the dozen at 25%.
    seen client "rxe's recoveries from reordering (sequence errors, retransmissions, duplicates)" \
      {a,b}.{out_of_seq_request,rcvd_seq_err,completer_retry_err,duplicate_request}
    stop_server
    ;;
  duplicate)
    serve_on_a "${emu[@]}"
    control -c 2 -n 20 "${emu[@]}"
    netem duplicate 5%
    phase client -c 2 -n 100 "${emu[@]}"
    seen client "requests the responders saw twice" a.duplicate_request b.duplicate_request
    # Atomics alone, so that a duplicate host a's responder sees is an atomic's: each must
    # execute once (wire_peer checks every fetch-and-add's old value and the counter at the end).
    phase atomics -c 1 -n 300 --atomics-only "${emu[@]}"
    seen atomics "fetch-and-adds host a saw twice (and executed once: the values checked out)" a.duplicate_request
    more_than_resent atomics "fetch-and-adds host a saw twice"
    stop_server
    ;;
  link_down_survives)
    # A 2 s outage inside a retry budget of 7 tries of 1.07 s (ack_timeout 18). Measured on rxe:
    # a connection mostly survives, but now and then one whose request was in flight ends with
    # RETRY_EXC_ERR after the whole budget although the link was back after 2 s (rxe's
    # retransmission, with loss or with the link down alike). So: every round checked, each
    # connection either completes or fails with the retry error within the budget (no other
    # error, no wrong data), and a new connection works afterwards.
    serve_on_a
    a_wire=1
    (sleep 3 && "$pair" run sh -c 'ip link set eth0 down; sleep 2; ip link set eth0 up' && echo "host a: eth0 was down for 2 s") &
    lpid=$!
    client client -c 2 -t 12 --ack-timeout 18
    wait "$lpid"
    grep -q 'read back other bytes than written' "$work/client" &&
      fail "a read completed successfully with wrong data after the outage (an rxe bug; host b's kernel: $(dmesg | grep -m1 -o 'WARNING: .* at drivers/infiniband/sw/rxe/[a-z_]*\.c:[0-9]*' || echo 'no rxe warning'))"
    survived=$(grep -c '^wire_peer: connection [0-9]*: [0-9]* rounds, [0-9]* operations, all checked$' "$work/client")
    lost=$(grep -c '^wire_peer: connection [0-9]*: FAILED .*: transport retry counter exceeded (12) after [0-9]* ms; at ' "$work/client")
    echo "connections that survived the outage: $survived of 2 (the others: transport retries exhausted)"
    ((survived + lost == 2)) || fail "a connection failed otherwise than by exhausting its retries"
    while read -r ms; do
      ((ms <= 4 * 1074 * 7 + 1000)) || fail "a connection took $ms ms to fail, over its budget"
    done < <(sed -n 's/^wire_peer: connection [0-9]*: FAILED .* after \([0-9]*\) ms; at .*/\1/p' "$work/client")
    checked again -n 20 --ack-timeout 18
    stop_server
    ;;
  link_cut_survives)
    # All of host a's packets lost for 2 s mid-run (the wire cut, not the link down: see
    # link_down_survives), inside a retry budget of 7 tries of 537 ms (ACK timeout 17) on both
    # sides: both connections go on, every round checked, and a new connection works afterwards.
    # The server's echoes need that budget as much as the client's requests: with the default
    # (7 tries of 67 ms, about 0.5 s on rxe) its QPs failed during the cut, and then every
    # connection ran out of its retries 3.8 s into the cut (measured, 3 runs of 3).
    serve_on_a "${emu[@]}"
    a_wire=1
    ("$pair" run sh -c 'sleep 3; tc qdisc add dev eth0 root netem loss 100%; sleep 2; tc qdisc del dev eth0 root && echo "host a: the wire was cut for 2 s"' >"$work/down" 2>&1) &
    lpid=$!
    checked client -c 2 -t 10 "${emu[@]}"
    wait "$lpid"
    cat "$work/down"
    grep -q 'cut for 2 s' "$work/down" || fail "the wire was not cut (host a did not say so)"
    # The cut held the traffic up: on each connection, the round it fell into waited it out.
    n=0
    while read -r ms; do
      n=$((n + 1))
      ((ms >= 1500)) || fail "a connection's longest round took $ms ms: the 2 s cut did not hold it up"
    done < <(sed -n 's/^wire_peer: connection [0-9]*: longest round \([0-9]*\) ms$/\1/p' "$work/client")
    ((n == 2)) || fail "the client gave $n connections' longest rounds, not 2"
    checked again -n 20 "${emu[@]}"
    stop_server
    ;;
  link_cut_fails)
    # The server drops the connections it hears nothing from (their goodbye is lost with the
    # link) at its idle limit, 19 s: after the link is back. Dropped during the outage, its
    # goodbye (a DREQ on the CM's QP 1) would be sent on a netdev that is down, which rxe fails
    # (LOC_QP_OP_ERR, as for any QP): measured, rdma_cm on host a then answered no new
    # connection request.
    serve_on_a --idle 19
    # The wire cut (all of host a's packets lost) rather than its link down: on rxe a QP that
    # sends while its netdev is down fails at once (LOC_QP_OP_ERR), and when that happened to
    # the server's QPs and then to its CM's goodbye, rdma_cm on host a answered no new request.
    a_wire=1
    ("$pair" run sh -c 'sleep 3; date +%s%3N >/run/down-at; tc qdisc add dev eth0 root netem loss 100%; sleep 17; tc qdisc del dev eth0 root; echo "down at $(cat /run/down-at)"' >"$work/down" 2>&1) &
    lpid=$!
    # 17 s: longer than the bound (15.03 s for ACK timeout 17, plus the probe's 0.2 s and 1 s of
    # slack), so a connection that outlasted the cut would fail the test.
    client client -c 2 -t 30 "${emu[@]}" && fail "the client did not fail with the link down for 17 s"
    wait "$lpid"
    # The clocks of the two guests differ: the bound is checked on this host's clock, from the
    # moment host a said it took the link down (its clock) corrected by the offset measured now.
    down_a=$(sed -n 's/^down at \([0-9]*\)$/\1/p' "$work/down")
    # Host a's clock against this one's: the midpoint of a round trip to it.
    t1=$(now_ms)
    ta=$("$pair" run date +%s%3N)
    t2=$(now_ms)
    offset=$(((t1 + t2) / 2 - ta))
    echo "clock offset to host a: $offset ms (+- $(((t2 - t1) / 2)) ms)"
    bound=$(client_bound client) || { fail "the client printed no failure bound"; bound=0; }
    failed_within client $((bound + 1000)) $((down_a + offset)) $(((t2 - t1) / 2 + 200))
    # The outage's two connections, by their ports: each must have been dropped.
    ports=$(sed -n 's/^wire_peer: connection [12] from 192\.0\.2\.2:\([0-9]*\)$/\1/p' "$work/server.out")
    deadline=$((SECONDS + 20))
    for p in $ports; do
      until grep -q "^wire_peer: 192.0.2.2:$p: [0-9]* messages echoed; " "$work/server.out" || ((SECONDS >= deadline)); do
        sleep 0.2
      done
      grep -q "^wire_peer: 192.0.2.2:$p: [0-9]* messages echoed; " "$work/server.out" ||
        fail "the server did not drop the connection from port $p"
    done
    [[ $(wc -w <<<"$ports") == 2 ]] || fail "the server did not log the outage's two connections"
    checked again -n 20 "${emu[@]}"
    stop_server
    ;;
  host_killed)
    # The server holds each echo back 400 ms, so host a most likely vanishes while the client
    # waits for one, with nothing of its own outstanding: its probe must fail within the bound
    # (without it, the wait ran out its 30 s; the rest of a round is link_cut_fails's case).
    serve_on_a --echo-delay 400
    # Host a goes silent somewhere between the request and `pair poweroff` returning (the VM is
    # killed once rxe-pair sees the request: 0.2-1.2 s under load): the bound counts from the
    # request, plus that time, plus 500 ms of slack for the clocks' granularity.
    ("$pair" run sleep 3 && t=$(now_ms) && "$pair" poweroff && echo "$t $(now_ms)" >"$work/off-at" && echo "host a powered off") &
    lpid=$!
    client client -c 2 -t 40 "${emu[@]}" && fail "the client did not fail when host a lost power"
    wait "$lpid"
    read -r asked off <"$work/off-at"
    echo "power-off: asked at $asked, off by $off ($((off - asked)) ms)"
    bound=$(client_bound client) || { fail "the client printed no failure bound"; bound=0; }
    failed_within client $((bound + off - asked + 500)) "$asked"
    spid=
    "$pair" boot && echo "host a booted again"
    serve_on_a
    checked again -n 20 "${emu[@]}"
    stop_server
    ;;
  server_survives)
    timeout 300 "$peer" serve -a "$b" -p 7480 --idle 5 >"$work/server.out" 2>&1 &
    spid=$!
    until grep -q 'listening on' "$work/server.out"; do
      kill -0 "$spid" 2>/dev/null || { fail "the server did not start"; cat "$work/server.out"; exit 1; }
      sleep 0.1
    done
    ("$pair" exec "$peer" run "$b" -c 1 -t 60 >"$work/doomed" 2>&1) &
    until grep -q '^wire_peer: connection 1 from ' "$work/server.out" || ((SECONDS > 60)); do sleep 0.1; done
    sleep 3
    grep -q 'messages echoed; ' "$work/server.out" && fail "the client's connection ended before host a lost power"
    t=$(now_ms)
    "$pair" poweroff && echo "host a powered off ($(($(now_ms) - t)) ms to ask and see it done)"
    off=$(now_ms)
    # The server's connection waits for the next message: it is dropped at the idle limit, counted
    # from the last message (its echo may fail first, with the transport's retries).
    drop='messages echoed; (silent for 5 s: dropped|.*transport retry counter exceeded)'
    deadline=$((SECONDS + 20))
    until grep -Eq "$drop" "$work/server.out" || ((SECONDS >= deadline)); do sleep 0.2; done
    echo "the server dropped the lost client $(($(now_ms) - t)) ms after host a's power-off was asked for"
    seen=$(now_ms)
    if ! grep -Eq "$drop" "$work/server.out"; then
      fail "the server did not drop the lost client within 20 s"
    elif ! line=$(grep -E 'silent for 5 s: dropped' "$work/server.out"); then
      # Its echo failed first (the transport's retries), at most its idle limit after host a was off.
      ((seen - off <= 5000 + 3000)) || fail "the server's echo failed $((seen - off)) ms after host a was off"
    else
      # The server's own figures: its wait ended at its time limit, and the silence began before
      # host a was off. (From the request to the drop took 6.2 s in most runs, 9.1 s in one: the
      # two VMs share two CPUs, and that figure holds the test's own steps, so it is printed, not
      # bounded by more than the 20 s above.)
      re='the wait took ([0-9]+) ms, ([0-9]+) ms since the last message; at ([0-9]+)'
      if [[ $line =~ $re ]]; then
        waited=${BASH_REMATCH[1]} silent=${BASH_REMATCH[2]} at=${BASH_REMATCH[3]}
        echo "the server's wait took $waited ms; $silent ms of silence since the client's last message"
        ((waited >= 5000)) || fail "the server's 5 s wait returned after $waited ms"
        ((silent <= 5000 + 3000)) || fail "the server dropped the client $silent ms after its last message (idle limit 5 s)"
        ((at - silent <= off)) || fail "the server heard host a $((at - silent - off)) ms after it was off"
      else
        fail "no figures in the server's line: $line"
      fi
    fi
    "$pair" boot && echo "host a booted again"
    "$pair" run -t 120 "$peer" run "$b" -n 20 >"$work/next" 2>&1 || fail "the next client (host a, booted again) failed"
    cat "$work/next"
    grep -q ': 0 lost, 0 wrong$' "$work/next" || fail "the next client did not check out"
    kill "$spid"
    wait "$spid" 2>/dev/null
    spid=
    echo "---- server (host b):"
    cat "$work/server.out"
    grep -q '^wire_peer: connection 2 from ' "$work/server.out" || fail "the server did not accept the next client"
    ;;
  connect_down_host)
    "$pair" poweroff && echo "host a powered off"
    # Forget host a's hardware address (rxe-vm's start learnt it): a host that is down, never
    # seen, answers no ARP. (With the entry cached, resolution succeeds and the connect phase
    # waits out its own limit instead.)
    ip neigh flush dev eth0
    t=$(now_ms)
    client client -n 1 && fail "connecting to a host that is off succeeded"
    took=$(($(now_ms) - t))
    # No ARP answer: address resolution fails, within its 2 s (ClientOptions::resolve_timeout).
    # The library's own figure (from the connect's start) is bounded; the wall time, which holds
    # the process's start and end (over a second on an emulated host that has just booted), is
    # printed and only guards against a hang.
    grep -q 'FAILED in round 0 (connect): rdma_cm address resolution' "$work/client" ||
      fail "the error does not say address resolution"
    if [[ $(cat "$work/client") =~ timed\ out\ after\ ([0-9]+)\ ms ]]; then
      echo "the connect failed after ${BASH_REMATCH[1]} ms (the library's figure), $took ms as seen from here"
      ((BASH_REMATCH[1] <= 2000 + 2000)) || fail "the connect took ${BASH_REMATCH[1]} ms to fail (resolve_timeout is 2 s)"
    else
      fail "the error gives no time"
    fi
    ((took < 10000)) || fail "connecting to a host that is off took $took ms to fail, as seen from here"
    ;;
  connect_no_listener)
    t=$(now_ms)
    client client -p 7999 -n 1 && fail "connecting to a port nobody listens on succeeded"
    took=$(($(now_ms) - t))
    grep -q 'no listener' "$work/client" || fail "the error does not say 'no listener'"
    ((took < 5000)) || fail "the rejection took $took ms (limit 5 s)"
    ;;
  mtu_mismatch)
    # peer_check HOST_LABEL WANT_STATUS PATTERN CMD...: verbs-info --check --peer, its status and
    # a line it must print.
    peer_check() {
      local label=$1 want=$2 pattern=$3 rc
      shift 3
      "$@" >"$work/check" 2>&1
      rc=$?
      echo "---- verbs-info --check --peer on host $label: exit $rc"
      grep 'peer ' "$work/check"
      ((rc == want)) || fail "verbs-info --check --peer on host $label exited $rc, not $want"
      grep -q -- "$pattern" "$work/check" || fail "verbs-info --check --peer on host $label did not say '$pattern'"
    }
    [[ $(cat /sys/class/net/eth0/mtu) == 1500 ]] || fail "this host's MTU is not 1500"
    a_mtu=1  # set back to 1500 on exit
    "$pair" run ip link set eth0 mtu 9000 || fail "cannot set host a's eth0 to MTU 9000"
    sleep 1
    [[ $("$pair" run cat /sys/class/net/eth0/mtu) == 9000 ]] || fail "host a's MTU is not 9000"
    peer_check b 1 "replies come back whole (its MTU is 9000 or more, RDMA MTU 4096), this host's eth0 MTU 1500 (RDMA MTU 1024) \[peer_mtu_mismatch\]" \
      "$info" --check --peer "$a"
    peer_check a 1 "replies come back in fragments of 1500 bytes (its MTU is 1500, RDMA MTU 1024), this host's eth0 MTU 9000 (RDMA MTU 4096) \[peer_mtu_mismatch\]" \
      "$pair" run "$info" --check --peer "$b"
    # The client with the smaller MTU: rdma_cm's route says 1024 to both.
    serve_on_a
    checked client -n 20
    stop_server
    # The client with the larger MTU: its request says 4096, and the server tells it 1024.
    timeout 300 "$peer" serve -a "$b" -p 7480 --clients 1 >"$work/server.out" 2>&1 &
    spid=$!
    until grep -q 'listening on' "$work/server.out"; do
      kill -0 "$spid" 2>/dev/null || { fail "the server did not start"; cat "$work/server.out"; exit 1; }
      sleep 0.1
    done
    t=$(now_ms)
    "$pair" run -t 120 "$peer" run "$b" -n 20 >"$work/bigger" 2>&1 || fail "the client on host a (MTU 9000) failed"
    echo "---- the client on host a (MTU 9000): $(($(now_ms) - t)) ms"
    cat "$work/bigger"
    grep -q ': 0 lost, 0 wrong$' "$work/bigger" || fail "the client on host a did not check out"
    wait "$spid" 2>/dev/null
    spid=
    "$pair" run ip link set eth0 mtu 1500 || fail "cannot set host a's MTU back to 1500"
    sleep 1
    peer_check b 0 "replies come back in fragments of 1500 bytes (its MTU is 1500, RDMA MTU 1024), this host's eth0 MTU 1500 (RDMA MTU 1024): the same RDMA MTU both ways" \
      "$info" --check --peer "$a"
    ;;
  soak)
    # Messages of at most 16 KiB: a soak failed once in five runs (its output was not kept), and
    # what loss5 showed is the likely cause: rxe spends a transport retry on every sequence-error
    # NAK, so a 48 KiB message can run out of its 7. loss1 keeps the 48 KiB ones.
    serve_on_a --idle 30 "${emu[@]}"
    control -c 8 -n 10 --max-size 16384 "${emu[@]}"
    netem loss 1%
    phase client -c 8 -t "${VERBS_SOAK_SECONDS:-60}" --max-size 16384 "${emu[@]}"
    seen client "packets netem dropped" a.netem_dropped b.netem_dropped
    seen client "rxe's recoveries (sequence errors, retransmissions, duplicates)" \
      {a,b}.{out_of_seq_request,rcvd_seq_err,completer_retry_err,duplicate_request}
    stop_server
    ;;
  *)
    echo "faults.sh: unknown case '$case_name'" >&2
    exit 2
    ;;
esac

if ((failed)); then
  echo "$case_name: FAILED"
  exit 1
fi
echo "$case_name: passed"
