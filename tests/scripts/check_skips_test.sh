#!/usr/bin/env bash
# tests/check-skips on small made-up runs: a skip listed for its platform (one of several, by
# comma), a skip that is not, a listed one that now runs, and --complete's stale line (a listed
# name no step ran on any platform), while a line for a platform no step ran is not stale.
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

[ "$failures" -eq 0 ] && echo "check-skips: all cases as expected"
exit $((failures > 0))
