#!/usr/bin/env bash
# The guide's two-host commands (docs/connections.md), as written, between the two hosts of
# scripts/rxe-pair. Run on this machine (each command boots its own pair), from the source tree,
# with BIN_DIR standing for the page's build/. The blocks are read as cmake/doc_snippets.cmake
# extracted them (BIN_DIR/doc-snippets/BLOCK.sh), from whichever page holds them.
#   readme.sh two-hosts BIN_DIR   the "host A / host B" block: each line's left command on host a,
#                                 its right one on host b, with 10.0.0.1 read as host a (192.0.2.1)
#   readme.sh rxe-pair BIN_DIR    the scripts/rxe-pair block, each command as it stands
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
case $block in
  two-hosts)
    while IFS= read -r line; do
      [[ $line == \#* || -z ${line// /} ]] && continue
      line=${line%%  # *}                       # a trailing comment
      a_cmd=$(sed -E 's/ {3,}.*//' <<<"$line")   # the columns are apart by 3 spaces or more
      b_cmd=$(sed -E 's/^.* {3,}//' <<<"$line")
      [[ $a_cmd != "$line" ]] || { echo "readme.sh: no host B column in: $line" >&2; exit 1; }
      a_cmd=${a_cmd//10.0.0.1/192.0.2.1} b_cmd=${b_cmd//10.0.0.1/192.0.2.1}
      # By hand host B starts once host A serves; here host b waits for host a's boot and server.
      run scripts/rxe-pair --timeout 300 --a "$a_cmd" --b "sleep 8; $b_cmd"
    done <<<"$text"
    ;;
  rxe-pair)
    run bash -ec "$text"
    ;;
  *) echo "readme.sh: unknown block '$block'" >&2; exit 2 ;;
esac
exit "$failed"
