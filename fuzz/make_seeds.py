#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target into fuzz/corpus/<target>/:
requests in RESP (and inline) for the protocol targets, the data-dir
fixtures for the log and snapshot targets, and a few peer frames.
Run from anywhere: python3 fuzz/make_seeds.py"""

import hashlib
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

REQUESTS = [
    ["CLAIM", "order-1"],
    ["CLAIM", "order-1", "LEASE", "5000", "RETAIN", "86400000", "WAIT", "0",
     "FP", "\x00\xff\r\n", "ONEXPIRE", "RECOVER", "ATTEMPT", "a-1"],
    ["SETTLE", "k"], ["SETTLE", "k", "WAIT", "100"],
    ["COMPLETE", "k", "7", "", "RETAIN", "1000", "ERROR"],
    ["COMPLETE", "k", "7", "v"],
    ["RENEW", "k", "7", "LEASE", "9000"], ["JOURNAL", "k", "7", "step-2"],
    ["RELEASE", "k", "7"], ["ABANDON", "k", "7"], ["INSPECT", "k"], ["FORGET", "k"],
    ["PING"], ["PING", "hi"], ["ECHO", "x"], ["HELLO", "3", "AUTH", "default", "pw", "SETNAME", "svc"],
    ["AUTH", "pw"], ["AUTH", "user", "pw"], ["QUIT"], ["INFO", "stats", "keyspace"], ["DBSIZE"],
    ["CLIENT", "ID"], ["CLIENT", "SETNAME", "n"], ["CLIENT", "LIST"], ["CLIENT", "SETINFO", "LIB-NAME", "redis-rs"],
    ["COMMAND"], ["COMMAND", "COUNT"], ["COMMAND", "DOCS", "claim"], ["CONFIG", "GET", "max_*"],
    ["CONFIG", "RELOAD-TLS"], ["CLUSTER", "SLOTS"], ["CLUSTER", "KEYSLOT", "k"],
    ["CLUSTER", "ADD", "4", "10.0.0.4:17379", "10.0.0.4:7379"], ["CLUSTER", "PROMOTE", "4"],
    ["SELECT", "0"], ["ACL", "WHOAMI"], ["ACL", "LOG", "5"], ["ACL", "LOG", "RESET"], ["ACL", "CAT", "idem"],
]


def resp(args):
    out = b"*%d\r\n" % len(args)
    for a in args:
        b = a.encode("latin-1")
        out += b"$%d\r\n%s\r\n" % (len(b), b)
    return out


def write(target, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    name = hashlib.sha1(data).hexdigest()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def main():
    for args in REQUESTS:
        for target in ("frames", "commands"):
            write(target, resp(args))
    pipeline = b"".join(resp(a) for a in REQUESTS[:8])
    for target in ("frames", "commands"):
        write(target, pipeline)
        write(target, b"PING\r\nCLAIM k LEASE 100\r\n")
    # RESP3 types a server never reads but the decoder must survive.
    write("frames", b"%1\r\n+a\r\n:1\r\n~1\r\n,1.5\r\n#t\r\n_\r\n>1\r\n=5\r\ntxt:x\r\n")
    fixtures = os.path.join(ROOT, "tests", "fixtures")
    for wal in (
        os.path.join(fixtures, "data-v1", "log", "00000000000000000000.wal"),
        os.path.join(fixtures, "data-v1-snapshot", "data", "log", "00000000000000000000.wal"),
    ):
        with open(wal, "rb") as f:
            write("wal_segment", f.read().rstrip(b"\x00"))
    with open(os.path.join(fixtures, "data-v1-snapshot", "data", "snapshot"), "rb") as f:
        raw = f.read()
    at = raw.find(b"IDEMSNAP")
    if at >= 0:
        write("snapshot", raw[at:])
    # Peer frames: a 4-byte big-endian length, then postcard.
    for body in (b"\x03", b"\x00\x01" + b"\x00" * 16, b"\x01" + b"x" * 40):
        write("peer_frames", struct.pack(">I", len(body)) + body)


if __name__ == "__main__":
    main()
