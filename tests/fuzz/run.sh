#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz_*) in BIN_DIR for SECONDS each (default 10) over its seed
# corpus tests/fuzz/corpus/NAME. What it grows and any crash go to BIN_DIR/work/NAME/ (in the
# build tree; the committed corpus is only read). Prints "fuzz NAME: passed|FAILED ..." per
# target, the last lines of a failing target's log, and exits 1 if any failed.
#   tests/fuzz/run.sh build-asan/tests/fuzz 600     # a longer run (see docs/testing.md)
set -uo pipefail
bin=${1:?usage: run.sh BIN_DIR [SECONDS]}
seconds=${2:-10}
corpus=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/corpus
shopt -s nullglob
targets=("$bin"/fuzz_*)
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no targets in $bin (configure with -DVERBS_BUILD_FUZZ=ON and clang++)" >&2
  exit 1
fi
failed=0
for t in "${targets[@]}"; do
  name=${t##*/fuzz_}
  work=$bin/work/$name
  mkdir -p "$work/grown"
  # The grown corpus first (new inputs are written there), then the seeds.
  "$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$work/" "$work/grown" "$corpus/$name" >"$work/log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log")
  if [ "$rc" -eq 0 ]; then
    echo "fuzz $name: passed (${runs:-?} inputs in ${seconds} s)"
  else
    echo "fuzz $name: FAILED (exit $rc; the input is in $work/, the log in $work/log)"
    grep -E 'ERROR|runtime error|property failed|Assertion|SUMMARY' "$work/log" | head -5
    failed=1
  fi
done
exit $failed
