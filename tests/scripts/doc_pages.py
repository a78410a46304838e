#!/usr/bin/env python3
"""Checks the guide's pages (README.md and docs/*.md, as cmake/doc_snippets.cmake lists them).

Usage: doc_pages.py SOURCE_DIR PAGE...

- Every relative link and image of a page resolves: the file or directory exists, and an anchor
  (#heading) names a heading of the target page, as GitHub makes anchors from headings.
- No page has two headings with the same anchor.
- docs/options.md: every `struct ...Options` of include/verbs/*.hpp has a function there that
  returns it with every field, in the order the header declares them (one `.field = ...` a line);
  so does every other struct that docs/options.md returns.
Exit status 0 when all holds; 1 with each failure printed.
"""
import os
import re
import sys

FENCE = re.compile(r"^ *```")


def prose_lines(text):
    """(line number, line) of the lines outside fenced blocks, inline code removed."""
    inside = False
    for n, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            inside = not inside
            continue
        if not inside:
            yield n, re.sub(r"`[^`]*`", "``", line)


def anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"`", "", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(text):
    return [(n, anchor(m.group(2))) for n, line in prose_lines(text) if (m := re.match(r"^(#{1,6}) +(.*?) *#*$", line))]


def struct_fields(include_dir):
    """{struct name: [field, ...]} of every struct defined at namespace level in the headers."""
    fields = {}
    for name in sorted(os.listdir(include_dir)):
        text = open(os.path.join(include_dir, name)).read()
        for m in re.finditer(r"^struct (\w+) \{\n(.*?)^\};", text, re.S | re.M):
            body = re.sub(r"//[^\n]*", "", m.group(2))
            while re.search(r"<[^<>]*>", body):  # template arguments, innermost first
                body = re.sub(r"<[^<>]*>", "", body)
            names, depth, stmt = [], 0, ""
            for ch in body:
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                if ch == ";" and depth == 0:
                    s = " ".join(stmt.split())
                    stmt = ""
                    head = re.split(r"[={]", s, maxsplit=1)[0].strip()
                    if not head or re.match(r"(friend|static|using|template|enum|struct|class)\b", head) or "(" in head:
                        continue
                    if (ident := re.search(r"(\w+)(\[[^]]*\])?$", head)):
                        names.append(ident.group(1))
                else:
                    stmt += ch
            fields[m.group(1)] = names
    return fields


def main():
    top, pages = sys.argv[1], sys.argv[2:]
    failures = []
    texts = {os.path.realpath(p): open(p).read() for p in pages}
    anchors = {}
    for page, text in texts.items():
        rel = os.path.relpath(page, top)
        seen = {}
        for n, a in headings(text):
            if a in seen:
                failures.append(f"{rel}:{n}: a second heading with the anchor #{a} (line {seen[a]})")
            seen.setdefault(a, n)
        anchors[page] = set(seen)
    for page, text in texts.items():
        rel = os.path.relpath(page, top)
        for n, line in prose_lines(text):
            for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", line):
                target = m.group(1)
                if re.match(r"[a-z]+:", target):
                    continue
                path, _, frag = target.partition("#")
                dest = os.path.realpath(os.path.join(os.path.dirname(page), path)) if path else page
                if not os.path.exists(dest):
                    failures.append(f"{rel}:{n}: {target}: no such file")
                    continue
                if frag:
                    if dest not in anchors and dest.endswith(".md"):
                        anchors[dest] = {a for _, a in headings(open(dest).read())}
                    if frag not in anchors.get(dest, set()):
                        failures.append(f"{rel}:{n}: {target}: no heading with that anchor")
    # The options page against the headers.
    options = os.path.realpath(os.path.join(top, "docs", "options.md"))
    if options in texts:
        fields = struct_fields(os.path.join(top, "include", "verbs"))
        documented = {}
        lines = texts[options].split("\n")
        for i, line in enumerate(lines):
            m = re.match(r"^verbs::(?:cm::|rails::)?(\w+) \w+\([^)]*\) \{$", line)
            if not m:
                continue
            names = []
            for body in lines[i + 1:]:
                if re.match(r"^ *\};$", body):
                    break
                if (d := re.match(r"^ +\.(\w+) =", body)):
                    names.append(d.group(1))
            documented[m.group(1)] = (i + 1, names)
        for struct in sorted(fields):
            if struct.endswith("Options") and struct not in documented:
                failures.append(f"docs/options.md: no function returning {struct} (fields: {', '.join(fields[struct])})")
        for struct, (n, names) in sorted(documented.items()):
            if struct not in fields:
                failures.append(f"docs/options.md:{n}: {struct} is not a struct of include/verbs")
            elif names != fields[struct]:
                failures.append(f"docs/options.md:{n}: {struct} lists {names}; the header declares {fields[struct]}")
    for f in failures:
        print(f)
    print(f"doc_pages: {len(pages)} pages, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
