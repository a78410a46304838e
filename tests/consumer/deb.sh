#!/usr/bin/env bash
# package.deb: the Debian packages of cmake/deb.cmake, made with cpack from BUILD_DIR as it is
# (built already; only the consumer is compiled here), then
#  - their file names, control fields and members (libverbs-dev: an ldconfig trigger and a shlibs
#    file; neither has a maintainer script) and their contents, file by file (each with the
#    copyright, LICENSE, and a changelog.Debian.gz);
#  - their Depends: libverbs-dev names libibverbs-dev, librdmacm-dev and pkg-config, and each
#    names the package of every library its ELF files need (readelf's NEEDED, dpkg -S's owner);
#    verbs-tools does not need libverbs-dev;
#  - dpkg refuses them where nothing is installed (an empty database), naming each dependency;
#  - dpkg installs them into a scratch root with a copy of this system's database, so that the
#    real libibverbs-dev, librdmacm-dev, ... satisfy the Depends, and never touches the system's
#    root or database; verbs-info and verbs-perf run from there;
#  - tests/consumer builds against that root with find_package (verbs::verbs, the static library,
#    and verbs::verbs_shared) and with pkg-config (-lverbs: the shared library), and runs;
#  - dpkg --purge leaves nothing of theirs in the root or the database.
# Usage: deb.sh SOURCE_DIR BUILD_DIR WORK_DIR   (exit 77: skipped, only where dpkg is missing)
# Environment: VERBS_VERSION (x.y.z), VERBS_DEB_RELEASE (the Debian revision), VERBS_LIBDIR (the
# build's CMAKE_INSTALL_LIBDIR), VERBS_BUILD_TYPE (its CMAKE_BUILD_TYPE), CXX (default c++).
set -euo pipefail
src=$1 build=$2 work=$3
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${VERBS_VERSION:?VERBS_VERSION must be set}
release=${VERBS_DEB_RELEASE:?VERBS_DEB_RELEASE must be set}
libdir=${VERBS_LIBDIR:?VERBS_LIBDIR must be set}
config=$(tr '[:upper:]' '[:lower:]' <<<"${VERBS_BUILD_TYPE:-noconfig}")
major_minor=${version%.*}
jobs=$(nproc 2>/dev/null || echo 2)

fail() { echo "package.deb: FAILED: $*" >&2; exit 1; }
started=$SECONDS
step() { echo "== $* [$((SECONDS - started)) s]"; }

for tool in dpkg dpkg-deb dpkg-query; do
  command -v "$tool" >/dev/null || { echo "package.deb: no $tool here (not a Debian system?): skipped"; exit 77; }
done
command -v dpkg-shlibdeps >/dev/null || fail "dpkg-shlibdeps is missing (apt-get install dpkg-dev; scripts/setup does)"
# dpkg looks for ldconfig and start-stop-daemon in PATH, which lacks the sbin directories for a user.
export PATH=$PATH:/usr/sbin:/sbin
arch=$(dpkg --print-architecture)
system_admin=/var/lib/dpkg
packages=(libverbs-dev verbs-tools)
system_before=$(dpkg-query --admindir="$system_admin" -W -f='${db:Status-Abbrev}\n' "${packages[@]}" 2>&1 || true)

rm -rf "$work"
mkdir -p "$work"

step "cpack -G DEB from $build"
# cpack first brings the whole build up to date (its preinstall target): a check, here, on all cores.
CMAKE_BUILD_PARALLEL_LEVEL=$jobs cpack -G DEB --config "$build/CPackConfig.cmake" -B "$work/debs" >"$work/cpack.log" 2>&1 ||
  { cat "$work/cpack.log"; fail "cpack"; }
