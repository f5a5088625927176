#!/usr/bin/env python3
"""What hostile clients cost a server: idemd or Redis, side by side.

Usage: hostile.py idem|redis PORT PID CASE [ARGS]

The server runs on 127.0.0.1:PORT with process id PID (for /proc). Cases:

  amplify [CONNS] [REPLAYS]  one key holds a 1 MiB value; CONNS (100)
      connections each pipeline REPLAYS (30) reads of it (idemd: CLAIM of
      the completed key; Redis: GET) and never read a reply. For 12 s a
      separate connection PINGs every 10 ms. Prints the peak RSS, PING p99
      and max, and how many of the hogs the server disconnected.
  storm [N]  N (5,200) non-blocking connects at once, each sends PING;
      prints the time until every one is answered (or how many were not
      within 30 s).
  trickle [CONNS] [BYTES]  CONNS (100) connections each send an inline
      PING line of BYTES (20,000) bytes with its CR LF, one byte per send,
      round-robin, while
      a separate process PINGs every 10 ms. Prints the server's CPU
      seconds over the trickle, its duration, and PING p99 and max.
  idle [N]  N (10,000) connections that each send one PING and then stay
      idle; prints RSS growth per connection (after 2 s).
  fds [N]  N (300) connections, each PINGed once (waiting up to 2 s for
      each reply); prints how many were answered, refused or closed, and
      left hanging (the server
      is meant to be started with a low open files limit, e.g.
      `prlimit --nofile=256 idemd ...`).

Every case opens its own connections; run each on a fresh server. Only
amplify writes (its setup CLAIM and COMPLETE): against a cluster, give it
the leader's port; the other cases send PING and run against any node.
"""
import multiprocessing
import os
import resource
import selectors
import socket
import sys
import time

kind, port, pid, case = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
args = [int(a) for a in sys.argv[5:]]
ADDR = ("127.0.0.1", port)


def rss_mb():
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_secs():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def bulk(a):
    return b"$%d\r\n%s\r\n" % (len(a), a)


def command(*parts):
    return b"*%d\r\n" % len(parts) + b"".join(bulk(p) for p in parts)


def reply(s):
    """One reply's bytes (enough for the simple replies used here)."""
    got = b""
    while not got.endswith(b"\r\n"):
        chunk = s.recv(1 << 16)
        if not chunk:
            raise ConnectionError("closed")
        got += chunk
    return got


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def pinger(seconds, out):
    """PINGs every 10 ms for `seconds` on its own connection; puts the
    sorted latencies (ms) on `out` (a missing reply counts as `seconds`)."""
    s = socket.create_connection(ADDR)
    s.settimeout(seconds)
    lat = []
    end = time.time() + seconds
    while time.time() < end:
        t = time.perf_counter()
        try:
            s.sendall(b"PING\r\n")
            reply(s)
            lat.append((time.perf_counter() - t) * 1000)
        except OSError:
            lat.append(seconds * 1000)
            break
        time.sleep(0.01)
    out.put(sorted(lat))


def summary(lat):
    if not lat:
        return "no PING answered"
    return "PING p99 %.1f ms, max %.1f ms (%d probes)" % (
        lat[min(len(lat) - 1, int(len(lat) * 0.99))], lat[-1], len(lat))


def amplify(conns=100, replays=30):
    raise_nofile(conns + 64)
    c = socket.create_connection(ADDR)
    value = b"v" * (1 << 20)
    if kind == "idem":
        c.sendall(command(b"CLAIM", b"amp"))
        got = b""
        while got.count(b"\r\n") < 3:
            chunk = c.recv(256)
            if not chunk:
                raise ConnectionError("closed")
            got += chunk
            if got.startswith(b"-") and got.endswith(b"\r\n"):
                # e.g. -MOVED from a cluster's follower: the setup write
                # must go to the leader.
                sys.exit("amplify: the setup CLAIM was refused: %s (run it against "
                         "a single node or a cluster's leader)" % got.strip().decode())
        fence = got.split(b"\r\n")[2].lstrip(b":")
        c.sendall(command(b"COMPLETE", b"amp", fence, value))
        read = command(b"CLAIM", b"amp")
    else:
        c.sendall(command(b"SET", b"amp", value))
        read = command(b"GET", b"amp")
    reply(c)
    before = rss_mb()
    out = multiprocessing.Queue()
    probe = multiprocessing.Process(target=pinger, args=(12, out))
    probe.start()
    hogs = []
    for _ in range(conns):
        h = socket.create_connection(ADDR)
        h.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        h.sendall(read * replays)
        hogs.append(h)
    peak = before
    end = time.time() + 12
    while time.time() < end:
        peak = max(peak, rss_mb())
        time.sleep(0.05)
    lat = out.get()
    probe.join()
    closed = 0
    for h in hogs:
        h.setblocking(False)
        try:
            while True:
                chunk = h.recv(1 << 20)
                if not chunk:
                    closed += 1
                    break
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    print(f"{kind} amplify: {conns} x {replays} unread 1 MiB replays: RSS {before:.0f} MB -> "
          f"peak {peak:.0f} MB; {summary(lat)}; {closed} hogs disconnected")


