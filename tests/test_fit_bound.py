#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/fit_bound.py: the fragmentation floor of best and first fit on logs
whose answer is known by hand, coalescing, the stream-side carve, gzip
input, JSON output and bad usage.

Usage: test_fit_bound.py PATH/TO/fit_bound.py
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile

TOOL = sys.argv[1]
MiB = 1 << 20
HEADER = "Thread,Time,Action,Pointer,Size,Stream\n"
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what)


def log(lines):
    return HEADER + "".join("0,%d,%s,%s,%d,%s\n" % (i, a, p, s, st)
                            for i, (a, p, s, st) in enumerate(lines))


def run(text, *args, gz=False):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "log.csv.gz" if gz else "log.csv")
        with (gzip.open(path, "wt") if gz else open(path, "w")) as f:
            f.write(text)
        out = os.path.join(d, "out.json")
        p = subprocess.run([sys.executable, TOOL, path, "--json", out, *args],
                           capture_output=True, text=True)
        res = json.load(open(out)) if p.returncode == 0 else None
        return p, {r["policy"]: r for r in res} if res else None


# A hole too small for the next request: the range grows past it (4/3).
p, r = run(log([("allocate", "0xa", MiB, "0x1"), ("allocate", "0xb", MiB, "0x1"),
                ("free", "0xa", MiB, "0x1"), ("allocate", "0xc", 2 * MiB, "0x1")]))
check(p.returncode == 0, "small hole: exit %d %s" % (p.returncode, p.stderr))
if r:
    for pol in ("best", "first"):
        check(r[pol]["peak_live_bytes"] == 3 * MiB, "%s: peak live %d" % (pol, r[pol]["peak_live_bytes"]))
        check(r[pol]["peak_top_bytes"] == 4 * MiB, "%s: peak extent %d" % (pol, r[pol]["peak_top_bytes"]))

# Frees coalesce and the top comes down: the 2 MiB block fits in place (1.0).
p, r = run(log([("allocate", "0xa", MiB, "0x1"), ("allocate", "0xb", MiB, "0x1"),
                ("free", "0xa", MiB, "0x1"), ("free", "0xb", MiB, "0x1"),
                ("allocate", "0xc", 2 * MiB, "0x1")]))
check(r is not None and r["best"]["ratio"] == 1.0 and r["first"]["ratio"] == 1.0,
      "coalescing: %s" % r)

# Best fit keeps the 3 MiB hole whole, first fit cuts it (1.0 against 1.5).
seq = [("allocate", "0x1", 3 * MiB, "0x1"), ("allocate", "0x2", MiB, "0x1"),
       ("allocate", "0x3", MiB, "0x1"), ("allocate", "0x4", MiB, "0x1"),
       ("free", "0x1", 3 * MiB, "0x1"), ("free", "0x3", MiB, "0x1"),
       ("allocate", "0x5", MiB, "0x1"), ("allocate", "0x6", 3 * MiB, "0x1")]
p, r = run(log(seq))
check(r is not None and r["best"]["peak_top_bytes"] == 6 * MiB, "best fit: %s" % r)
check(r is not None and r["first"]["peak_top_bytes"] == 9 * MiB, "first fit: %s" % r)
check(r is not None and abs(r["first"]["ratio"] - 1.5) < 1e-12, "first fit ratio: %s" % r)
check("ratio 1.0000x" in p.stdout and "ratio 1.5000x" in p.stdout, "printed: %r" % p.stdout)

# Stream side: [a2:s1 2MiB][hole 3MiB][b:s2 1MiB]; s2 asks 1 MiB: best fit
# carves it at the top of the hole, beside b, so when s1 frees a2 the 4 MiB
# below join and s1's 4 MiB request fits without growing (carved at the
# bottom it would leave 2 + 2 MiB apart and the range would grow to 10 MiB).
seq = [("allocate", "0xa", 2 * MiB, "0x1"), ("allocate", "0xh", 3 * MiB, "0x1"),
       ("allocate", "0xb", MiB, "0x2"), ("free", "0xa", 2 * MiB, "0x1"),
       ("allocate", "0xa2", 2 * MiB, "0x1"), ("free", "0xh", 3 * MiB, "0x1"),
       ("allocate", "0xc", MiB, "0x2"), ("free", "0xa2", 2 * MiB, "0x1"),
       ("allocate", "0xe", 4 * MiB, "0x1")]
p, r = run(log(seq), "--policy", "best")
check(r is not None and list(r) == ["best"], "--policy best: %s" % r)
check(r is not None and r["best"]["peak_top_bytes"] == 6 * MiB, "stream side: %s" % r)
p, r = run(log(seq), "--policy", "first")
check(r is not None and r["first"]["peak_top_bytes"] == 10 * MiB, "first fit, no side: %s" % r)

# gzip input; "allocate failure" lines and frees of unknown pointers place nothing.
p, r = run(log([("allocate", "0xa", 1000, "0x1"), ("allocate failure", "0x0", 99 * MiB, "0x1"),
                ("free", "0xzz", 5, "0x1")]), "--granule", "512", gz=True)
check(r is not None and r["best"]["peak_live_bytes"] == 1024, "gzip, granule: %s" % r)

# Bad usage: exit 2 with a message.
p, _ = run("Thread,Time,Size\n0,1,5\n")
check(p.returncode == 2 and "header" in p.stderr, "bad header: %d %r" % (p.returncode, p.stderr))
p, _ = run(HEADER + "0,1,allocate,0x1\n")
check(p.returncode == 2 and "columns" in p.stderr, "short line: %d %r" % (p.returncode, p.stderr))
p, _ = run(log([]), "--granule", "0")
check(p.returncode == 2, "granule 0: %d" % p.returncode)

print("fit_bound: %d failure(s)" % failures)
sys.exit(1 if failures else 0)
