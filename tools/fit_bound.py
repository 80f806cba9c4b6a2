#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What placement alone can reach on an allocation log: the fragmentation floor.

Replays an allocation log (RMM's CSV: Thread,Time,Action,Pointer,Size,Stream;
plain or gzip) on an idealised allocator that never maps, unmaps or moves
memory: one address range growing at its top, every free reusable at once by
any stream, exact sizes (rounded to --granule), coalescing with both
neighbours, free space at the top given back at once. For each placement
policy it reports the highest top reached over the peak live bytes:

  best   the smallest free block that fits (lowest address on a tie); the
         carve goes to the side where the block's upper neighbour was
         allocated by the same stream, else to the bottom
  first  the lowest-addressed free block that fits

Best fit and address-ordered first fit are the policies known to fragment
least on real programs (Johnstone and Wilson, "The memory fragmentation
problem: solved?", ISMM 1998). A pool that keeps its memory where it put it
(chunks, or pages it never unmaps in a steady state) cannot expect a lower
ratio than these on the same log; getting below them takes giving pages
back inside holes and mapping them again elsewhere (driver calls), as the
expandable pool's trimming does. Not a proof of optimality: an allocator
that knew the future could place better.

    python3 tools/fit_bound.py bench/traces/torch_server.csv.gz
    python3 tools/fit_bound.py --policy best --json out.json LOG

Exit status: 0, 2 for bad usage or a log that cannot be read.
"""
import argparse
import bisect
import gzip
import json
import sys


def read_log(path):
    """(action, pointer, size, stream) per line; action 'a' or 'f'."""
    opener = gzip.open if path.endswith(".gz") else open
    events = []
    with opener(path, "rt") as f:
        header = f.readline().strip().split(",")
        try:
            ia, ip, isz, ist = (header.index(k) for k in ("Action", "Pointer", "Size", "Stream"))
        except ValueError:
            raise ValueError("%s: the header lacks Action, Pointer, Size or Stream" % path)
        for n, line in enumerate(f, 2):
            p = line.rstrip("\n").split(",")
            if len(p) <= max(ia, ip, isz, ist):
                raise ValueError("%s:%d: too few columns" % (path, n))
            act = p[ia].strip()
            if act == "allocate":
                events.append(("a", p[ip].strip(), int(p[isz]), p[ist].strip()))
            elif act == "free":
                events.append(("f", p[ip].strip(), int(p[isz]), p[ist].strip()))
            # "allocate failure" and anything else place nothing
    return events


class Space:
    """One growing address range with coalescing free blocks."""

    def __init__(self):
        self.by_addr = []  # sorted start addresses of free blocks
        self.size_of = {}  # start -> size
        self.by_size = []  # sorted (size, start)
        self.top = 0
        self.end_owner = {}  # end address of a used block -> its stream
        self.start_owner = {}  # start address of a used block -> its stream

    def _add(self, a, s):
        bisect.insort(self.by_addr, a)
        self.size_of[a] = s
        bisect.insort(self.by_size, (s, a))

    def _remove(self, a):
        s = self.size_of.pop(a)
        del self.by_addr[bisect.bisect_left(self.by_addr, a)]
        del self.by_size[bisect.bisect_left(self.by_size, (s, a))]
        return s

    def free(self, a, s):
        i = bisect.bisect_left(self.by_addr, a)
        if i > 0:
            pa = self.by_addr[i - 1]
            if pa + self.size_of[pa] == a:
                s += self._remove(pa)
                a = pa
        if a + s in self.size_of:
            s += self._remove(a + s)
        if a + s == self.top:
            self.top = a
        else:
            self._add(a, s)

    def place(self, s, stream, policy):
        if policy == "best":
            i = bisect.bisect_left(self.by_size, (s, -1))
            found = self.by_size[i][1] if i < len(self.by_size) else None
        else:
            found = next((a for a in self.by_addr if self.size_of[a] >= s), None)
        if found is None:
            a = self.top
            self.top += s
            return a
        fs = self._remove(found)
        high = (policy == "best" and self.start_owner.get(found + fs) == stream and
                self.end_owner.get(found) != stream)
        a = found + fs - s if high else found
        if fs > s:
            self._add(found if high else found + s, fs - s)
        return a


def bound(events, policy, granule):
    sp = Space()
    live = peak_live = peak_top = 0
    blocks = {}
    for act, ptr, size, stream in events:
        s = -(-size // granule) * granule
        if act == "a":
            if s == 0 or ptr in blocks:
                continue
            a = sp.place(s, stream, policy)
            blocks[ptr] = (a, s)
            sp.start_owner[a] = stream
            sp.end_owner[a + s] = stream
            live += s
            peak_live = max(peak_live, live)
            peak_top = max(peak_top, sp.top)
        elif ptr in blocks:
            a, s = blocks.pop(ptr)
            del sp.start_owner[a]
            del sp.end_owner[a + s]
            live -= s
            sp.free(a, s)
    return {"policy": policy, "peak_live_bytes": peak_live, "peak_top_bytes": peak_top,
            "ratio": peak_top / peak_live if peak_live else 1.0}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log")
    ap.add_argument("--policy", choices=["best", "first", "both"], default="both")
    ap.add_argument("--granule", type=int, default=256,
                    help="sizes round up to this many bytes (default 256, the pool's)")
    ap.add_argument("--json", help="write the results as a JSON array here")
    args = ap.parse_args(argv)
    if args.granule <= 0:
        ap.error("--granule must be positive")
    try:
        events = read_log(args.log)
    except (OSError, ValueError, EOFError) as e:
        print("fit_bound: %s" % e, file=sys.stderr)
        return 2
    policies = ["best", "first"] if args.policy == "both" else [args.policy]
    results = []
    for pol in policies:
        r = bound(events, pol, args.granule)
        r["log"] = args.log
        results.append(r)
        print("%-6s peak live %10.2f MiB  peak extent %10.2f MiB  ratio %.4fx" %
              (pol, r["peak_live_bytes"] / 2**20, r["peak_top_bytes"] / 2**20, r["ratio"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
