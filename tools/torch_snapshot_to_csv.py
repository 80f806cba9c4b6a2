#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Convert a PyTorch CUDA memory snapshot into an allocation log for rmmc-replay.

Usage:
    torch_snapshot_to_csv.py SNAPSHOT [-o OUT] [--device N] [--free-on requested|completed]

Record the snapshot in the program you want to replay:

    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    ...  # the workload
    torch.cuda.memory._dump_snapshot("snapshot.pickle")

then convert and replay it:

    torch_snapshot_to_csv.py snapshot.pickle -o workload.csv.gz
    rmmc-replay workload.csv.gz --svg workload.svg

SNAPSHOT is the pickled dict torch.cuda.memory._snapshot() returns. Its
"device_traces" holds one list of trace entries per device, each a dict with
"action", "addr", "size", "stream" and (PyTorch 2.1 and later) "time_us".
The converter writes RMM's CSV (Thread,Time,Action,Pointer,Size,Stream):

    alloc            -> allocate
    free_requested   -> free (the program let go of the block; with
                        --free-on completed, free_completed is used instead:
                        the moment the caching allocator could reuse it)
    oom              -> allocate failure (size as requested, pointer 0x0)
    free_completed, segment_alloc, segment_free, segment_map,
    segment_unmap, snapshot -> skipped (counted): they are the caching
                        allocator's own traffic, which the replay recreates

Thread is 0 (snapshots do not record threads); Time is time_us, or the entry
index when the snapshot has no times; Pointer and Stream are hex. --device
picks the device (default: the one with the most entries). The trace is a
ring buffer: frees of blocks allocated before it begins are dropped (and
counted), so the log is consistent. OUT ending in .gz is compressed; "-" (the
default) is stdout. A summary goes to stderr.

The snapshot is read with an unpickler that accepts only plain data (dicts,
lists, strings, numbers): a file that asks for anything else is refused, so a
hostile file cannot run code.
"""

import argparse
import gzip
import io
import pickle
import sys

SKIPPED = {"free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "snapshot"}


class PlainUnpickler(pickle.Unpickler):
    """Unpickles plain data only: no classes, no functions."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            "refusing %s.%s: a memory snapshot holds only plain data" % (module, name))


def load_snapshot(path):
    with open(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    snapshot = PlainUnpickler(io.BytesIO(data)).load()
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError("not a PyTorch memory snapshot: no 'device_traces' "
                         "(record it with torch.cuda.memory._record_memory_history())")
    traces = snapshot["device_traces"]
    if not isinstance(traces, list) or not all(isinstance(t, list) for t in traces):
        raise ValueError("'device_traces' is not a list of per-device lists")
    return traces


def convert(traces, out, device=None, free_on="requested"):
    """Writes the log of one device to out; returns the counts."""
    if device is None:
        device = max(range(len(traces)), key=lambda d: len(traces[d])) if traces else 0
    if not 0 <= device < len(traces):
        raise ValueError("no device %d in the snapshot (it has %d)" % (device, len(traces)))
    free_action = "free_" + free_on
    counts = {"device": device, "allocate": 0, "free": 0, "allocate failure": 0,
              "skipped": 0, "dropped_frees": 0, "dropped_allocs": 0, "unknown": 0}
    live = {}
    out.write("Thread,Time,Action,Pointer,Size,Stream\n")
    for index, e in enumerate(traces[device]):
        action = e.get("action")
        time_us = e.get("time_us", index)
        stream = e.get("stream", 0) or 0
        size = e.get("size", 0) or 0
        addr = e.get("addr", 0) or 0
        if action == "alloc":
            if addr in live:  # never freed in the trace: keep the first
                counts["dropped_allocs"] += 1
                continue
            live[addr] = size
            what = "allocate"
        elif action == free_action:
            if addr not in live:  # allocated before the trace began
                counts["dropped_frees"] += 1
                continue
            size = live.pop(addr)
            what = "free"
        elif action == "oom":
            addr = 0
            what = "allocate failure"
        elif action in SKIPPED or action == "free_requested":
            counts["skipped"] += 1
            continue
        else:
            counts["unknown"] += 1
            continue
        counts[what] += 1
        out.write("0,%d,%s,0x%x,%d,0x%x\n" % (time_us, what, addr, size, stream))
    counts["live_at_end"] = len(live)
    return counts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("snapshot")
    p.add_argument("-o", "--output", default="-")
    p.add_argument("--device", type=int, default=None)
    p.add_argument("--free-on", choices=["requested", "completed"], default="requested")
    args = p.parse_args(argv)
    try:
        traces = load_snapshot(args.snapshot)
    except (OSError, ValueError, pickle.UnpicklingError, EOFError) as exc:
        print("torch_snapshot_to_csv: %s: %s" % (args.snapshot, exc), file=sys.stderr)
        return 2
    if args.output == "-":
        out = sys.stdout
    elif args.output.endswith(".gz"):
        out = gzip.open(args.output, "wt")
    else:
        out = open(args.output, "w")
    try:
        counts = convert(traces, out, args.device, args.free_on)
    except ValueError as exc:
        print("torch_snapshot_to_csv: %s" % exc, file=sys.stderr)
        return 2
    finally:
        if out is not sys.stdout:
            out.close()
    print("torch_snapshot_to_csv: device %d: %d allocate, %d free, %d allocate failure; "
          "%d allocator entries skipped, %d frees of blocks allocated before the trace "
          "dropped, %d repeated allocations dropped, %d unknown entries; %d blocks live "
          "at the end" % (counts["device"], counts["allocate"], counts["free"],
                          counts["allocate failure"], counts["skipped"],
                          counts["dropped_frees"], counts["dropped_allocs"],
                          counts["unknown"], counts["live_at_end"]),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
