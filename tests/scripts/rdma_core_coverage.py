#!/usr/bin/env python3
"""Checks tests/rdma-core-coverage.tsv, the map of rdma-core's tests/ (its generic test methods)
to the tests here, and prints its counts (docs/testing.md's table quotes them).

Usage: rdma_core_coverage.py TSV TESTS_DIR BUILD_DIR

Each line: file, Class.method, verdict (covered, n/a, gap), our tests (comma-separated gtest
Suite.Name or ctest names), note. A covered line must name tests that exist (a TEST/TEST_F/TEST_P
under TESTS_DIR, or a ctest test of BUILD_DIR); n/a and gap lines need a note saying why or what
a test would do. Exits 1 on a bad line, printing it.
"""
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path


def main(tsv, tests_dir, build_dir):
    gtests = set()
    for src in Path(tests_dir).rglob("*.cpp"):
        for suite, name in re.findall(r"\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\)", src.read_text(errors="replace")):
            gtests.add(f"{suite}.{name}")
    listed = subprocess.run(["ctest", "--test-dir", build_dir, "-N"], capture_output=True, text=True).stdout
    ctests = set(re.findall(r"Test +#\d+: (\S+)", listed))
    # The gtest tests by their full names, parameterized ones included, from the programs
    # themselves: ctest lists one test per suite in a build with VERBS_TEST_PER_SUITE (scripts/test).
    for exe in sorted(Path(build_dir, "tests").glob("verbs_*_tests")):
        out = subprocess.run([str(exe), "--gtest_list_tests"], capture_output=True, text=True).stdout
        suite = None
        for row in out.splitlines():
            if not row.strip():
                continue
            if not row.startswith(" "):
                suite = row.split("#")[0].strip()
            elif suite:
                ctests.add(suite + row.split("#")[0].strip())
    bad, counts, seen = [], Counter(), set()
    for n, line in enumerate(Path(tsv).read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        f = line.split("\t")
        if len(f) != 5:
            bad.append(f"{n}: want 5 tab-separated fields, got {len(f)}")
            continue
        where, method, verdict, ours, note = f
        if (where, method) in seen:
            bad.append(f"{n}: {where} {method} twice")
        seen.add((where, method))
        counts[verdict] += 1
        names = [t.strip() for t in ours.split(",") if t.strip()]
        if verdict == "covered":
            missing = [t for t in names if t not in gtests and t not in ctests]
            if not names:
                bad.append(f"{n}: {method} covered by no test")
            if missing:
                bad.append(f"{n}: {method}: no test named {', '.join(missing)}")
        elif verdict in ("n/a", "gap"):
            if not note.strip():
                bad.append(f"{n}: {method} is {verdict} without a note")
        else:
            bad.append(f"{n}: {method}: verdict '{verdict}' (covered, n/a or gap)")
    for b in bad:
        print("rdma-core-coverage:", b)
    total = sum(counts.values())
    print(f"rdma-core tests/: {total} generic methods: {counts['covered']} covered, {counts['n/a']} not applicable, "
          f"{counts['gap']} gaps")
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:]))
