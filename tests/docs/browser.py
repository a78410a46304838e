#!/usr/bin/env python3
"""The docs.browser test: opens the site (cmake --build build --target docs) in headless Chromium
and checks what a reader would meet.

usage: browser.py HTML_DIR PAGES_TSV SCREENSHOT_PNG

For the index and every page PAGES_TSV lists (cmake/site/pages.py writes it: HTML file, tab,
source), it loads the page and, in the page (Chrome DevTools Protocol over --remote-debugging-pipe,
so nothing but Python's standard library is needed), reads
  - every image (document.images): it must have loaded (complete, naturalWidth > 0);
  - every <a href> that leads to a local file: the file must exist inside HTML_DIR, and a
    #fragment must be an id (or <a name>) in that file when it is HTML.
Each failure names the page (and its source) and the link or image. The index's screenshot is
written to SCREENSHOT_PNG and its path printed. Exit 0: all good; 1: something broken; 77: no
Chromium here (scripts/setup installs it).
"""

import base64
import fcntl
import html.parser
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

TIMEOUT = 30  # seconds for any one step in the browser

# Run in each page once it has loaded: lets Doxygen's scripts fill the navigation tree (a few
# animation frames, and SETTLE ms more where a screenshot follows), waits up to 10 s for images
# still loading, then lists the images and the links as the browser resolved them.
INSPECT = r'''(async () => {
  const frames = n => new Promise(r => { const f = k => k ? requestAnimationFrame(() => f(k - 1)) : r(); f(n); });
  await frames(3);
  await new Promise(r => setTimeout(r, SETTLE));
  await Promise.all(Array.from(document.images).filter(i => !i.complete).map(i => new Promise(r => {
    i.addEventListener('load', r); i.addEventListener('error', r); setTimeout(r, 10000); })));
  return {
    url: location.href,
    title: document.title,
    images: Array.from(document.images, i => ({src: i.currentSrc || i.src, ok: i.complete && i.naturalWidth > 0})),
    links: Array.from(document.querySelectorAll('a[href]'), a => ({href: a.href, raw: a.getAttribute('href'),
                                                                   text: a.textContent.trim().slice(0, 60)})),
  };
})()'''


