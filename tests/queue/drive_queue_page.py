#!/usr/bin/env python3
"""Drives headless Chromium through the waiting page, for tests/api/queue/page.rs.

Uses the DevTools-over-a-pipe browser of tests/live/drive_page.py. Opens URL (the visitor
token in its fragment, which the browser never sends), waits for each --expect string to show
in the DOM in turn (each may be passing: "waiting" before "admitted"), checks that every
resource the page loaded came from the page's own origin, and prints the last DOM.

Usage: drive_queue_page.py URL [--expect TEXT]... [--timeout SECONDS]
Exit status: 0 when every expectation held in order; 1 with the DOM on stderr otherwise.
"""
import argparse
import os
import shutil
import sys
import time
from urllib.parse import urlsplit

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "live"))
from drive_page import Browser  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--expect", action="append", default=[])
    p.add_argument("--timeout", type=float, default=60)
    args = p.parse_args()
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        sys.exit("chromium is not installed (apt-get install chromium)")
    origin = urlsplit(args.url)
    browser = Browser(binary)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = browser.send("Target.attachToTarget",
                                {"targetId": target["targetId"], "flatten": True}, session=False)
        browser.session = attached["sessionId"]
        browser.send("Page.enable")
        browser.send("Page.navigate", {"url": args.url})
        deadline = time.monotonic() + args.timeout
        dom = ""
        for expect in args.expect:
            while True:
                dom = browser.evaluate("document.documentElement.outerHTML") or ""
                if expect in dom:
                    break
                if time.monotonic() > deadline:
                    sys.stderr.write(dom + "\n")
                    sys.exit(f"the page never showed: {expect!r}")
                time.sleep(0.05)
        urls = browser.evaluate("performance.getEntries().map(e => e.name)") or []
        foreign = [u for u in urls
                   if urlsplit(u).scheme in ("http", "https") and urlsplit(u).netloc != origin.netloc]
        if foreign:
            sys.exit(f"the page loaded from another host: {foreign}")
        if not any("/v1/queue/" in u for u in urls):
            sys.exit(f"the page never polled its ticket: {urls}")
        print(dom)
    finally:
        browser.close()


if __name__ == "__main__":
    main()
