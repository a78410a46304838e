#!/usr/bin/env bash
# bench/compare across the wire, a short run: on host b (under scripts/rxe-pair), the clients
# and the report against the servers of `bench/compare --serve` on host a, both with the same
# options. Passes when the run completes and ends with a ratio and a paired line for every test
# (send_lat_event too: both tools sleeping on their channels across the wire) and the
# gain_vs_perftest line, and the many-QP rows.
# With --serve-on-a, it starts `bench/compare --serve` on host a itself (scripts/pair), and
# checks that it ended well (a shared pair: tests/twohost/shared-pair).
# Usage: compare.sh [--serve-on-a] VERBS_PERF OUT_DIR COMPARE_OPTIONS...
set -uo pipefail
serve=0
[ "${1:-}" = --serve-on-a ] && { serve=1; shift; }
perf=$1 out=$2
shift 2
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
log=$(mktemp)
trap 'rm -f "$log"; ((serve)) && "$top/scripts/pair" kill compare-serve 2>/dev/null' EXIT
if ((serve)); then
  "$top/scripts/pair" start compare-serve "$top/bench/compare" --serve --perf "$perf" --device rxe0 ||
    { echo "FAIL: could not start bench/compare --serve on host a"; exit 1; }
fi
timeout 1200 "$top/bench/compare" --connect "${VERBS_PEER_ADDR:?run under scripts/rxe-pair}" --perf "$perf" --out "$out" "$@" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
[ "$rc" -eq 0 ] || { echo "FAIL: bench/compare --connect exited with $rc"; exit 1; }
for t in write_lat write_bw read_lat read_bw send_lat send_bw send_lat_event write_rate_batched; do
  grep -Eq "^ratio $t [0-9.]+$" "$log" || { echo "FAIL: no 'ratio $t' line"; exit 1; }
  grep -Eq "^paired $t [0-9.]+$" "$log" || { echo "FAIL: no 'paired $t' line"; exit 1; }
done
# Each post path against itself (ours with --wr-api, perftest with --use_old_post_send).
for t in write_rate_batched_wr write_rate_batched_old; do
  grep -Eq "^paired $t [0-9.]+$" "$log" || { echo "FAIL: no 'paired $t' line"; exit 1; }
done
grep -Eq "^gain_vs_perftest write_rate_batching [0-9.]+$" "$log" || { echo "FAIL: no 'gain_vs_perftest' line"; exit 1; }
# Many QPs across the wire, at each count asked for (--qp-counts; the connection rows run on one
# host only).
counts="1 2 4 8 16 32 64"
args=("$@")
for i in "${!args[@]}"; do
  [ "${args[i]}" = --qp-counts ] && counts=${args[i + 1]//,/ }
done
for q in $counts; do
  for t in write_rate_q$q write_bw_q$q; do
    grep -Eq "^paired $t [0-9.]+$" "$log" || { echo "FAIL: no 'paired $t' line"; exit 1; }
  done
done
grep -q '"two_hosts": true' "$out/compare.json" || { echo "FAIL: compare.json does not say two hosts"; exit 1; }
if ((serve)); then
  "$top/scripts/pair" wait compare-serve 120
  rc=$?
  cat "$("$top/scripts/pair" out compare-serve)" "$("$top/scripts/pair" err compare-serve)" 2>/dev/null | sed 's/^/a| /'
  [ "$rc" -eq 0 ] || { echo "FAIL: bench/compare --serve on host a exited with $rc"; exit 1; }
  serve=0
fi
echo "compare across the wire: passed"
