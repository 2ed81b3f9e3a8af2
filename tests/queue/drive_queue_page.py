#!/usr/bin/env python3
"""Drives headless Chromium through the waiting page, for tests/api/queue/page.rs.

Uses the DevTools-over-a-pipe browser of tests/live/drive_page.py. Opens URL (the visitor
token in its fragment, which the browser never sends), waits for each --expect string to show
in the DOM in turn (each may be passing: "waiting" before "admitted"), checks that every
resource the page loaded came from the page's own origin, and prints the last DOM.

With --header "Name: value" every request carries that header (Accept-Language, say); with
--shop ORIGIN the page may hand the visitor over to that origin (the expectations after the
hand-over are read from the shop's page, whose resources come from the shop).

Usage: drive_queue_page.py URL [--expect TEXT]... [--timeout SECONDS] [--header H]... [--shop O]
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
    p.add_argument("--header", action="append", default=[])
    p.add_argument("--shop", default=None)
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
        if args.header:
            browser.send("Network.enable")
            headers = dict(h.split(":", 1) for h in args.header)
            browser.send("Network.setExtraHTTPHeaders",
                         {"headers": {k.strip(): v.strip() for k, v in headers.items()}})
        browser.send("Page.navigate", {"url": args.url})
        deadline = time.monotonic() + args.timeout
        dom = ""
        for expect in args.expect:
            while True:
                try:
                    dom = browser.evaluate("document.documentElement.outerHTML") or ""
                except Exception:  # the page is navigating (a hand-over to the shop)
                    dom = ""
                if expect in dom:
                    break
                if time.monotonic() > deadline:
                    sys.stderr.write(dom + "\n")
                    sys.exit(f"the page never showed: {expect!r}")
                time.sleep(0.05)
        here = urlsplit(browser.evaluate("location.href") or "")
        urls = browser.evaluate("performance.getEntries().map(e => e.name)") or []
        if args.shop and here.netloc == urlsplit(args.shop).netloc:
            # Handed over: the shop's page is the shop's, the waiting page's checks ran before.
            print(dom)
            return
        foreign = [u for u in urls
                   if urlsplit(u).scheme in ("http", "https") and urlsplit(u).netloc != origin.netloc]
        if foreign:
            sys.exit(f"the page loaded from another host: {foreign}")
        # It joined (the ticket's first reading) or polled: the page talks to the JSON routes.
        if not any("/v1/queue/" in u or u.endswith("/queue") and "/v1/skus/" in u for u in urls):
            sys.exit(f"the page never joined nor polled its ticket: {urls}")
        print(dom)
    finally:
        browser.close()


if __name__ == "__main__":
    main()
