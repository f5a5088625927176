#!/usr/bin/env python3
"""How much memory idemd gives back after a burst of records goes.

Usage: memory-return.py PORT PID forget|expire [THOUSANDS] [SECONDS] [--redis]

Claims THOUSANDS x 1000 keys (default 1,000,000) in pipelines of 1000,
then FORGETs them (forget) or lets their 6 s leases lapse (expire), waits
SECONDS (default 10) without sending a command, and prints the server's
RSS (from /proc/PID/status) fresh, at the peak, and at the end, with the
ratio end / fresh; then the anonymous part of RSS (the heap, without the
binary's code pages, whose residency differs from one copy of the binary
to another) fresh and at the end.

With --redis the server is Redis, for comparison: SET key 1 NX PX lease
for a claim, DEL for a FORGET, and DBSIZE to see the records gone.
"""
import socket
import sys
import time

redis = "--redis" in sys.argv
argv = [a for a in sys.argv if a != "--redis"]
port, pid, mode = int(argv[1]), int(argv[2]), argv[3]
batches = int(argv[4]) if len(argv) > 4 else 1000
wait = int(argv[5]) if len(argv) > 5 else 10


def rss_mb(field="VmRSS"):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024


conn = socket.create_connection(("127.0.0.1", port))


def info(field):
    conn.sendall(b"INFO\r\n")
    got = b""
    while True:
        got += conn.recv(1 << 20)
        head, _, rest = got.partition(b"\r\n")
        if head.startswith(b"$") and len(rest) >= int(head[1:]):
            break
    for line in got.decode().split("\r\n"):
        if line.startswith(field + ":"):
            return line.split(":")[1]


def run(cmds, want):
    conn.sendall(b"".join(cmds))
    got = b""
    while got.count(want) < len(cmds):
        got += conn.recv(1 << 20)


def keys(b):
    return (b"k-%d-%d" % (b, i) for i in range(1000))


def bulk(a):
    return b"$%d\r\n%s\r\n" % (len(a), a)


conn.sendall(b"PING\r\n")
conn.recv(10)
time.sleep(1)
fresh = rss_mb()
fresh_anon = rss_mb("RssAnon")
lease = b"6000" if mode == "expire" else b"600000"
t0 = time.time()
for b in range(batches):
    if redis:
        run([b"*6\r\n" + bulk(b"SET") + bulk(k) + bulk(b"1") + bulk(b"NX") + bulk(b"PX")
             + bulk(lease) for k in keys(b)], b"+OK")
    else:
        run([b"*4\r\n" + bulk(b"CLAIM") + bulk(k) + bulk(b"LEASE") + bulk(lease)
             for k in keys(b)], b"ACQUIRED")
peak = rss_mb()
print(f"fresh {fresh:.1f} MB; {batches * 1000} records in {time.time() - t0:.1f} s, "
      f"peak {peak:.1f} MB", end="; ")
if mode == "forget":
    for b in range(batches):
        run([b"*2\r\n" + bulk(b"DEL" if redis else b"FORGET") + bulk(k) for k in keys(b)],
            b":1")
elif redis:
    while True:
        conn.sendall(b"DBSIZE\r\n")
        if conn.recv(64).strip() == b":0":
            break
        time.sleep(0.5)
else:
    while info("records") != "0":
        time.sleep(0.5)
print(f"all gone at {time.time() - t0:.1f} s ({rss_mb():.1f} MB)", end="; ")
time.sleep(wait)
end = rss_mb()
end_anon = rss_mb("RssAnon")
print(f"{wait} s later {end:.1f} MB, {end / fresh:.2f}x fresh; "
      f"anonymous {fresh_anon:.1f} -> {end_anon:.1f} MB (+{end_anon - fresh_anon:.1f})")
