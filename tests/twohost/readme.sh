#!/usr/bin/env bash
# The guide's two-host commands (docs/connections.md), as written, between the two hosts of
# scripts/rxe-pair, with BIN_DIR standing for the page's build/. The blocks are read as
# cmake/doc_snippets.cmake extracted them (BIN_DIR/doc-snippets/BLOCK.sh), from whichever page
# holds them.
#   readme.sh two-hosts BIN_DIR   the "host A / host B" block, on host b of a pair (run.sh, the
#                                 shared pair): each line's left command on host a (scripts/pair),
#                                 its right one here once host a's listens, with 10.0.0.1 read as
#                                 host a (192.0.2.1)
#   readme.sh rxe-pair BIN_DIR    the scripts/rxe-pair block, each command as it stands, run on
#                                 this machine (each boots a pair of its own)
# Exit status: 0 every command succeeded on both hosts, 1 one failed, 125 the VMs could not run.
set -uo pipefail
block=$1
bin=$(cd "$2" && pwd)
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$top" || exit 1
file=$bin/doc-snippets/$block.sh
[[ -f $file ]] || { echo "readme.sh: no $file: no '$block' sh block in README.md or docs/*.md" >&2; exit 1; }
text=$(<"$file")
[[ -n $text ]] || { echo "readme.sh: the '$block' block is empty" >&2; exit 1; }
# The page's build/ is this build tree.
text=${text//build\//$bin/}
failed=0
run() {
  echo "==== $*"
  "$@"
  local rc=$?
  echo "==== exit $rc"
  ((rc == 125)) && exit 125
  ((rc == 0)) || failed=1
}
# host_a_then_b A_CMD B_CMD: A_CMD on host a (scripts/pair), then B_CMD here once A_CMD's
# program prints "listening on"; both must succeed. (Each line's job has a name of its own: the
# wait for the line must not find the one before's.)
lines=0
host_a_then_b() {
  local pair=$top/scripts/pair rc_a rc_b name=readme_host_a_$((++lines))
  "$pair" exec --name "$name" --timeout 120 bash -c "$1" &
  local a_pid=$!
  if ! "$pair" grep "$name" 'listening on' 60 >/dev/null; then
    echo "readme.sh: host a's command did not say it listens within 60 s"
    kill "$a_pid" 2>/dev/null
    wait "$a_pid"
    return 1
  fi
  bash -c "$2"
  rc_b=$?
  wait "$a_pid"
  rc_a=$?
  echo "readme.sh: host a's command exited $rc_a, host b's $rc_b"
  ((rc_a == 125)) && return 125
  ((rc_a == 0 && rc_b == 0))
}
case $block in
  two-hosts)
    [[ ${VERBS_PAIR_HOST:-} == b ]] || { echo "readme.sh two-hosts: run it on host b of a pair (tests/twohost/run.sh)" >&2; exit 2; }
    while IFS= read -r line; do
      [[ $line == \#* || -z ${line// /} ]] && continue
      line=${line%%  # *}                       # a trailing comment
      a_cmd=$(sed -E 's/ {3,}.*//' <<<"$line")   # the columns are apart by 3 spaces or more
      b_cmd=$(sed -E 's/^.* {3,}//' <<<"$line")
      [[ $a_cmd != "$line" ]] || { echo "readme.sh: no host B column in: $line" >&2; exit 1; }
      a_cmd=${a_cmd//10.0.0.1/192.0.2.1} b_cmd=${b_cmd//10.0.0.1/192.0.2.1}
      # By hand host B starts once host A serves: here once host a's program says it listens.
      run host_a_then_b "$a_cmd" "$b_cmd"
    done <<<"$text"
    ;;
  rxe-pair)
    run bash -ec "$text"
    ;;
  *) echo "readme.sh: unknown block '$block'" >&2; exit 2 ;;
esac
exit "$failed"
