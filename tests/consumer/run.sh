#!/usr/bin/env bash
# Builds tests/consumer against verbs the way a user would, runs it, and checks what it prints.
# Usage: run.sh MODE SOURCE_DIR BUILD_DIR WORK_DIR   (exit 77: skipped)
#   install       cmake --install BUILD_DIR --prefix WORK_DIR/prefix (for package and pkg-config)
#   package       find_package(verbs 0.1) from WORK_DIR/prefix
#   pkg-config    c++ -std=c++20 main.cpp $(pkg-config --cflags --libs verbs), from WORK_DIR/prefix
#   subdirectory  add_subdirectory(SOURCE_DIR)
#   fetchcontent  FetchContent from the git repository SOURCE_DIR at its HEAD commit
#   shared        SOURCE_DIR built with BUILD_SHARED_LIBS=ON and installed: SONAME, symlinks,
#                 and a find_package consumer that resolves libverbs.so at run time
#   build-tree    the README's command for the build tree (BUILD_DIR/doc-snippets/build-tree.sh,
#                 as cmake/doc_snippets.cmake extracted it), run as written from a directory whose
#                 include/ and build/ are SOURCE_DIR's and BUILD_DIR: with the tour as app.cpp
#                 (linked, not run), then with main.cpp (run)
# The library builds of subdirectory, fetchcontent and shared (the library compiled from source)
# are unity builds (CMAKE_UNITY_BUILD=ON): a parent project's setting that reaches verbs, which must
# build under it; and it compiles the library in a fifth of the CPU time, three times a run. The
# g++ build of scripts/test compiles each source file alone.
# Environment: VERBS_VERSION (the project version, x.y.z), CXX (default c++).
set -euo pipefail
mode=$1 src=$2 build=$3 work=$4
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
version=${VERBS_VERSION:?VERBS_VERSION must be set}
major_minor=${version%.*}
prefix=$work/prefix
out=$work/$mode
jobs=$(nproc 2>/dev/null || echo 2)

fail() { echo "consumer ($mode): FAILED: $*" >&2; exit 1; }

# Runs the consumer and checks that it listed the devices and reached the library's code.
run_consumer() {
  local text
  text=$("$@") || fail "the consumer exited with status $?"
  printf '%s\n' "$text"
  grep -q '^verbs consumer: [0-9]* RDMA device(s)$' <<<"$text" || fail "no device count in its output"
  grep -q '^verbs consumer: no RDMA device' <<<"$text" || fail "no message from the verbs error category"
}

configure_consumer() { # build dir, then cmake -D options
  local dir=$1
  shift
  cmake -S "$here" -B "$dir" "$@" >"$dir.configure.log" 2>&1 || { cat "$dir.configure.log"; fail "configure"; }
  cmake --build "$dir" -j"$jobs" >"$dir.build.log" 2>&1 || { cat "$dir.build.log"; fail "build"; }
}

