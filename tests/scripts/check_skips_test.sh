#!/usr/bin/env bash
# tests/check-skips on small made-up runs: a skip listed for its platform (one of several, by
# comma), a skip that is not, a listed one that now runs, and --complete's stale line (a listed
# name no step ran on any platform), while a line for a platform no step ran is not stale. Then
# the rdma-core release in a device step's platform (rxe-7.2/rdma-core-65): items that compare it
# (/rdma-core<N, /rdma-core>=N), an item without one, a release that is unknown, bad syntax.
set -uo pipefail
check=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

cat >"$work/list" <<'LIST'
# comment
A.Skips        rxe-6.1,rxe-6.12   no feature
B.SkipsOnAsan  asan:rxe-*         asan only
C.Gone         rxe-6.1            renamed since
D.ElsewhereOnly rxe-7.2           listed for a platform no step ran here
F.AsanBoth     asan:rxe-6.1,asan:rxe-7.2  a step prefix per item
LIST
# One step on rxe-6.12 (gtest results), one asan step on rxe-7.2.
printf 'skipped\tA.Skips\tno feature\npassed\tB.SkipsOnAsan\t\npassed\tD.ElsewhereOnly\t\npassed\tF.AsanBoth\t\n' >"$work/r1"
printf 'skipped\tB.SkipsOnAsan\tasan\nskipped\tE.Unlisted\tsomething\n' >"$work/r2"
printf '  Test #1: verbs_device_tests\n' >"$work/entries"
: >"$work/log"

out=$("$check" "$work/list" "softroce=rxe-6.12:$work/log:$work/r1:$work/entries" 2>&1)
rc=$?
[ "$rc" -eq 0 ] || fail "a skip listed for one of its platforms: exit $rc: $out"
grep -q '^skip expected   softroce A.Skips (rxe-6.12: no feature)$' <<<"$out" || fail "A.Skips not expected on rxe-6.12: $out"
grep -q '^skips: 1 expected, 0 unexpected$' <<<"$out" || fail "summary: $out"