dev=$work/debs/libverbs-dev_${version}-${release}_${arch}.deb
tools=$work/debs/verbs-tools_${version}-${release}_${arch}.deb
made=$(cd "$work/debs" && ls -- *.deb)
[ "$made" = "$(printf '%s\n' "${dev##*/}" "${tools##*/}")" ] ||
  fail "cpack made '${made//$'\n'/ }', expected ${dev##*/} and ${tools##*/}"

# names FIELD_VALUE: the package names of a Depends-like field, one a line.
names() { tr ',|' '\n' <<<"$1" | sed -E 's/\(.*\)//; s/:any$//; s/[[:space:]]//g' | sed '/^$/d'; }

step "control fields, members and contents"
# contents DEB: its files and links (not its directories), as dpkg-deb -c names them.
contents() { dpkg-deb -c "$1" | awk '$1 !~ /^d/ { $1 = $2 = $3 = $4 = $5 = ""; sub(/^ +/, ""); print }' | sort; }
expected_dev=$(
  cd "$src/include" && find verbs -name '*.hpp' | sed 's|^|./usr/include/|'
  l=./usr/$libdir
  echo "$l/libverbs.a"
  echo "$l/libverbs.so -> libverbs.so.$major_minor"
  echo "$l/libverbs.so.$major_minor -> libverbs.so.$version"
  echo "$l/libverbs.so.$version"
  for f in verbsConfig verbsConfigVersion verbs-targets "verbs-targets-$config" verbs-shared-targets \
           "verbs-shared-targets-$config"; do
    echo "$l/cmake/verbs/$f.cmake"
  done
  echo "$l/pkgconfig/verbs.pc"
  printf '%s\n' ./usr/share/doc/libverbs-dev/copyright ./usr/share/doc/libverbs-dev/changelog.Debian.gz
)
expected_tools=$(printf '%s\n' ./usr/bin/verbs-info ./usr/bin/verbs-perf ./usr/share/doc/verbs-tools/copyright \
                                ./usr/share/doc/verbs-tools/changelog.Debian.gz)
declare -A depends needed
for deb in "$dev" "$tools"; do
  name=${deb##*/}
  name=${name%%_*}
  mkdir -p "$work/control/$name" "$work/files/$name"
  dpkg-deb -e "$deb" "$work/control/$name"
  dpkg-deb -x "$deb" "$work/files/$name"
  # field NAME: the control field's value (its first line).
  field() { sed -n "s/^$1: //p" "$work/control/$name/control"; }
  [ "$(field Package)" = "$name" ] || fail "$name: Package is '$(field Package)'"
  [ "$(field Version)" = "$version-$release" ] || fail "$name: Version is '$(field Version)', expected $version-$release"
  [ "$(field Architecture)" = "$arch" ] || fail "$name: Architecture is '$(field Architecture)'"
  [[ $(field Maintainer) =~ ^[^\<]+\ \<[^@\>]+@[^@\>]+\>$ ]] || fail "$name: Maintainer '$(field Maintainer)' is not 'Name <address>'"
  for f in Section Priority Description Depends; do
    [ -n "$(field $f)" ] || fail "$name: no $f"
  done
  depends[$name]=$(field Depends)
  echo "$name: Depends: ${depends[$name]}"
  if [ "$deb" = "$dev" ]; then expected=$expected_dev; else expected=$expected_tools; fi
  diff <(sort <<<"$expected") <(contents "$deb") >"$work/contents.diff" ||
    { cat "$work/contents.diff"; fail "$name: its contents ('>') are not those expected ('<')"; }
  doc=$work/files/$name/usr/share/doc/$name
  cmp -s "$doc/copyright" "$src/LICENSE" || fail "$name: its copyright is not LICENSE"
  [ "$(gzip -dc "$doc/changelog.Debian.gz" | head -n 1)" = "$name ($version-$release) unstable; urgency=medium" ] ||
    fail "$name: changelog.Debian.gz does not begin with this version's entry"
  members=$(cd "$work/control/$name" && echo *)
  if [ "$deb" = "$dev" ]; then want="control md5sums shlibs triggers"; else want="control md5sums"; fi
  [ "$members" = "$want" ] || fail "$name: control members are '$members', expected '$want' (no maintainer scripts)"
  # The libraries its ELF files need, but libverbs-dev's own libverbs.so.M.m.
  needed[$name]=$(find "$work/files/$name" -type f -exec readelf -d {} + 2>/dev/null |
                  sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | sort -u | grep -vx "libverbs\.so\.$major_minor" || true)
  [ -n "${needed[$name]}" ] || fail "$name: no ELF file needs any library (readelf)"
done
# Each library needed is another package's, named in Depends: the owners from one dpkg -S
# ("PKG[:ARCH][, PKG...]: PATH" lines; several where the name is in several directories, as
# lib32stdc++6's).
patterns=()
for lib in $(printf '%s\n' "${needed[@]}" | sort -u); do patterns+=("*/$lib"); done
owners=$(dpkg-query --admindir="$system_admin" -S "${patterns[@]}" 2>/dev/null | grep -v '^diversion ' |
         while IFS= read -r line; do
           for o in ${line%%: *}; do echo "${line##*/} ${o%%[:,]*}"; done
         done || true)
for name in "${packages[@]}"; do
  for lib in ${needed[$name]}; do
    owned_by=$(awk -v lib="$lib" '$1 == lib { print $2 }' <<<"$owners" | sort -u)
    [ -n "$owned_by" ] || fail "$name: needs $lib, which no installed package has"
    names "${depends[$name]}" | grep -qxF -f <(echo "$owned_by") ||
      fail "$name: needs $lib (${owned_by//$'\n'/ or }'s), but Depends does not name its package: ${depends[$name]}"
  done
  echo "$name: the package of each library it needs is in Depends: ${needed[$name]//$'\n'/ }"
done
dev_depends=$(names "${depends[libverbs-dev]}") tools_depends=$(names "${depends[verbs-tools]}")
for pkg in libibverbs-dev librdmacm-dev pkg-config; do
  grep -qx "$pkg" <<<"$dev_depends" || fail "libverbs-dev: Depends does not name $pkg"
done
! grep -qx libverbs-dev <<<"$tools_depends" || fail "verbs-tools depends on libverbs-dev: its programs should have the static library"
[ "$(cat "$work/control/libverbs-dev/triggers")" = "activate-noawait ldconfig" ] || fail "libverbs-dev: triggers is not the ldconfig trigger"
[ "$(cat "$work/control/libverbs-dev/shlibs")" = "libverbs $major_minor libverbs-dev (>= $version)" ] ||
  fail "libverbs-dev: shlibs is '$(cat "$work/control/libverbs-dev/shlibs")'"
so=$work/files/libverbs-dev/usr/$libdir/libverbs.so.$version
soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libverbs.so.$major_minor" ] || fail "libverbs.so.$version's SONAME is '$soname'"

# dpkg_in ROOT ADMIN ARGS...: dpkg on the scratch root ROOT with the database ADMIN (as a user
# too: --force-not-root), logging there. Maintainer scripts would run chrooted into ROOT, which
# has no shell: there must be none.
dpkg_in() {
  local root=$1 admin=$2
  shift 2
  dpkg --force-not-root --instdir="$root" --admindir="$admin" --log="$admin/dpkg.log" "$@"
}

step "dpkg -i where nothing is installed: refused"
mkdir -p "$work/bare-root" "$work/bare-admin/info" "$work/bare-admin/updates"
: >"$work/bare-admin/status"
if dpkg_in "$work/bare-root" "$work/bare-admin" -i "$dev" "$tools" >"$work/bare.log" 2>&1; then
  cat "$work/bare.log"
  fail "dpkg installed both packages on a system with nothing else installed"
fi
for pkg in "${packages[@]}"; do
  for dep in $(names "${depends[$pkg]}"); do
    grep -qF " $pkg depends on $dep" "$work/bare.log" ||
      { cat "$work/bare.log"; fail "dpkg's refusal of $pkg does not name $dep"; }
  done
done
echo "refused: $(grep -c ' depends on ' "$work/bare.log") unmet dependencies named, each of both packages' Depends"
rm -rf "$work/bare-root" "$work/bare-admin"

step "dpkg -i into $work/root (a copy of this system's database in $work/admin)"
root=$work/root admin=$work/admin
mkdir -p "$root" "$admin/info" "$admin/updates"
cp "$system_admin/status" "$admin/status"
# Each installed package's file list, empty: dpkg then finds every package it knows without
# warning about each list, and no other package claims a directory of ours.
(cd "$system_admin/info" && for f in *.list; do : >"$admin/info/$f"; done)
dpkg_in "$root" "$admin" -i "$dev" "$tools" >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; fail "dpkg -i into the scratch root"; }
for pkg in "${packages[@]}"; do
  status=$(dpkg-query --admindir="$admin" -W -f='${Status}' "$pkg")
  [ "$status" = "install ok installed" ] || fail "$pkg's status is '$status'"
done
while read -r path _; do
  [ -e "$root/$path" ] || [ -L "$root/$path" ] || fail "$path is not in the scratch root"
done <<<"$expected_dev
$expected_tools"
"$root/usr/bin/verbs-info" --help >/dev/null || fail "the installed verbs-info --help"
"$root/usr/bin/verbs-perf" --help >/dev/null || fail "the installed verbs-perf --help"
echo "installed; verbs-info and verbs-perf run"

# run_consumer PROGRAM: runs it and checks that it listed the devices and reached the library's
# code (as tests/consumer/run.sh does).
run_consumer() {
  local text
  text=$("$@") || fail "$1 exited with status $?"
  printf '%s\n' "$text"
  grep -q '^verbs consumer: [0-9]* RDMA device(s)$' <<<"$text" || fail "$1: no device count in its output"
  grep -q '^verbs consumer: no RDMA device' <<<"$text" || fail "$1: no message from the verbs error category"
}
# uses_shared PROGRAM: it needs libverbs.so.M.m, and the loader finds the scratch root's.
uses_shared() {
  local resolved
  grep -q "(NEEDED).*\[libverbs.so.$major_minor\]" <<<"$(readelf -d "$1")" || fail "$1 does not need libverbs.so.$major_minor"
  resolved=$(ldd "$1" | awk '$1 ~ /^libverbs\.so/ { print $3 }')
  [ "$resolved" -ef "$root/usr/$libdir/libverbs.so.$version" ] ||
    fail "$1: libverbs.so.$major_minor resolves to '$resolved', not the scratch root's"
}

step "find_package(verbs) from $root/usr: verbs::verbs and verbs::verbs_shared"
out=$work/find-package
{ cmake -S "$here" -B "$out" -DVERBS_CONSUME=package -DCMAKE_PREFIX_PATH="$root/usr" -DVERBS_CONSUMER_SHARED=ON &&
    cmake --build "$out" -j"$jobs"; } >"$out.log" 2>&1 || { cat "$out.log"; fail "the find_package consumer's build"; }
grep -qx "verbs_DIR:PATH=$root/usr/$libdir/cmake/verbs" "$out/CMakeCache.txt" || fail "find_package did not use $root/usr/$libdir/cmake/verbs"
! grep -q "(NEEDED).*libverbs" <<<"$(readelf -d "$out/consumer")" || fail "consumer (verbs::verbs) needs libverbs.so: not the static library"
run_consumer "$out/consumer"
uses_shared "$out/consumer_shared"
run_consumer "$out/consumer_shared"

step "pkg-config verbs from $root/usr (the loader given $root/usr/$libdir, as it looks in /usr/$libdir)"
export PKG_CONFIG_PATH=$root/usr/$libdir/pkgconfig
[ "$(pkg-config --modversion verbs)" = "$version" ] || fail "pkg-config --modversion verbs is not $version"
flags=$(pkg-config --cflags --libs verbs) || fail "pkg-config --cflags --libs verbs"
echo "pkg-config --cflags --libs verbs: $flags"
include=$(pkg-config --variable=includedir verbs)
[ "$include" -ef "$root/usr/include" ] || fail "pkg-config's includedir is $include, not $root/usr/include"
[[ " $flags " == *" -I$include "* ]] || fail "pkg-config's flags do not name its includedir"
# shellcheck disable=SC2086 # the flags are words
"${CXX:-c++}" -std=c++20 "$here/main.cpp" -o "$work/pkg-config-consumer" $flags || fail "compiling with pkg-config's flags"
export LD_LIBRARY_PATH=$root/usr/$libdir
uses_shared "$work/pkg-config-consumer"
run_consumer "$work/pkg-config-consumer"
unset LD_LIBRARY_PATH

step "dpkg --purge"
dpkg_in "$root" "$admin" --purge "${packages[@]}" >"$work/purge.log" 2>&1 || { cat "$work/purge.log"; fail "dpkg --purge"; }
left=$(cd "$root" && find . -mindepth 1)
[ -z "$left" ] || fail "left in the scratch root after the purge: ${left//$'\n'/ }"
for pkg in "${packages[@]}"; do
  ! dpkg-query --admindir="$admin" -W "$pkg" >/dev/null 2>&1 || fail "the database still knows $pkg after the purge"
  ! compgen -G "$admin/info/$pkg.*" >/dev/null || fail "$admin/info still has $pkg's files"
done
system_after=$(dpkg-query --admindir="$system_admin" -W -f='${db:Status-Abbrev}\n' "${packages[@]}" 2>&1 || true)
[ "$system_after" = "$system_before" ] || fail "the system's database changed: '$system_before' before, '$system_after' after"
echo "purged: nothing left in the root, neither package in the database; the system's database untouched"
step "package.deb: ok"