rm -rf "$out" "$out".*.log
mkdir -p "$work"
case $mode in
  install)
    rm -rf "$prefix"
    cmake --install "$build" --prefix "$prefix" >"$out.log" 2>&1 || { cat "$out.log"; fail "cmake --install"; }
    find "$prefix" \( -type f -o -type l \) | sort | sed "s|^$prefix/||"
    ;;
  package)
    configure_consumer "$out" -DVERBS_CONSUME=package -DCMAKE_PREFIX_PATH="$prefix"
    grep -q "verbs_DIR:PATH=$prefix/" "$out/CMakeCache.txt" || fail "find_package did not use $prefix"
    run_consumer "$out/consumer"
    ;;
  pkg-config)
    pc=$(find "$prefix" -name verbs.pc -print -quit)
    [ -n "$pc" ] || fail "no verbs.pc under $prefix"
    export PKG_CONFIG_PATH=${pc%/*}
    [ "$(pkg-config --modversion verbs)" = "$version" ] || fail "pkg-config --modversion verbs is not $version"
    flags=$(pkg-config --cflags --libs verbs) || fail "pkg-config --cflags --libs verbs"
    echo "pkg-config --cflags --libs verbs: $flags"
    mkdir -p "$out"
    # shellcheck disable=SC2086 # the flags are words
    "${CXX:-c++}" -std=c++20 "$here/main.cpp" -o "$out/consumer" $flags || fail "compiling with pkg-config's flags"
    run_consumer "$out/consumer"
    ;;
  subdirectory)
    configure_consumer "$out" -DVERBS_CONSUME=subdirectory -DVERBS_SOURCE_DIR="$src" -DCMAKE_UNITY_BUILD=ON
    run_consumer "$out/consumer"
    ;;
  fetchcontent)
    if ! head=$(git -C "$src" rev-parse --verify -q HEAD); then
      echo "consumer (fetchcontent): $src is not a git repository with a commit: skipped"
      exit 77
    fi
    echo "FetchContent of $src at $head (the committed HEAD, not the work tree)"
    configure_consumer "$out" -DVERBS_CONSUME=fetchcontent -DVERBS_GIT_REPOSITORY="$src" -DVERBS_GIT_TAG="$head" \
      -DCMAKE_UNITY_BUILD=ON
    run_consumer "$out/consumer"
    ;;
  shared)
    lib=$work/shared-lib sprefix=$work/shared-prefix
    rm -rf "$lib" "$sprefix"
    cmake -S "$src" -B "$lib" -DBUILD_SHARED_LIBS=ON -DVERBS_INSTALL=ON -DVERBS_BUILD_TESTS=OFF \
      -DVERBS_BUILD_EXAMPLES=OFF -DVERBS_BUILD_BENCH=OFF -DVERBS_BUILD_TOOLS=OFF -DCMAKE_UNITY_BUILD=ON >"$lib.log" 2>&1 &&
      cmake --build "$lib" -j"$jobs" >>"$lib.log" 2>&1 &&
      cmake --install "$lib" --prefix "$sprefix" >>"$lib.log" 2>&1 || { cat "$lib.log"; fail "shared build and install"; }
    so=$(find "$sprefix" -name "libverbs.so.$version" -print -quit)
    [ -n "$so" ] || fail "no libverbs.so.$version installed"
    libdir=${so%/*}
    soname=$(readelf -d "$so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
    echo "SONAME of ${so#"$sprefix"/}: $soname"
    [ "$soname" = "libverbs.so.$major_minor" ] || fail "SONAME is '$soname', expected libverbs.so.$major_minor"
    [ "$(readlink "$libdir/libverbs.so.$major_minor")" = "libverbs.so.$version" ] || fail "libverbs.so.$major_minor link"
    [ "$(readlink "$libdir/libverbs.so")" = "libverbs.so.$major_minor" ] || fail "libverbs.so link"
    [ ! -e "$libdir/libverbs.a" ] || fail "a static library was installed too"
    configure_consumer "$out" -DVERBS_CONSUME=package -DCMAKE_PREFIX_PATH="$sprefix"
    readelf -d "$out/consumer" | grep -q "(NEEDED).*\[libverbs.so.$major_minor\]" ||
      fail "the consumer does not need libverbs.so.$major_minor"
    resolved=$(ldd "$out/consumer" | awk '$1 ~ /^libverbs\.so/ { print $3 }')
    echo "libverbs.so.$major_minor resolves to $resolved"
    [ "$resolved" -ef "$so" ] || fail "libverbs.so.$major_minor resolves to '$resolved', not the installed $so"
    run_consumer "$out/consumer"
    ;;
  build-tree)
    recipe=$build/doc-snippets/build-tree.sh
    [ -f "$recipe" ] || fail "no $recipe: README.md has no build-tree block"
    echo "the README's command: $(cat "$recipe")"
    mkdir -p "$out"
    ln -sfn "$src/include" "$out/include"
    ln -sfn "$build" "$out/build"
    for app in "$build/doc-snippets/tour.cpp" "$here/main.cpp"; do
      cp "$app" "$out/app.cpp"
      rm -f "$out/a.out"
      (cd "$out" && bash -e "$recipe") || fail "the README's command failed on ${app##*/}"
      [ -x "$out/a.out" ] || fail "the README's command made no a.out from ${app##*/}"
      echo "built ${app##*/}"
    done
    run_consumer "$out/a.out"
    ;;
  *) fail "unknown mode" ;;
esac
echo "consumer ($mode): ok"
