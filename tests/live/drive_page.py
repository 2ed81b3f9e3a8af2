#!/usr/bin/env python3
"""Drives headless Chromium through the live drop page, for tests/api/live.rs.

Speaks the DevTools protocol over a pipe (--remote-debugging-pipe: no port, no driver, nothing
to install but Debian's chromium). Opens URL, types the admin token into the page's form the
way a person would (Input.insertText), waits until the DOM holds every --expect string, checks
that the token is in no URL the page loaded, saves a screenshot, and prints the DOM.

The token comes from the environment (DROPGATE_LIVE_TOKEN), never from an argument or a URL.

Usage: drive_page.py URL --screenshot PATH [--expect TEXT]... [--timeout SECONDS]
Exit status: 0 when every expectation held; 1 with the DOM on stderr otherwise.
"""
import argparse
import base64
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


class Browser:
    def __init__(self, binary):
        # fd 3: commands to Chromium; fd 4: its answers and events (NUL-terminated JSON).
        cmd_r, self.cmd_w = os.pipe()
        self.evt_r, evt_w = os.pipe()
        # Out of the way of 3 and 4, so the child's dup2 cannot clobber one with the other.
        high = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (cmd_r, evt_w)]
        self.profile = tempfile.mkdtemp(prefix="dg-chromium-")

        def wire():
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-extensions", "--remote-debugging-pipe", f"--user-data-dir={self.profile}",
             "--window-size=1440,900", "about:blank"],
            pass_fds=(3, 4), preexec_fn=wire,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        for fd in (cmd_r, evt_w, *high):
            os.close(fd)
        self.buffer = b""
        self.next_id = 0
        self.session = None

    def send(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self.read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def read(self):
        while b"\0" not in self.buffer:
            chunk = os.read(self.evt_r, 65536)
            if not chunk:
                raise RuntimeError("chromium closed the pipe")
            self.buffer += chunk
        msg, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(msg)

    def evaluate(self, expression):
        r = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        return r.get("result", {}).get("value")

    def close(self):
        try:
            self.send("Browser.close", session=False)
        except Exception:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        shutil.rmtree(self.profile, ignore_errors=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("--screenshot", required=True)
    p.add_argument("--expect", action="append", default=[])
    p.add_argument("--timeout", type=float, default=30)
    args = p.parse_args()
    token = os.environ["DROPGATE_LIVE_TOKEN"]
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if not binary:
        sys.exit("chromium is not installed (apt-get install chromium)")

    browser = Browser(binary)
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"}, session=False)
        attached = browser.send("Target.attachToTarget",
                                {"targetId": target["targetId"], "flatten": True}, session=False)
        browser.session = attached["sessionId"]
        browser.send("Page.enable")
        browser.send("Page.navigate", {"url": args.url})
        deadline = time.monotonic() + args.timeout
        while browser.evaluate("document.readyState === 'complete' && !!document.getElementById('token') "
                               "&& !document.getElementById('login').hidden") is not True:
            if time.monotonic() > deadline:
                sys.exit("the page did not show its token form")
            time.sleep(0.05)
        # Typed as a person would: focus the field, insert the text, press the button.
        browser.evaluate("document.getElementById('token').focus()")
        browser.send("Input.insertText", {"text": token})
        browser.evaluate("document.querySelector('#login button').click()")

        dom = ""
        while True:
            dom = browser.evaluate("document.documentElement.outerHTML") or ""
            missing = [e for e in args.expect if e not in dom]
            if not missing:
                break
            if time.monotonic() > deadline:
                sys.stderr.write(dom + "\n")
                sys.exit(f"the page never showed: {missing}")
            time.sleep(0.1)

        urls = browser.evaluate("[location.href, ...performance.getEntries().map(e => e.name)]")
        leaked = [u for u in urls if token in u]
        if leaked:
            sys.exit(f"the admin token is in a URL the page loaded: {len(leaked)} of them")
        if token in dom:
            sys.exit("the admin token is in the page's DOM")

        # The whole page, not only the window: every SKU's card is in the picture.
        size = browser.send("Page.getLayoutMetrics")["cssContentSize"]
        shot = browser.send("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1},
        })
        with open(args.screenshot, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
        print(dom)
    finally:
        browser.close()


if __name__ == "__main__":
    main()
