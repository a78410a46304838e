#!/usr/bin/env python3
"""The site's pages (cmake --build build --target docs): README.md and the guide pages as
written for a forge's markdown, made into markdown Doxygen 1.9.4 renders with every link working.

Doxygen 1.9.4 alone, on these files, gets most links wrong without a warning: it turns
[x](memory.md) into a link to that page, but [x](memory.md#a-heading) stays a link to the .md
file; it gives headings autotoc_mdN anchors, so [x](#a-heading) is an error; an image or a file
is found relative to Doxygen's working directory, not to the page, so a guide page's
![p](../bench/results/compare.png) is left as a broken <img>; links to other files of the
repository (examples/x.cpp, bench/results/x.json, a directory) point into the HTML directory,
where nothing is. So before Doxygen runs, this script, for each page:

  - gives each heading an explicit Doxygen id made from the forge's anchor for it (the
    lowercased text, punctuation dropped, spaces as '-', -1, -2, ... for a repeat), prefixed with
    the page's name, so [x](#a-heading) and [x](memory.md#a-heading) have a target;
  - turns a link to a page (relative to the page it is in) into [x](@ref label), with the label
    of that page or heading: Doxygen then writes the right HTML file and fragment;
  - copies any other file a link or image names (relative to the page) into HTML_DIR/repo/, the
    same path it has in the repository, and links there (a directory gets an index.html listing
    its files, each copied);
  - writes '\\::' for a '::' that starts a word in prose (Pending*::Impl), which Doxygen would take
    for an explicit link request and fail on.

A link to a page or heading that does not exist, or to a file that is not in the repository, is an
error naming the page and line, and the script exits 1: the docs target fails. Fenced code blocks
and code spans are left alone. Lines are kept one for one, so Doxygen's warnings about
STAGE/docs/x.md:N are about docs/x.md:N.

usage: pages.py SOURCE_DIR STAGE_DIR HTML_DIR PAGE...   (PAGE relative to SOURCE_DIR; the first is
the main page). Writes STAGE_DIR/PAGE for each, and STAGE_DIR/pages.tsv: one line per page, its
HTML file name, a tab, its path in the repository (what tests/docs/browser.py opens).
"""

import html
import os
import re
import shutil
import sys
import urllib.parse

FENCE = re.compile(r'^[ \t]*(`{3,}|~{3,})')  # indented too: a fence in a list item
ATX = re.compile(r'^ {0,3}(#{1,6})[ \t]+(.*?)[ \t]*$|^ {0,3}(#{1,6})[ \t]*$')
SETEXT = re.compile(r'^ {0,3}(=+|-+)[ \t]*$')
# An inline link or image whose destination has no space: [text](dest) or ![alt](dest "title").
LINK = re.compile(r'(!?)\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^>]*>|[^\s()]+)(\s+"[^"]*")?\s*\)')
REFDEF = re.compile(r'^( {0,3}\[[^\]]+\]:[ \t]*)(<[^>]*>|\S+)(.*)$')
SCHEME = re.compile(r'^[A-Za-z][A-Za-z0-9+.-]*:')


def page_label(path):
    """The Doxygen name of a page other than the main page (index): its path without .md, '/' as
    '_' (docs/design/cm.md: docs_design_cm.html). Not Doxygen's own md_docs_design_cm, which it
    gives the file and would find twice."""
    return re.sub(r'[^A-Za-z0-9_-]', '_', os.path.splitext(path)[0])


def slug(text):
    """The anchor a forge (GitHub's github-slugger) gives a heading with this text."""
    text = re.sub(r'!?\[([^\]]*)\]\([^)]*\)', r'\1', text)   # a link or image: its text
    text = html.unescape(re.sub(r'<[^>]+>', '', text))      # HTML tags and entities
    parts = re.split(r'(`+[^`]*`+)', text)                  # outside code spans, _emphasis_
    text = ''.join(p if p.startswith('`') else re.sub(r'(?<!\w)_+|_+(?!\w)', '', p) for p in parts)
    text = text.replace('`', '').lower()
    text = ''.join(c for c in text if c.isalnum() or c in ' -_')
    return text.replace(' ', '-')


def id_of(label, anchor):
    """A Doxygen id ([A-Za-z_][A-Za-z0-9_-]*) for a forge anchor on the page labelled label."""
    return label + '-' + ''.join(c if (c.isascii() and (c.isalnum() or c in '-_')) else '_%x_' % ord(c)
                                 for c in anchor)


