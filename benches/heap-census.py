#!/usr/bin/env python3
"""What keeps idemd's heap resident: a census of mimalloc's pages.

Usage: heap-census.py PID [--blocks]   (as root, or with kernel.yama.ptrace_scope=0)

Reads the running server's mimalloc arena through /proc/PID/pagemap and
/proc/PID/mem (nothing is stopped or changed) and prints, for every
allocator page with resident memory: its block size, blocks in use /
initialized / reserved, the owning thread (pthread id, as gdb's `info
threads` shows them), and how much of it is resident. A page whose few
live blocks keep many resident KiB is memory a burst left behind. With
--blocks it also prints the first 64 bytes of each live block of the
sparsest pages (up to 8 live blocks): pointers into the binary there
(vtables, statics) name the type with `gdb -p PID -batch -ex 'info symbol
ADDR'`.

It knows mimalloc 3.3 as libmimalloc-sys 0.1.49 builds it (release: page
metadata kept apart from the pages, no free-list encoding); another
version may lay its page header out differently, and then the census
finds no pages.
"""
import collections
import struct
import sys

ARENA_BASE = 0x20000000000  # where mimalloc reserves its first arena on x86-64 Linux
SLICE = 64 << 10            # mimalloc's arena slice (and small page) size
HEADER = "<QQHHHBBQQQQ"     # xthread_id free used capacity reserved retire_expire free_is_zero local_free xthread_free block_size page_start
HEADER_LEN = struct.calcsize(HEADER)

pid = int(sys.argv[1])
show_blocks = "--blocks" in sys.argv[2:]

arena = None
for line in open(f"/proc/{pid}/maps"):
    lo_s, hi_s = line.split()[0].split("-")
    if int(lo_s, 16) == ARENA_BASE:
        arena = (int(lo_s, 16), int(hi_s, 16))
if arena is None:
    sys.exit("no mimalloc arena at %#x in /proc/%d/maps" % (ARENA_BASE, pid))
lo, hi = arena
pages_4k = (hi - lo) // 4096
with open(f"/proc/{pid}/pagemap", "rb") as pm:
    pm.seek(lo // 4096 * 8)
    raw = pm.read(pages_4k * 8)
present = [(struct.unpack_from("<Q", raw, i * 8)[0] >> 63) & 1 for i in range(pages_4k)]
mem = open(f"/proc/{pid}/mem", "rb")


def read(addr, n):
    mem.seek(addr)
    return mem.read(n)


def in_arena(p):
    return lo <= p < hi


# Page headers live in the arena's metadata pages: look for them in every
# resident 4 KiB page, keeping what is consistent with a page header.
headers = {}
for i in range(pages_4k):
    if not present[i]:
        continue
    base = lo + i * 4096
    chunk = read(base, 4096)
    for off in range(0, 4096 - HEADER_LEN - 16, 8):
        (tid, free, used, cap, reserved, _expire, _zero, local_free, _tfree,
         bsize, start) = struct.unpack_from(HEADER, chunk, off)
        if not (8 <= bsize <= (1 << 31) and in_arena(start) and start % 16 == 0
                and 0 < reserved and used <= cap <= reserved):
            continue
        if (free and not in_arena(free)) or (local_free and not in_arena(local_free)):
            continue
        if bsize < 4096 and (start - lo) % SLICE > 4096:
            continue
        headers.setdefault(start, (base + off, bsize, used, cap, reserved, tid))

rows = []
for start, (at, bsize, used, cap, reserved, tid) in sorted(headers.items()):
    first = start & ~(SLICE - 1)
    end = start + reserved * bsize
    resident = sum(present[(first - lo) // 4096:(end - lo + 4095) // 4096]) * 4
    rows.append((start, at, bsize, used, cap, reserved, tid & ~7, resident))

print(f"{'page':>14} {'block':>7} {'used/init/reserved':>20} {'thread':>16} {'resident':>9} {'live':>7}")
for start, _, bsize, used, cap, reserved, tid, resident in rows:
    if resident:
        print(f"{start:#14x} {bsize:7} {f'{used}/{cap}/{reserved}':>20} {tid:#16x} "
              f"{resident:7}K {used * bsize // 1024:6}K")
by_thread = collections.Counter()
for r in rows:
    by_thread[r[6]] += r[7]
print("resident in pages: %d KiB of %d KiB resident in the arena" %
      (sum(r[7] for r in rows), sum(present) * 4))
for tid, kib in by_thread.most_common():
    print(f"  thread {tid:#x}: {kib} KiB")

if show_blocks:
    def chain(p):
        seen = set()
        while p and in_arena(p) and p not in seen and len(seen) < 70000:
            seen.add(p)
            p = struct.unpack("<Q", read(p, 8))[0]
        return seen

    for start, at, bsize, used, cap, reserved, tid, resident in rows:
        if bsize > 16384 or not 0 < used <= 8:
            continue
        hdr = read(at, HEADER_LEN)
        free, local_free, thread_free = (struct.unpack_from("<Q", hdr, o)[0] for o in (8, 24, 32))
        freed = chain(free) | chain(local_free) | chain(thread_free & ~3)
        for k in range(cap):
            block = start + k * bsize
            if block not in freed:
                words = struct.unpack("<8Q", read(block, 64))
                print(f"page {start:#x} block {bsize} live {block:#x}: " +
                      " ".join(f"{w:#x}" for w in words))
