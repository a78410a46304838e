#!/usr/bin/env bash
# One cross-host test: boots the two hosts of scripts/rxe-pair (a: 192.0.2.1, serving with
# scripts/pair; b: 192.0.2.2) and runs CMD on host b, in this directory; CMD starts what it needs
# on host a with scripts/pair. Exit status: CMD's, or 125 when the VMs could not run it.
# Usage: run.sh [rxe-pair options] -- CMD [ARGS...]
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
opts=()
while (($#)) && [[ $1 != -- ]]; do
  opts+=("$1")
  shift
done
[[ ${1:-} == -- ]] || { echo "usage: run.sh [rxe-pair options] -- CMD [ARGS...]" >&2; exit 2; }
shift
printf -v cmd ' %q' "$@"
# Each VM's limit stays under ctest's (900 s), so that a hang ends with rxe-pair's own report.
exec "$top/scripts/rxe-pair" --timeout 780 "${opts[@]}" --b "${cmd# }"
