#!/usr/bin/env bash
# scripts/demo, as a new user runs it (no standard input): it must exit 0 and give its account.
set -u
top=$1 build=$2
out=$(VERBS_BUILD_DIR=$build "$top/scripts/demo" 2>&1 0<&-); rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 0 ] || { echo "FAIL: scripts/demo exited $rc"; exit 1; }
for line in "latency:     median" "verified:" "read and checked 4194304 of 4194304 bytes"; do
  [[ "$out" == *"$line"* ]] || { echo "FAIL: no '$line' in the demo's output"; exit 1; }
done
