#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/torch_snapshot_to_csv.py on a small synthetic snapshot (no torch here).

Pickles a snapshot dict shaped like torch.cuda.memory._snapshot()'s, converts
it and checks every line of the log, then replays the log with rmmc-replay.
Usage: test_torch_snapshot.py PATH/TO/torch_snapshot_to_csv.py PATH/TO/rmmc-replay
"""
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile

CONVERTER, REPLAY = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def entry(action, addr, size, stream=0, t=None, **extra):
    e = {"action": action, "addr": addr, "size": size, "stream": stream,
         "frames": [{"filename": "train.py", "line": 1, "name": "step"}]}
    if t is not None:
        e["time_us"] = t
    e.update(extra)
    return e


S = 0x5555AAAA0000  # a side stream
device1 = [
    entry("free_requested", 0x7F0000000000, 512, t=9),  # allocated before the trace: dropped
    entry("free_completed", 0x7F0000000000, 512, t=10),
    entry("segment_alloc", 0x7F1000000000, 20971520, t=11),
    entry("alloc", 0x7F1000000000, 1048576, t=12),
    entry("alloc", 0x7F1000100000, 4096, S, t=13),
    entry("free_requested", 0x7F1000000000, 1048576, t=14),
    entry("free_completed", 0x7F1000000000, 1048576, t=15),
    entry("alloc", 0x7F1000200000, 2097152, t=16),
    entry("oom", 0, 1 << 40, t=17, device_free=123),
    entry("free_requested", 0x7F1000100000, 4096, S, t=18),
    entry("free_completed", 0x7F1000100000, 4096, S, t=19),
    entry("snapshot", 0, 0, t=20),
    entry("segment_map", 0x7F2000000000, 2097152, t=21),
]
snapshot = {
    "segments": [{"device": 1, "address": 0x7F1000000000, "total_size": 20971520,
                  "stream": 0, "segment_type": "large", "allocated_size": 2097152,
                  "active_size": 2097152, "blocks": []}],
    "device_traces": [
        [entry("alloc", 0x7E0000000000, 512)],  # device 0: one entry, no times
        device1,
    ],
}

EXPECTED = [
    "Thread,Time,Action,Pointer,Size,Stream",
    "0,12,allocate,0x7f1000000000,1048576,0x0",
    "0,13,allocate,0x7f1000100000,4096,0x5555aaaa0000",
    "0,14,free,0x7f1000000000,1048576,0x0",
    "0,16,allocate,0x7f1000200000,2097152,0x0",
    "0,17,allocate failure,0x0,1099511627776,0x0",
    "0,18,free,0x7f1000100000,4096,0x5555aaaa0000",
]


def convert(*args):
    p = subprocess.run([sys.executable, CONVERTER, *args], capture_output=True, text=True,
                       timeout=60)
    return p.returncode, p.stdout, p.stderr


with tempfile.TemporaryDirectory() as tmp:
    snap = os.path.join(tmp, "snapshot.pickle")
    with open(snap, "wb") as f:
        pickle.dump(snapshot, f)

    # Default device: the one with the most entries (1); stdout.
    rc, out, err = convert(snap)
    check(rc == 0, "converter exit %d: %s" % (rc, err))
    check(out.splitlines() == EXPECTED, "log differs:\n%s" % out)
    check("device 1: 3 allocate, 2 free, 1 allocate failure" in err, err)
    check("1 frees of blocks allocated before the trace dropped" in err, err)
    check("6 allocator entries skipped" in err, err)
    check("1 blocks live at the end" in err, err)

    # Into a .gz file, replayed: peak live 1 MiB + 4 KiB + 2 MiB.
    log = os.path.join(tmp, "log.csv.gz")
    rc, _, err = convert(snap, "-o", log)
    check(rc == 0, "converter to .gz: %s" % err)
    with gzip.open(log, "rt") as f:
        check(f.read().splitlines() == EXPECTED, "the .gz log differs")
    out_json = os.path.join(tmp, "r.json")
    p = subprocess.run([REPLAY, log, "--stack", "host", "--stack", "sim", "--json", out_json],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 0, "rmmc-replay exit %d: %s" % (p.returncode, p.stderr))
    if p.returncode == 0:
        with open(out_json) as f:
            records = json.load(f)
        check([r["stack"] for r in records] == ["host", "sim"], str(records))
        for r in records:
            check(r["peak_live_bytes"] == 2097152 + 4096, "peak live %d" % r["peak_live_bytes"])
            check(r["events"] == 5 and r["logged_failures"] == 1 and r["failures"] == 0, str(r))
            check(r["streams"] == 2 and r["outstanding_at_end"] == 1, str(r))
            check(r["peak_reserved_bytes"] == r["peak_live_bytes"], str(r))

    # --device 0: no times, the entry index stands in; --free-on completed.
    rc, out, _ = convert(snap, "--device", "0")
    check(out.splitlines() == [EXPECTED[0], "0,0,allocate,0x7e0000000000,512,0x0"], out)
    rc, out, err = convert(snap, "--free-on", "completed")
    lines = out.splitlines()
    check("0,15,free,0x7f1000000000,1048576,0x0" in lines, out)
    check("0,14,free,0x7f1000000000,1048576,0x0" not in lines, out)
    rc, out, err = convert(snap, "--device", "5")
    check(rc == 2 and "no device 5" in err, "bad device: %d %s" % (rc, err))

    # Not a snapshot; a pickle that would run code is refused.
    bad = os.path.join(tmp, "bad.pickle")
    with open(bad, "wb") as f:
        pickle.dump({"segments": []}, f)
    rc, _, err = convert(bad)
    check(rc == 2 and "no 'device_traces'" in err, "not a snapshot: %d %s" % (rc, err))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned > %s" % os.path.join(tmp, "pwned"),))

    with open(bad, "wb") as f:
        pickle.dump({"device_traces": [[Evil()]]}, f)
    rc, _, err = convert(bad)
    check(rc == 2 and "refusing" in err, "hostile pickle: %d %s" % (rc, err))
    check(not os.path.exists(os.path.join(tmp, "pwned")), "the hostile pickle ran")

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