def storm(n=5200):
    raise_nofile(n + 64)
    sel = selectors.DefaultSelector()
    t0 = time.perf_counter()
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(ADDR)
        sel.register(s, selectors.EVENT_WRITE)
        socks.append(s)
    pending = n
    failed = 0
    deadline = time.time() + 30
    while pending and time.time() < deadline:
        for key, ev in sel.select(timeout=0.5):
            s = key.fileobj
            try:
                if ev & selectors.EVENT_WRITE:
                    s.send(b"PING\r\n")
                    sel.modify(s, selectors.EVENT_READ)
                    continue
                if not s.recv(64):
                    failed += 1
            except OSError:
                failed += 1
            # Answered, closed or failed: done with it.
            pending -= 1
            sel.unregister(s)
    took = time.perf_counter() - t0
    if pending or failed:
        print(f"{kind} storm: {n} connects: {failed} closed or failed, "
              f"{pending} not answered within 30 s")
    else:
        print(f"{kind} storm: {n} connects each answered PONG in {took:.2f} s")


def trickle(conns=100, nbytes=20000):
    raise_nofile(conns + 64)
    socks = [socket.create_connection(ADDR) for _ in range(conns)]
    for s in socks:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    stop = multiprocessing.Event()
    out = multiprocessing.Queue()

    def probe_until_stopped():
        s = socket.create_connection(ADDR)
        s.settimeout(30)
        lat = []
        while not stop.is_set():
            t = time.perf_counter()
            s.sendall(b"PING\r\n")
            reply(s)
            lat.append((time.perf_counter() - t) * 1000)
            time.sleep(0.01)
        out.put(sorted(lat))

    probe = multiprocessing.Process(target=probe_until_stopped)
    cpu0, t0 = cpu_secs(), time.time()
    probe.start()
    line = b"PING " + b"x" * (nbytes - 7) + b"\r\n"
    for i in range(len(line)):
        b = line[i:i + 1]
        for s in socks:
            s.send(b)
    took = time.time() - t0
    cpu = cpu_secs() - cpu0
    stop.set()
    lat = out.get()
    probe.join()
    print(f"{kind} trickle: {conns} connections x {nbytes} bytes one byte per send: "
          f"{took:.1f} s, server CPU {cpu:.1f} s ({100 * cpu / took:.0f}%); {summary(lat)}")


def idle(n=10000):
    raise_nofile(n + 64)
    first = socket.create_connection(ADDR)
    first.sendall(b"PING\r\n")
    reply(first)
    time.sleep(0.5)
    before = rss_mb()
    socks = []
    for _ in range(n):
        s = socket.create_connection(ADDR)
        s.sendall(b"PING\r\n")
        reply(s)
        socks.append(s)
    time.sleep(2)
    after = rss_mb()
    print(f"{kind} idle: {n} idle connections: RSS {before:.1f} -> {after:.1f} MB, "
          f"{(after - before) * 1024 / n:.1f} KB per connection")


def fds(n=300):
    raise_nofile(n + 64)
    answered = refused = hanging = 0
    socks = []
    for _ in range(n):
        try:
            s = socket.create_connection(ADDR, timeout=2)
            socks.append(s)
        except OSError:
            refused += 1
    for s in socks:
        try:
            s.settimeout(2)
            s.sendall(b"PING\r\n")
            got = s.recv(256)
            if got.startswith(b"+PONG"):
                answered += 1
            else:
                refused += 1
        except socket.timeout:
            hanging += 1
        except OSError:
            refused += 1
    print(f"{kind} fds: {n} connections: {answered} answered, {refused} refused or closed "
          f"(with an error or not), {hanging} left hanging")


{"amplify": amplify, "storm": storm, "trickle": trickle, "idle": idle,
 "fds": fds}[case](*args)
