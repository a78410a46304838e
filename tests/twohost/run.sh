#!/usr/bin/env bash
# One cross-host test: runs CMD on host b of a pair of scripts/rxe-pair (a: 192.0.2.1, serving
# with scripts/pair; b: 192.0.2.2), in this directory; CMD starts what it needs on host a with
# scripts/pair. Exit status: CMD's, or 125 when the VMs could not run it.
#   run.sh [rxe-pair options] -- CMD [ARGS...]   boots a pair of its own for CMD
#   run.sh --shared STATE -- CMD [ARGS...]        runs CMD on the pair tests/twohost/shared-pair
#                                                 keeps up in STATE (the ctest fixture twohost_pair)
set -uo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
shared=
opts=()
while (($#)) && [[ $1 != -- ]]; do
  if [[ $1 == --shared ]]; then
    shared=${2:?--shared needs the state directory}
    shift 2
    continue
  fi
  opts+=("$1")
  shift
done
[[ ${1:-} == -- ]] || { echo "usage: run.sh [--shared STATE | rxe-pair options] -- CMD [ARGS...]" >&2; exit 2; }
shift
if [[ -n $shared ]]; then
  d=$(cat "$shared/dir" 2>/dev/null) && [[ -e $d/b/agent.ready && ! -e $shared/ended ]] ||
    { echo "run.sh: the shared pair in $shared is not up (see the test twohost.pair_up)"; exit 125; }
  # Host b's agent serves from $d/b; the test itself reaches host a through $d, as in a pair of
  # its own. The same limit as a pair of its own gives each VM.
  VERBS_PAIR_DIR=$d/b exec "$top/scripts/pair" exec --timeout 780 env VERBS_PAIR_DIR="$d" "$@"
fi
printf -v cmd ' %q' "$@"
# Each VM's limit stays under ctest's (900 s), so that a hang ends with rxe-pair's own report.
exec "$top/scripts/rxe-pair" --timeout 780 "${opts[@]}" --b "${cmd# }"