def code_spans(line):
    """(start, end) of each code span on the line (backtick runs of equal length)."""
    spans, i = [], 0
    while True:
        m = re.compile(r'`+').search(line, i)
        if not m:
            return spans
        close = re.compile(r'(?<!`)' + m.group(0) + r'(?!`)').search(line, m.end())
        if not close:
            return spans
        spans.append((m.start(), close.end()))
        i = close.end()


def lines_outside_fences(lines):
    """The indices of the lines that are not inside (or fences of) a fenced code block."""
    fence = None
    for i, line in enumerate(lines):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)
        elif fence is not None and m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                and line.strip() == m.group(1):
            fence = None
        elif fence is None:
            yield i


class Site:
    def __init__(self, source, stage, html_dir, pages):
        self.source, self.stage, self.html_dir = source, stage, html_dir
        self.pages = pages
        self.main = pages[0]
        self.label = {p: ('index' if p == self.main else page_label(p)) for p in pages}
        self.errors = []
        self.copied = set()
        self.text = {}
        self.headings = {}    # page: {forge anchor: (line index, level, setext)}
        for p in pages:
            with open(os.path.join(source, p), encoding='utf-8') as f:
                self.text[p] = f.read().split('\n')
            self.headings[p] = self.find_headings(p)

    def error(self, page, i, what):
        self.errors.append('%s:%d: %s' % (page, i + 1, what))

    def find_headings(self, page):
        lines = self.text[page]
        found, seen = {}, {}
        outside = set(lines_outside_fences(lines))
        for i in sorted(outside):
            line = lines[i]
            m = ATX.match(line)
            setext = False
            if m and m.group(2) is not None:
                level, text = len(m.group(1)), re.sub(r'[ \t]+#+$', '', m.group(2))
            elif (i + 1 in outside and line.strip() and SETEXT.match(lines[i + 1]) and not line.startswith(' ' * 4)
                  and not re.match(r'^\s*([-*+]|\d+[.)]|>|\|)', line) and (i == 0 or not lines[i - 1].strip())):
                level, text, setext = (1 if lines[i + 1].strip()[0] == '=' else 2), line.strip(), True
            else:
                continue
            base = slug(text)
            n = seen.get(base, 0)
            seen[base] = n + 1
            anchor = base if n == 0 else '%s-%d' % (base, n)
            found[anchor] = (i, level, setext)
        return found

    def target(self, page, i, dest, image):
        """What a link from page (line i) to dest becomes in the staged markdown, or None (error)."""
        if dest.startswith('<') and dest.endswith('>'):
            dest = dest[1:-1]
        if SCHEME.match(dest) or dest.startswith('//') or dest.startswith('@ref '):
            return dest
        path, _, anchor = dest.partition('#')
        if not path:
            return self.ref(page, i, page, anchor, dest)
        if path.startswith('/'):
            self.error(page, i, "link '%s': a path from the root of the site; write it relative to %s" % (dest, page))
            return None
        rel = os.path.normpath(os.path.join(os.path.dirname(page), urllib.parse.unquote(path)))
        if rel in self.label:
            if image:
                self.error(page, i, "image '%s' is a page" % dest)
                return None
            return self.ref(page, i, rel, anchor, dest)
        full = os.path.join(self.source, rel)
        if rel.startswith('..') or not os.path.exists(full):
            what = 'image' if image else 'link'
            self.error(page, i, "%s '%s': no file %s in the repository%s" % (
                what, dest, rel, '' if not rel.endswith('.md') else ' (nor a page of the site: %s)' % ', '.join(self.pages)))
            return None
        if rel.endswith('.md'):
            # Doxygen would take it for a page and fail to find one.
            self.error(page, i, "link '%s': %s is not a page of the site (README.md, docs/*.md, docs/design/*.md)"
                       % (dest, rel))
            return None
        if image and not os.path.isfile(full):
            self.error(page, i, "image '%s': %s is a directory" % (dest, rel))
            return None
        self.copy(rel)
        url = 'repo/' + rel + ('/index.html' if os.path.isdir(full) else '')
        return url + ('#' + anchor if anchor else '')

    def ref(self, page, i, to, anchor, dest):
        if not anchor:
            return '@ref ' + self.label[to]
        if anchor not in self.headings[to]:
            self.error(page, i, "link '%s': %s has no heading whose anchor is '%s' (its anchors: %s)" % (
                dest, to, anchor, ', '.join(self.headings[to]) or 'none'))
            return None
        line, level, _ = self.headings[to][anchor]
        if level == 1 and line == self.title_line(to):
            return '@ref ' + self.label[to]          # the page's title: the page itself
        return '@ref ' + id_of(self.label[to], anchor)

    def title_line(self, page):
        for i, line in enumerate(self.text[page]):
            if line.strip():
                return i
        return -1

    def copy(self, rel):
        """Copies the file or directory rel of the repository into HTML_DIR/repo/ (once)."""
        if rel in self.copied:
            return
        self.copied.add(rel)
        src, dst = os.path.join(self.source, rel), os.path.join(self.html_dir, 'repo', rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.isfile(src):
            shutil.copyfile(src, dst)
            return
        os.makedirs(dst, exist_ok=True)
        items = []
        for name in sorted(os.listdir(src)):
            if name.startswith('.'):
                continue
            if os.path.isfile(os.path.join(src, name)):
                self.copy(os.path.join(rel, name))
                items.append('<li><a href="%s">%s</a></li>' % (html.escape(name, True), html.escape(name)))
            else:
                items.append('<li>%s/</li>' % html.escape(name))
        with open(os.path.join(dst, 'index.html'), 'w', encoding='utf-8') as f:
            f.write('<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>%s/</title></head>\n'
                    '<body><h1>%s/</h1>\n<ul>\n%s\n</ul></body></html>\n'
                    % (html.escape(rel), html.escape(rel), '\n'.join(items)))

    def rewrite_prose(self, page, i, text):
        """One stretch of prose (no code span in it): its links, and '::' at the start of a word."""
        def link(m):
            image, dest = m.group(1) == '!', m.group(3)
            to = self.target(page, i, dest, image)
            if to is None:
                return m.group(0)
            return '%s[%s](%s%s)' % (m.group(1), self.rewrite_prose(page, i, m.group(2)), to, m.group(4) or '')
        out, last = [], 0
        for m in LINK.finditer(text):
            out.append(re.sub(r'(?<![A-Za-z0-9_:\\])::(?=[A-Za-z_])', r'\\::', text[last:m.start()]))
            out.append(link(m))
            last = m.end()
        out.append(re.sub(r'(?<![A-Za-z0-9_:\\])::(?=[A-Za-z_])', r'\\::', text[last:]))
        return ''.join(out)

    def rewrite_line(self, page, i, line):
        m = REFDEF.match(line)
        if m:
            to = self.target(page, i, m.group(2), False)
            return line if to is None else m.group(1) + to + m.group(3)
        out, last = [], 0
        for start, end in code_spans(line):
            out.append(self.rewrite_prose(page, i, line[last:start]))
            out.append(line[start:end])
            last = end
        out.append(self.rewrite_prose(page, i, line[last:]))
        return ''.join(out)

    def stage_page(self, page):
        lines = list(self.text[page])
        title = self.title_line(page)
        if title < 0 or not (ATX.match(lines[title]) and lines[title].lstrip().startswith('# ')):
            self.error(page, max(title, 0), "a page starts with its title, a line '# Title'")
        for i in lines_outside_fences(lines):
            lines[i] = self.rewrite_line(page, i, lines[i])
        label = self.label[page]
        for anchor, (i, level, setext) in self.headings[page].items():
            if i == title:
                # The page's title: Doxygen names the page after its id (the main page is index).
                if page != self.main:
                    lines[i] = lines[i].rstrip() + ' {#%s}' % label
                continue
            lines[i] = re.sub(r'([ \t]+#+)?[ \t]*$', '', lines[i]) + ' {#%s}' % id_of(label, anchor)
        dst = os.path.join(self.stage, page)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        with open(dst, 'w', encoding='utf-8') as f:
            f.write('\n'.join(lines))

    def run(self):
        shutil.rmtree(os.path.join(self.html_dir, 'repo'), ignore_errors=True)
        for p in self.pages:
            self.stage_page(p)
        with open(os.path.join(self.stage, 'pages.tsv'), 'w', encoding='utf-8') as f:
            for p in self.pages:
                f.write('%s.html\t%s\n' % (self.label[p], p))
        for e in self.errors:
            print(e, file=sys.stderr)
        if self.errors:
            print('pages.py: %d broken link(s) or image(s) above: the site is not made' % len(self.errors),
                  file=sys.stderr)
        return 1 if self.errors else 0


def main(argv):
    if len(argv) < 5:
        print(__doc__.strip().split('\n\n')[-1], file=sys.stderr)
        return 2
    source, stage, html_dir = (os.path.abspath(a) for a in argv[1:4])
    pages = [os.path.normpath(p) for p in argv[4:]]
    return Site(source, stage, html_dir, pages).run()


if __name__ == '__main__':
    sys.exit(main(sys.argv))