out=$("$check" "$work/list" "softroce=rxe-6.12:$work/log:$work/r1:$work/entries" "asan=rxe-7.2:$work/log:$work/r2:$work/entries" 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "an unlisted skip: exit $rc, expected 1"
grep -q '^SKIP UNEXPECTED asan E.Unlisted (rxe-7.2): something$' <<<"$out" || fail "E.Unlisted not reported: $out"
grep -q '^skip expected   asan B.SkipsOnAsan' <<<"$out" || fail "B.SkipsOnAsan not expected under asan: $out"

printf 'skipped\tA.Skips\tno feature\nskipped\tB.SkipsOnAsan\tasan\n' >"$work/r3"
out=$("$check" "$work/list" "softroce=rxe-6.12:$work/log:$work/r3:$work/entries" 2>&1)
[ $? -eq 1 ] || fail "B.SkipsOnAsan skipped outside asan: not refused"
grep -q '^SKIP UNEXPECTED softroce B.SkipsOnAsan' <<<"$out" || fail "B outside asan: $out"

printf 'passed\tA.Skips\t\n' >"$work/r4"
out=$("$check" "$work/list" "softroce=rxe-6.1:$work/log:$work/r4:$work/entries" 2>&1)
[ $? -eq 1 ] || fail "a listed skip that now runs: not refused"
grep -q '^SKIP NOW RUNS   softroce A.Skips: it passed on rxe-6.1' <<<"$out" || fail "now runs: $out"

out=$("$check" --complete "$work/list" "softroce=rxe-6.12:$work/log:$work/r1:$work/entries" 2>&1)
[ $? -eq 1 ] || fail "--complete with a stale line: not refused"
grep -q '^SKIP LISTED, NEVER RAN C.Gone (rxe-6.1)' <<<"$out" || fail "C.Gone not stale: $out"
grep -q 'NEVER RAN D.ElsewhereOnly' <<<"$out" && fail "D.ElsewhereOnly ran (on rxe-6.12), yet called stale: $out"
grep -q ', 1 listed that never ran$' <<<"$out" || fail "stale count: $out"

# A STEP: prefix belongs to its own comma item: F skips under asan on rxe-7.2, not under softroce.
printf 'skipped\tF.AsanBoth\tasan\n' >"$work/r5"
out=$("$check" "$work/list" "asan=rxe-7.2:$work/log:$work/r5:$work/entries" 2>&1)
[ $? -eq 0 ] || fail "F.AsanBoth under asan on rxe-7.2: refused: $out"
out=$("$check" "$work/list" "softroce=rxe-7.2:$work/log:$work/r5:$work/entries" 2>&1)
[ $? -eq 1 ] || fail "F.AsanBoth under softroce: allowed: $out"

# The rdma-core release: a device step's platform is KERNEL/rdma-core-RELEASE.
cat >"$work/list2" <<'LIST'
A.Skips        rxe-6.1,rxe-6.12            an item without /: the kernel alone
G.OldRdmaCore  rxe-*/rdma-core<45          no flush before rdma-core 45
H.NewOnAsan    asan:rxe-7.2/rdma-core>=59  asan on 7.2 with rdma-core 59 or newer
LIST
printf 'skipped\tA.Skips\tno feature\nskipped\tG.OldRdmaCore\tno flush\n' >"$work/r6"
printf 'skipped\tH.NewOnAsan\tnewer\n' >"$work/r7"
printf 'passed\tG.OldRdmaCore\t\n' >"$work/r8"
# check PLATFORM STEP RESULTS RC GREP: check-skips with list2 exits RC and prints a line GREP matches.
check() {
  local out rc
  out=$("$check" "$work/list2" "$2=$1:$work/log:$3:$work/entries" 2>&1)
  rc=$?
  [ "$rc" -eq "$4" ] || fail "$2 on $1 ($(basename "$3")): exit $rc, expected $4: $out"
  grep -q -- "$5" <<<"$out" || fail "$2 on $1 ($(basename "$3")): no line '$5' in: $out"
}
# <45: 44 is below (expected, A's item without / too), 45 is not (unexpected).
check rxe-6.12/rdma-core-44 softroce "$work/r6" 0 '^skip expected   softroce G.OldRdmaCore (rxe-6.12/rdma-core-44: no flush'
check rxe-6.12/rdma-core-44 softroce "$work/r6" 0 '^skip expected   softroce A.Skips (rxe-6.12/rdma-core-44: '
check rxe-6.12/rdma-core-45 softroce "$work/r6" 1 '^SKIP UNEXPECTED softroce G.OldRdmaCore (rxe-6.12/rdma-core-45): no flush'
check rxe-6.12/rdma-core-45 softroce "$work/r6" 1 '^skip expected   softroce A.Skips (rxe-6.12/rdma-core-45: '
# Below 45 a listed skip that passes now runs; from 45 it is not listed at all.
check rxe-7.2/rdma-core-44 softroce "$work/r8" 1 '^SKIP NOW RUNS   softroce G.OldRdmaCore: it passed on rxe-7.2/rdma-core-44'
check rxe-7.2/rdma-core-65 softroce "$work/r8" 0 '^skips: 0 expected, 0 unexpected$'
# >=59 with a step: 59 and 65 match, 58 does not, nor 65 outside asan or on another kernel.
check rxe-7.2/rdma-core-59 asan "$work/r7" 0 '^skip expected   asan H.NewOnAsan (rxe-7.2/rdma-core-59: '
check rxe-7.2/rdma-core-65 asan "$work/r7" 0 '^skips: 1 expected, 0 unexpected$'
check rxe-7.2/rdma-core-58 asan "$work/r7" 1 '^SKIP UNEXPECTED asan H.NewOnAsan (rxe-7.2/rdma-core-58)'
check rxe-7.2/rdma-core-65 softroce "$work/r7" 1 '^SKIP UNEXPECTED softroce H.NewOnAsan'
check rxe-6.12/rdma-core-65 asan "$work/r7" 1 '^SKIP UNEXPECTED asan H.NewOnAsan'
# A release scripts/test could not read: no comparison matches it (neither < nor >=), while an
# item without / still does.
check rxe-6.12/rdma-core-unknown softroce "$work/r6" 1 '^SKIP UNEXPECTED softroce G.OldRdmaCore (rxe-6.12/rdma-core-unknown)'
check rxe-6.12/rdma-core-unknown softroce "$work/r6" 1 '^skip expected   softroce A.Skips (rxe-6.12/rdma-core-unknown: '
check rxe-7.2/rdma-core-unknown asan "$work/r7" 1 '^SKIP UNEXPECTED asan H.NewOnAsan'
# No release at all (an old platform name): the same.
check rxe-6.12 softroce "$work/r6" 1 '^SKIP UNEXPECTED softroce G.OldRdmaCore (rxe-6.12)'

# Bad syntax: an item whose / part is no comparison, and a platform with a bad suffix: exit 2.
for bad in 'rxe-*/rdma-core<=45' 'rxe-*/rdma-core45' 'rxe-7.2/44' 'rxe-*/rdma-core>=x'; do
  printf 'G.OldRdmaCore  %s  why\n' "$bad" >"$work/list3"
  out=$("$check" "$work/list3" "softroce=rxe-6.12/rdma-core-44:$work/log:$work/r6:$work/entries" 2>&1)
  rc=$?
  [ "$rc" -eq 2 ] || fail "pattern '$bad': exit $rc, expected 2: $out"
  grep -qF "list3:1: bad platform '$bad': want [STEP:]GLOB, optionally followed by /rdma-core<N or /rdma-core>=N" <<<"$out" ||
    fail "pattern '$bad': message: $out"
done
out=$("$check" "$work/list2" "softroce=rxe-6.12/rdma-44:$work/log:$work/r6:$work/entries" 2>&1)
[ $? -eq 2 ] || fail "platform rxe-6.12/rdma-44: not refused: $out"
grep -qF "bad platform 'rxe-6.12/rdma-44'" <<<"$out" || fail "platform rxe-6.12/rdma-44: message: $out"

[ "$failures" -eq 0 ] && echo "check-skips: all cases as expected"
exit $((failures > 0))
