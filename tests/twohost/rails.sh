#!/usr/bin/env bash
# One twohost.rails.* case (tests/twohost/rails_peer.cpp) on host b of a pair with two wires
# (scripts/rxe-pair --wires 2): a Target on host a over both of its addresses, the Group here.
# The cases cut this host's eth0/eth1 and restore them; this checks both hosts' wires are clean
# before and after, as the other tests on the shared pair expect.
#   rails.sh CASE RAILS_PEER        CASE: stripe, cut_one, cut_both
set -uo pipefail
case_=$1 peer=$2
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
pair=$top/scripts/pair
[[ -x $peer ]] || { echo "rails.sh: $peer is not built" >&2; exit 1; }
[[ -n ${VERBS_TEST_ADDR2:-} && -n ${VERBS_PEER_ADDR2:-} ]] ||
  { echo "rails.sh: no second wire (VERBS_TEST_ADDR2): run on a pair of scripts/rxe-pair --wires 2" >&2; exit 1; }
size=$((32 << 20))
port=$((20000 + RANDOM % 20000))
clean_wires() { # clean_wires WHERE: no netem on eth0/eth1 and both up, here (else says which)
  local n
  for n in eth0 eth1; do
    tc qdisc show dev "$n" | grep -q netem && { echo "$1: $n has a netem qdisc"; return 1; }
    ip link show "$n" | grep -q 'state UP' || { echo "$1: $n is not up"; return 1; }
  done
  return 0
}
failed=0
clean_wires "before, host b" || exit 1
"$pair" start rails-target "$peer" serve "$port" "$size" "$VERBS_PEER_ADDR" "$VERBS_PEER_ADDR2" || exit 1
cleanup() {
  "$pair" kill rails-target KILL
  "$pair" wait rails-target 30 >/dev/null 2>&1
  echo "---- the target on host a:"
  cat "$("$pair" out rails-target)" "$("$pair" err rails-target)" 2>/dev/null
  # rails_peer restores what it cut on every exit; a crash would not.
  for n in eth0 eth1; do ip link set "$n" up; tc qdisc del dev "$n" root 2>/dev/null; done
}
trap cleanup EXIT
"$pair" grep rails-target '^serving' 60 >/dev/null || { echo "FAIL: the target on host a did not start"; exit 1; }
"$peer" "$case_" "$port" "$size" "$VERBS_TEST_ADDR:$VERBS_PEER_ADDR" "$VERBS_TEST_ADDR2:$VERBS_PEER_ADDR2" || failed=1
# The target held at most the group's 2 rails x 4 QPs at once: a slot that reconnected after its
# wire was cut replaced its old connection, which no word of the cut reached.
most=$(sed -n 's/^connections [0-9]* (most \([0-9]*\))$/\1/p' "$("$pair" out rails-target)" | tail -n 1)
echo "the target held at most ${most:-?} connections at once"
[[ -n $most && $most -le 8 ]] || { echo "FAIL: the target held ${most:-?} connections at once, over the group's 8"; failed=1; }
# A clean wire after, whatever happened (the next test on the shared pair measures its own
# fault): a link set up again takes a moment to say UP.
for _ in $(seq 50); do clean_wires "after, host b" >/dev/null && break; sleep 0.2; done
clean_wires "after, host b" || failed=1
exit $failed
