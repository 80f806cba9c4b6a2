#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Merges the replay-*.json files rmmc-replay wrote under a directory into
one replay.json there (removing them, so that few files come back from the
GPU machine) and prints one row per log and stack: peak reserved / peak
live, mean ns per call, and calls into the base during the timed epoch.

    tools/replay_table.py DIR
"""
import glob
import json
import os
import sys


def main():
    out = sys.argv[1]
    recs = []
    for path in sorted(glob.glob(os.path.join(out, "replay-*.json"))):
        try:
            recs += json.load(open(path))
        except ValueError as e:
            print(f"replay_table: {path} is not complete JSON ({e}); left out")
        os.remove(path)
    with open(os.path.join(out, "replay.json"), "w") as f:
        json.dump(recs, f, indent=1)
    print("%-28s %-36s %8s %9s %9s" % ("log", "stack", "ratio", "ns/call", "upstream"))
    for r in recs:
        if "error" in r:
            print("%-28s %-36s  %s" % (os.path.basename(r.get("log", ""))[:28], r.get("stack", ""), r["error"]))
            continue
        print("%-28s %-36s %8.4f %9.1f %9s" % (os.path.basename(r.get("log", ""))[:28],
                                              r.get("stack", "")[:36], r.get("ratio", 0),
                                              r.get("ns_per_call", 0), r.get("upstream_calls", "-")))


if __name__ == "__main__":
    main()