class Browser:
    """Headless Chromium driven over its DevTools pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self, exe):
        self.profile = tempfile.mkdtemp(prefix='verbs-docs-browser-')
        to_chrome_r, self.to_chrome = os.pipe()
        self.from_chrome, from_chrome_w = os.pipe()

        def fds():  # in the child: the pipe ends as fds 3 and 4 (moved out of the way first)
            r, w = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10), fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.log = open(os.path.join(self.profile, 'chromium.log'), 'w+')
        self.proc = subprocess.Popen(
            [exe, '--headless', '--no-sandbox', '--disable-gpu', '--remote-debugging-pipe',
             '--user-data-dir=' + self.profile, '--window-size=1280,900', '--hide-scrollbars',
             '--no-first-run', '--no-default-browser-check', '--disable-extensions', '--disable-dev-shm-usage',
             'about:blank'],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
            pass_fds=(3, 4), preexec_fn=fds)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self.buf = b''
        self.next_id = 0
        self.events = []
        self.session = None

    def close(self):
        try:
            self.send('Browser.close', session=False, wait=False)
            self.proc.wait(timeout=10)
        except Exception:
            pass
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for fd in (self.to_chrome, self.from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        self.log.close()
        shutil.rmtree(self.profile, ignore_errors=True)

    def chromium_log(self):
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-3000:]

    def read_message(self, deadline):
        while b'\0' not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError('no answer from Chromium in %d s' % TIMEOUT)
            ready, _, _ = select.select([self.from_chrome], [], [], left)
            if ready:
                chunk = os.read(self.from_chrome, 1 << 20)
                if not chunk:
                    raise RuntimeError('Chromium closed its DevTools pipe (exit %s):\n%s'
                                       % (self.proc.poll(), self.chromium_log()))
                self.buf += chunk
        raw, _, self.buf = self.buf.partition(b'\0')
        return json.loads(raw)

    def send(self, method, params=None, session=True, wait=True):
        self.next_id += 1
        msg = {'id': self.next_id, 'method': method, 'params': params or {}}
        if session and self.session:
            msg['sessionId'] = self.session
        os.write(self.to_chrome, json.dumps(msg).encode() + b'\0')
        if not wait:
            return None
        deadline = time.monotonic() + TIMEOUT
        while True:
            reply = self.read_message(deadline)
            if reply.get('id') == self.next_id:
                if 'error' in reply:
                    raise RuntimeError('%s: %s' % (method, reply['error'].get('message')))
                return reply.get('result', {})
            if 'method' in reply:
                self.events.append(reply)

    def wait_event(self, method):
        deadline = time.monotonic() + TIMEOUT
        while True:
            for i, e in enumerate(self.events):
                if e['method'] == method:
                    return self.events.pop(i)
            self.events.append(self.read_message(deadline))

    def open_page(self):
        target = self.send('Target.createTarget', {'url': 'about:blank'}, session=False)['targetId']
        self.session = self.send('Target.attachToTarget', {'targetId': target, 'flatten': True},
                                 session=False)['sessionId']
        self.send('Page.enable')
        self.send('Emulation.setDeviceMetricsOverride',
                  {'width': 1280, 'height': 900, 'deviceScaleFactor': 1, 'mobile': False})

    def load(self, url):
        """Loads url; returns an error text, or None when it loaded."""
        self.events = [e for e in self.events if e['method'] != 'Page.loadEventFired']
        result = self.send('Page.navigate', {'url': url})
        if result.get('errorText'):
            return result['errorText']
        self.wait_event('Page.loadEventFired')
        return None

    def evaluate(self, expression):
        result = self.send('Runtime.evaluate', {'expression': expression, 'returnByValue': True,
                                                'awaitPromise': True})
        if 'exceptionDetails' in result:
            raise RuntimeError('script failed: %s' % result['exceptionDetails'].get('text'))
        return result['result']['value']

    def screenshot(self, path):
        data = self.send('Page.captureScreenshot', {'format': 'png'})['data']
        with open(path, 'wb') as f:
            f.write(base64.b64decode(data))


class Anchors(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        for k, v in attrs:
            if k == 'id' or (tag == 'a' and k == 'name'):
                self.ids.add(v)


def anchors_of(path, cache={}):
    if path not in cache:
        parser = Anchors()
        with open(path, encoding='utf-8', errors='replace') as f:
            parser.feed(f.read())
        cache[path] = parser.ids
    return cache[path]


def check_link(site, link):
    """None when the local link resolves, else why not."""
    url = urllib.parse.urlsplit(link['href'])
    path = os.path.realpath(urllib.request.url2pathname(url.path))
    if os.path.commonpath([site, path]) != site:
        return 'leads out of the site, to %s' % path
    if os.path.isdir(path):
        path = os.path.join(path, 'index.html')
    if not os.path.isfile(path):
        return 'no file %s' % os.path.relpath(path, site)
    fragment = urllib.parse.unquote(url.fragment)
    if fragment and path.endswith('.html') and fragment not in anchors_of(path):
        return 'no anchor #%s in %s' % (fragment, os.path.relpath(path, site))
    return None


def main(argv):
    if len(argv) != 4:
        print(__doc__.strip().split('\n\n')[1], file=sys.stderr)
        return 2
    site, pages_tsv, shot = os.path.realpath(argv[1]), argv[2], argv[3]
    exe = shutil.which('chromium') or shutil.which('chromium-browser') or shutil.which('google-chrome')
    if not exe:
        print('docs.browser: skipped: no Chromium here (scripts/setup installs Debian\'s chromium)')
        return 77
    pages = [('index.html', 'README.md')]
    with open(pages_tsv, encoding='utf-8') as f:
        for line in f:
            name, _, source = line.rstrip('\n').partition('\t')
            if name and name != 'index.html':
                pages.append((name, source))

    failures, checked_links, checked_images = [], 0, 0
    browser = Browser(exe)
    try:
        browser.open_page()
        for name, source in pages:
            where = '%s (%s)' % (name, source)
            path = os.path.join(site, name)
            if not os.path.isfile(path):
                failures.append('%s: not written' % where)
                continue
            error = browser.load('file://' + urllib.request.pathname2url(path))
            if error:
                failures.append('%s: did not load: %s' % (where, error))
                continue
            page = browser.evaluate(INSPECT.replace('SETTLE', '300' if name == 'index.html' else '0'))
            if name == 'index.html':
                os.makedirs(os.path.dirname(os.path.abspath(shot)), exist_ok=True)
                browser.screenshot(shot)
            for image in page['images']:
                checked_images += 1
                if not image['ok']:
                    failures.append('%s: image %s does not show' % (where, image['src']))
            for link in page['links']:
                if not link['href'].startswith('file:'):
                    continue
                checked_links += 1
                why = check_link(site, link)
                if why:
                    failures.append('%s: link "%s" (href="%s"): %s' % (where, link['text'], link['raw'], why))
            print('docs.browser: %s: "%s", %d images, %d links' % (where, page['title'], len(page['images']),
                                                                   len(page['links'])))
    except (RuntimeError, TimeoutError, OSError) as e:
        failures.append('the browser: %s' % e)
    finally:
        browser.close()

    print('docs.browser: screenshot of the index: %s' % os.path.abspath(shot))
    for f in failures:
        print('docs.browser: FAILED: %s' % f)
    print('docs.browser: %d pages, %d local links, %d images checked; %d broken'
          % (len(pages), checked_links, checked_images, len(failures)))
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
