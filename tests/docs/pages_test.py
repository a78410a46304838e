#!/usr/bin/env python3
"""The docs.pages test: cmake/site/pages.py on small pages made here. What it writes for links,
images and headings, and that a link or image leading nowhere fails it, naming page and line.

usage: pages_test.py PAGES_PY
"""

import os
import subprocess
import sys
import tempfile
import unittest

PAGES_PY = None


def tree(root, files):
    for path, text in files.items():
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, 'w' if isinstance(text, str) else 'wb') as f:
            f.write(text)


def run(root, *pages):
    stage, html = os.path.join(root, 'build', 'pages'), os.path.join(root, 'build', 'html')
    p = subprocess.run([sys.executable, PAGES_PY, root, stage, html, *pages], capture_output=True, text=True)
    return p.returncode, p.stderr, stage, html


def read(path):
    with open(path, encoding='utf-8') as f:
        return f.read()


class Pages(unittest.TestCase):
    def test_links_images_and_headings(self):
        with tempfile.TemporaryDirectory() as root:
            tree(root, {
                'README.md': '# proj\n\nSee [mem](docs/memory.md), [its pool](docs/memory.md#the-pool-2-1), '
                             '[here](#usage), [ex](examples/a.cpp), [dir](examples).\n\n'
                             '![plot](bench/p.png)\n\n## Usage\n\n```sh\n# not a heading [x](nowhere.md)\n```\n',
                'docs/memory.md': '# Memory\n\nBack [home](../README.md#usage), `a::b [x](nowhere.md)`, '
                                  'Pending*::Impl.\n\n![plot](../bench/p.png "title")\n\n'
                                  '## The `pool`: 2\n\n## The pool 2\n\n[ref]: design/cm.md#cm\n',
                'docs/design/cm.md': '# CM\n',
                'examples/a.cpp': 'int main() {}\n',
                'bench/p.png': b'\x89PNG',
            })
            rc, err, stage, html = run(root, 'README.md', 'docs/memory.md', 'docs/design/cm.md')
            self.assertEqual(rc, 0, err)
            readme, memory = read(os.path.join(stage, 'README.md')), read(os.path.join(stage, 'docs/memory.md'))
            self.assertIn('[mem](@ref docs_memory)', readme)
            self.assertIn('[its pool](@ref docs_memory-the-pool-2-1)', readme)  # the second "the pool 2"
            self.assertIn('[here](@ref index-usage)', readme)
            self.assertIn('[ex](repo/examples/a.cpp)', readme)
            self.assertIn('[dir](repo/examples/index.html)', readme)
            self.assertIn('![plot](repo/bench/p.png)', readme)
            self.assertIn('## Usage {#index-usage}', readme)
            self.assertIn('# not a heading [x](nowhere.md)\n', readme)        # code is left alone
            self.assertTrue(readme.startswith('# proj\n'))                    # the main page: no id
            self.assertIn('# Memory {#docs_memory}', memory)
            self.assertIn('[home](@ref index-usage)', memory)
            self.assertIn('`a::b [x](nowhere.md)`', memory)
            self.assertIn('Pending*\\::Impl', memory)
            self.assertIn('![plot](repo/bench/p.png "title")', memory)
            self.assertIn('## The `pool`: 2 {#docs_memory-the-pool-2}', memory)
            self.assertIn('## The pool 2 {#docs_memory-the-pool-2-1}', memory)
            self.assertIn('[ref]: @ref docs_design_cm\n', memory)               # the title: the page
            self.assertEqual(len(read(os.path.join(root, 'README.md')).split('\n')), len(readme.split('\n')))
            for f in ('repo/examples/a.cpp', 'repo/examples/index.html', 'repo/bench/p.png'):
                self.assertTrue(os.path.isfile(os.path.join(html, f)), f)
            self.assertEqual(read(os.path.join(stage, 'pages.tsv')),
                             'index.html\tREADME.md\ndocs_memory.html\tdocs/memory.md\n'
                             'docs_design_cm.html\tdocs/design/cm.md\n')

    def test_a_link_to_nothing_fails(self):
        with tempfile.TemporaryDirectory() as root:
            tree(root, {
                'README.md': '# proj\n\n[a](docs/nope.md) [b](docs/g.md#nope) [c](#nope)\n![d](nope.png)\n'
                             '[e](other/x.md) [f](../outside.txt)\n',
                'docs/g.md': 'No title line.\n',
                'other/x.md': '# X\n',
            })
            rc, err, _, _ = run(root, 'README.md', 'docs/g.md')
            self.assertEqual(rc, 1)
            for want in ("README.md:3: link 'docs/nope.md': no file docs/nope.md",
                         "README.md:3: link 'docs/g.md#nope': docs/g.md has no heading whose anchor is 'nope'",
                         "README.md:3: link '#nope': README.md has no heading whose anchor is 'nope'",
                         "README.md:4: image 'nope.png': no file nope.png",
                         "README.md:5: link 'other/x.md': other/x.md is not a page of the site",
                         "README.md:5: link '../outside.txt': no file ../outside.txt",
                         "docs/g.md:1: a page starts with its title"):
                self.assertIn(want, err)


if __name__ == '__main__':
    PAGES_PY = sys.argv.pop(1)
    unittest.main()
