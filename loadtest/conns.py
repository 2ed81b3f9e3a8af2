#!/usr/bin/env python3
"""conns.py HOST PORT N MODE PID: opens N connections to HOST:PORT and holds them, then prints
the server PID's resident memory per held connection.

MODE "idle": the connection sends nothing (a client that connected and stalled);
"partial": it sends the start of a request and stalls (a slowloris client, or a buyer whose
request is stuck in transit); "kept": it sends a whole request (GET /healthz), reads the
answer and stays open (a kept-alive connection whose buyer went away). Prints one machine-readable line:
  CONNS_RESULT mode=<MODE> held=<N> rss_before_kib=<..> rss_after_kib=<..> per_conn_b=<..>
Every connection is opened before the reading, which is taken within the gateway's header
read timeout (5 s), so none has been closed by it yet: the server's open fds are counted to
prove it (held).
"""
import os
import resource
import socket
import sys
import time
from concurrent.futures import ThreadPoolExecutor

PARTIAL = b"POST /v1/skus/fp/claims HTTP/1.1\r\nHost: footprint\r\nContent-Type: appl"
WHOLE = b"GET /healthz HTTP/1.1\r\nHost: footprint\r\n\r\n"


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise SystemExit(f"no VmRSS for {pid}")


def sockets_of(pid):
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


def main():
    host, port, n, mode, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, n + 1024)), hard))
    time.sleep(0.5)
    before, sockets_before = rss_kib(pid), sockets_of(pid)
    def one(_):
        s = socket.create_connection((host, port))
        if mode == "partial":
            s.sendall(PARTIAL)
        elif mode == "kept":
            s.sendall(WHOLE)
            if not s.recv(4096).startswith(b"HTTP/1.1 200"):
                raise SystemExit("conns.py: /healthz did not answer 200")
        return s

    started = time.monotonic()
    # Many at once: a listener with a short accept queue drops SYNs under a burst, and each
    # dropped one waits a second for its retransmission; in parallel those waits overlap.
    with ThreadPoolExecutor(max_workers=64) as pool:
        held = list(pool.map(one, range(n)))
    # Let the server accept and poll the last ones; well inside its 5 s header timeout.
    time.sleep(max(0.2, 1.5 - (time.monotonic() - started)))
    after, sockets_after = rss_kib(pid), sockets_of(pid)
    open_now = sockets_after - sockets_before
    # The server's open sockets prove the connections are still held (none timed out yet).
    if open_now < n * 0.99:
        raise SystemExit(f"conns.py: only {open_now} of {n} connections held at the reading "
                         f"({time.monotonic() - started:.1f} s after the first)")
    print(f"CONNS_RESULT mode={mode} held={open_now} rss_before_kib={before} "
          f"rss_after_kib={after} per_conn_b={(after - before) * 1024 / n:.0f}", flush=True)
    for s in held:
        s.close()


if __name__ == "__main__":
    main()
