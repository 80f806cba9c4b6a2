#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""rmmc-replay's command line: JSON records, the SVG chart, default stacks,
bad logs (line numbers, --lenient counts), gzip input, multi-threaded logs,
the logs tools/gen_trace.py makes, and the exit codes.

Host stacks only (host, sim), small logs: a few seconds in all.
Usage: test_replay_cli.py PATH/TO/rmmc-replay PATH/TO/gen_trace.py
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

REPLAY, GEN = sys.argv[1], sys.argv[2]
SVG = "{http://www.w3.org/2000/svg}"
FIELDS = {
    "stack": str, "log": str, "upstream": str, "upstream_kind": str, "simulated": bool,
    "real_streams": bool, "threads": int, "logged_threads": int, "streams": int,
    "events": int, "calls": int, "failures": int, "free_errors": int, "skipped_frees": int,
    "logged_failures": int, "peak_live_bytes": int, "peak_reserved_bytes": int,
    "end_reserved_bytes": int, "ratio": float, "live_at_end_bytes": int,
    "outstanding_at_end": int, "ns_per_call": float, "total_call_ns": int,
    "null_events": int, "skipped_total": int, "skipped": dict,
    "own_ns_per_call": float, "upstream_calls": int, "upstream_ns": int, "repeats": int,
    "ns_per_call_min": float, "warm": bool,
}
ISSUES = ["malformed", "missing_columns", "bad_size", "unknown_pointer",
          "duplicate_pointer", "size_mismatch"]
SMALL = ("Thread,Time,Action,Pointer,Size,Stream\n"
         "0,100,allocate,0x1000,1000,0x0\n"
         "0,101,allocate,0x2000,3000,0x0\n"
         "0,102,free,0x1000,1000,0x0\n"
         "0,103,allocate,0x3000,500,0x0\n"
         "0,104,allocate failure,0x0,99999,0x0\n"
         "0,105,free,0x2000,3000,0x0\n"
         "0,106,allocate,0x1000,200,0x0\n")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args, timeout=120):
    try:
        p = subprocess.run([REPLAY, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "", "timed out after %d s" % timeout
    return p.returncode, p.stdout, p.stderr


def records(path):
    with open(path) as f:
        return json.load(f)


def write(path, text):
    with open(path, "w") as f:
        f.write(text)
    return path


with tempfile.TemporaryDirectory() as tmp:
    j, s = os.path.join(tmp, "r.json"), os.path.join(tmp, "r.svg")
    small = write(os.path.join(tmp, "small.csv"), SMALL)

    # Exact figures, every field, on host and sim.
    rc, out, err = run(small, "--stack", "host", "--stack", "sim", "--json", j, "--svg", s)
    check(rc == 0, "small log: exit %d: %s" % (rc, err))
    check("peak reserved" in out and "1.000x" in out, "table:\n" + out)
    check("sim: simulated upstream: the pointers have no memory behind them" in out, out)
    recs = records(j)
    check([r["stack"] for r in recs] == ["host", "sim"], str(recs))
    for r in recs:
        check(r["schema_version"] == 1, "schema_version 1: %s" % r)
        for k, t in FIELDS.items():
            check(k in r and isinstance(r[k], t), "field %s in %s" % (k, r))
        check(sorted(r["skipped"]) == sorted(ISSUES) and not any(r["skipped"].values()), str(r))
        check(r["events"] == 6 and r["calls"] == 6 and r["failures"] == 0, str(r))
        check(r["peak_live_bytes"] == 4000 and r["peak_reserved_bytes"] == 4000, str(r))
        check(r["ratio"] == 1.0 and r["logged_failures"] == 1 and r["threads"] == 1, str(r))
        check(r["live_at_end_bytes"] == 700 and r["outstanding_at_end"] == 2, str(r))
        check(r["upstream_kind"] == "host" and r["real_streams"] is False, str(r))
    check(recs[0]["upstream"] == "host" and recs[0]["simulated"] is False, str(recs[0]))
    check(recs[1]["upstream"] == "sim" and recs[1]["simulated"] is True, str(recs[1]))
    check(recs[1].get("upstream_reported_peak_bytes") == 4096, str(recs[1]))

    # The SVG parses as XML and holds exactly one path per line: one reserved
    # line per stack, in order, then live, drawn last so it stays visible.
    root = ET.parse(s).getroot()
    check(root.tag == SVG + "svg", root.tag)
    paths = list(root.iter(SVG + "path"))
    check(len(paths) == 3, "%d paths" % len(paths))
    check([p.get("data-series") for p in paths] == ["reserved", "reserved", "live"],
          str([p.attrib for p in paths]))
    check([p.get("data-stack") for p in paths[:2]] == ["host", "sim"], str(paths))
    for p in paths:
        d = p.get("d", "")
        check(d.startswith("M") and d.count("L") == 6, "path d: " + d)  # 6 events + the end
    texts = ["".join(t.itertext()) for t in root.iter(SVG + "text")]
    check("event index" in texts and "bytes" in texts, "axis titles: %s" % texts)
    check(any(t == "4 KiB" for t in texts), "y tick labels: %s" % texts)
    check(any("reserved by sim" in t for t in texts), "legend: %s" % texts)
    check(root.find(SVG + "title") is not None, "no title")

    # Failures on a small simulated device are results, not errors.
    rc, out, err = run(small, "--stack", "sim(capacity=3KiB)", "--json", j, "-q")
    check(rc == 0 and out == "", "capacity: exit %d, out %r" % (rc, out))
    r = records(j)[0]
    check(r["failures"] == 1 and r["skipped_frees"] == 1 and r["peak_reserved_bytes"] == 1000, str(r))
    check("event 1: out of memory" in r.get("first_failure", ""), str(r))

    # Default stacks: the plain base first (host without a GPU), or --upstream's.
    rc, out, err = run(small, "--json", j)
    check(rc == 0, "defaults: %d %s" % (rc, err))
    recs = records(j)
    gpu = "GPU present" in out
    check(recs[0]["stack"] == ("cuda" if gpu else "host"), str(recs))
    check(gpu or "no GPU: replaying over host memory" in out, out)
    rc, out, err = run(small, "--upstream", "sim", "--json", j)
    check(rc == 0 and records(j)[0]["stack"] == "sim", "upstream sim: %s" % err)

    # A log that does not fit the machine (1 TiB live) replays over sim by
    # default, and says so; nothing is touched, so it runs here.
    huge = write(os.path.join(tmp, "huge.csv"),
                 "Thread,Time,Action,Pointer,Size,Stream\n"
                 "0,1,allocate,0x100000,1099511627776,0x0\n"
                 "0,2,allocate,0x20000000000000,4096,0x0\n"
                 "0,3,free,0x100000,1099511627776,0x0\n")
    rc, out, err = run(huge, "--json", j)
    recs = records(j) if rc == 0 else [{}]
    check(rc == 0 and recs[0].get("stack") == "sim" and recs[0].get("simulated") is True
          and recs[0].get("peak_reserved_bytes") == 1099511627776 + 4096, "huge: %d %s %s" % (rc, err, recs))
    check("replaying over a simulated upstream (sim: address ranges, no memory)" in out, out)
    check(gpu or "exceeds half the host's memory" in out, out)

    # gzip input reads the same.
    gz = os.path.join(tmp, "small.csv.gz")
    with gzip.open(gz, "wt") as f:
        f.write(SMALL)
    rc, out, err = run(gz, "--stack", "host", "--json", j)
    check(rc == 0 and records(j)[0]["peak_live_bytes"] == 4000, "gz: %d %s" % (rc, err))

    # Bad logs: the line number, then --lenient counts.
    bad = write(os.path.join(tmp, "bad.csv"),
                SMALL.replace("0,102,free,0x1000", "0,102,frees,0x1000")
                + "0,107,free,0x9999,8,0x0\n0,108,allocate,0x3000,5,0x0\n0,109,allocate,0x10,1e3,0x0\n")
    rc, out, err = run(bad, "--stack", "host")
    check(rc == 2 and "bad.csv:4: malformed line: unknown action 'frees'" in err, "strict: %d %s" % (rc, err))
    check("--lenient" in err, err)
    rc, out, err = run(bad, "--stack", "host", "--lenient", "--json", j)
    check(rc == 0, "lenient: %d %s" % (rc, err))
    r = records(j)[0]
    check(r["skipped"] == {"malformed": 1, "missing_columns": 0, "bad_size": 1,
                           "unknown_pointer": 1, "duplicate_pointer": 2, "size_mismatch": 0},
          str(r["skipped"]))
    check(r["skipped_total"] == 5, str(r))
    check("bad.csv:4: skipped (malformed line)" in err and "bad.csv:9: skipped (free of an unknown pointer)" in err, err)
    check("skipped 2 lines: allocation of a pointer that is already live" in out, out)
    check("skipped 1 line: free of an unknown pointer" in out, out)
    nosize = write(os.path.join(tmp, "nosize.csv"), "Thread,Time,Action,Pointer,Stream\n")
    rc, out, err = run(nosize, "--lenient")
    check(rc == 2 and "nosize.csv:1: missing columns: the header has no 'Size' column" in err, err)

    # A multi-threaded log: one replay thread per logged thread; same figures.
    mt = os.path.join(tmp, "mt.csv")
    subprocess.run([sys.executable, GEN, "random", "--events", "4000", "--threads", "3",
                    "--streams", "2", "--live", "50", "-o", mt], check=True, timeout=120)
    rc, out, err = run(mt, "--stack", "sim", "--json", j)
    check(rc == 0, "mt: %d %s" % (rc, err))
    a = records(j)[0]
    check(a["threads"] == 3 and a["logged_threads"] == 3 and a["streams"] == 2, str(a))
    rc, out, err = run(mt, "--stack", "sim", "--json", j, "--single-thread")
    b = records(j)[0]
    check(b["threads"] == 1, str(b))
    for k in ("events", "calls", "peak_live_bytes", "peak_reserved_bytes", "upstream_reported_peak_bytes"):
        check(a[k] == b[k], "%s: %s threaded, %s single" % (k, a[k], b[k]))
    check(a["peak_reserved_bytes"] == a["peak_live_bytes"], str(a))

    # --repeat, --warm and --status: medians of fresh replays, a timed second
    # epoch that needs the upstream less, every layer's figures.
    tf = os.path.join(tmp, "tf.csv")
    subprocess.run([sys.executable, GEN, "transformer", "--events", "6000", "-o", tf],
                   check=True, timeout=120)
    rc, out, err = run(tf, "--stack", "pool(expandable=true) > sim", "--json", j)
    cold = records(j)[0] if rc == 0 else {}
    rc, out, err = run(tf, "--stack", "pool(expandable=true) > sim", "--repeat", "3", "--warm",
                       "--status", "--json", j)
    check(rc == 0, "warm: %d %s" % (rc, err))
    warm = records(j)[0] if rc == 0 else {}
    check(cold.get("repeats") == 1 and not cold.get("warm") and warm.get("repeats") == 3
          and warm.get("warm"), "repeat/warm flags: %s %s" % (cold, warm))
    check(cold.get("upstream_calls", 0) > 0 and warm.get("upstream_calls", 1) < cold["upstream_calls"],
          "a warm replay maps less: %s vs %s" % (warm.get("upstream_calls"), cold.get("upstream_calls")))
    check(warm.get("ns_per_call_min", 1) <= warm.get("ns_per_call", 0)
          and 0 <= warm.get("own_ns_per_call", -1) <= warm.get("ns_per_call", 0) + 1e-6,
          "time figures: %s" % warm)
    check(warm.get("peak_reserved_bytes", 0) >= cold.get("peak_reserved_bytes", 1)
          and warm.get("events") == cold.get("events"), "warm figures: %s" % warm)
    check("after the last event of pool(expandable=true) > sim" in out and "page_maps" in out
          and "# warm:" in out, "status report: " + out[-600:])
    rc, out, err = run(tf, "--stack", "sim", "--repeat", "0")
    check(rc == 2 and "--repeat" in err, "--repeat 0: %d %s" % (rc, err))

    # Every shape gen_trace.py makes replays cleanly, in both time formats.
    for shape, fmt in (("batches", "us"), ("transformer", "rmm"), ("random", "rmm")):
        path = os.path.join(tmp, "%s.csv.gz" % shape)
        subprocess.run([sys.executable, GEN, shape, "--events", "3000", "--time-format", fmt,
                        "-o", path], check=True, timeout=120)
        rc, out, err = run(path, "--stack", "sim", "--json", j)
        r = records(j)[0] if rc == 0 else {}
        check(rc == 0 and r["failures"] == 0 and r["skipped_total"] == 0 and r["events"] >= 3000
              and r["outstanding_at_end"] == 0, "%s: %d %s %s" % (shape, rc, err, r))

    # Sizes the replay cannot represent (issue 11, F6): refused with their
    # line, at once (the SVG axis once looped forever on a 2^63 + 1 byte
    # allocation); --lenient skips the line and its free.
    big = write(os.path.join(tmp, "big.csv"),
                "Thread,Time,Action,Pointer,Size,Stream\n"
                "0,1,allocate,0x1000,9223372036854775809,0x0\n"
                "0,2,allocate,0x2000,4096,0x0\n"
                "0,3,free,0x1000,9223372036854775809,0x0\n"
                "0,4,free,0x2000,4096,0x0\n")
    rc, out, err = run(big, "--stack", "sim", "--svg", s, timeout=30)
    check(rc == 2 and "big.csv:2: bad size: 9223372036854775809 bytes is more than the replay can "
          "represent" in err, "huge size: %d %s" % (rc, err))
    rc, out, err = run(big, "--stack", "sim", "--svg", s, "--json", j, "--lenient", timeout=30)
    r = records(j)[0] if rc == 0 else {}
    check(rc == 0 and r.get("skipped", {}).get("bad_size") == 1
          and r["skipped"]["unknown_pointer"] == 1 and r["peak_live_bytes"] == 4096,
          "huge size, lenient: %d %s %s" % (rc, err, r))
    # Live bytes past 2^62 in total: the line that goes past is named.
    wrap = write(os.path.join(tmp, "wrap.csv"),
                 "Thread,Time,Action,Pointer,Size,Stream\n"
                 "0,1,allocate,0x1000,4611686018427387904,0x0\n"
                 "0,2,allocate,0x2000,4611686018427387904,0x0\n")
    rc, out, err = run(wrap, "--stack", "sim", "--svg", s, timeout=30)
    check(rc == 2 and "wrap.csv:3: bad size" in err and "live bytes past" in err,
          "live past 2^62: %d %s" % (rc, err))
    # Exactly 2^62 live replays over sim, and the chart's top tick says 4 EiB.
    edge = write(os.path.join(tmp, "edge.csv"),
                 "Thread,Time,Action,Pointer,Size,Stream\n"
                 "0,1,allocate,0x1000,4611686018427387904,0x0\n"
                 "0,2,free,0x1000,4611686018427387904,0x0\n")
    rc, out, err = run(edge, "--stack", "sim", "--svg", s, "--json", j, timeout=30)
    texts = ["".join(t.itertext()) for t in ET.parse(s).getroot().iter(SVG + "text")] if rc == 0 else []
    check(rc == 0 and records(j)[0]["peak_reserved_bytes"] == 4611686018427387904
          and "4 EiB" in texts, "2^62 live: %d %s %s" % (rc, err, texts))

    # Usage errors and stacks that cannot be built.
    rc, out, err = run(small, "--stack", "pool >")
    check(rc == 2 and "--stack" in err and "^" in err, "bad spec: %d %s" % (rc, err))
    rc, out, err = run(os.path.join(tmp, "missing.csv"))
    check(rc == 2 and "missing.csv: cannot open" in err, "missing file: %d %s" % (rc, err))
    rc, out, err = run()
    check(rc == 2 and "no log given" in err, "no args: %d %s" % (rc, err))
    rc, out, err = run(small, small)
    check(rc == 2 and "one log only" in err, "two logs: %d %s" % (rc, err))
    rc, out, err = run("--list")
    check(rc == 0 and "sim" in out and "capacity" in out, "--list: " + out)
    rc, out, err = run("--help")
    check(rc == 0 and "--stack SPEC" in out, "--help")
    if not gpu:
        rc, out, err = run(small, "--stack", "cuda", "--stack", "host", "--json", j)
        recs = records(j)
        check(rc == 1 and "no CUDA device" in recs[0].get("error", "") and "error" not in recs[1],
              "cuda without a GPU: %d %s" % (rc, recs))
    rc, out, err = run(small, "--stack", "host", "--json", os.path.join(tmp, "no", "dir.json"))
    check(rc == 2 and "cannot write" in err, "unwritable JSON: %d %s" % (rc, err))

    # Progress on stderr: asked for, a line at the end of the read and one
    # per stack; by default (stderr is no terminal here) and with -q, none.
    rc, out, err = run(small, "--stack", "host", "--stack", "sim", "--progress")
    check(rc == 0 and "rmmc-replay: reading %s: 0.0 MiB, 6 events, done\n" % small in err
          and "rmmc-replay: replaying [1/2] host: 6 events, 1 time(s)\n" in err
          and "rmmc-replay: replaying [2/2] sim: 6 events" in err, "--progress: " + err)
    check("replaying" not in out, "progress goes to stderr: " + out)
    for args in ((), ("--progress", "-q"), ("--no-progress",)):
        rc, out, err = run(small, "--stack", "host", *args)
        check(rc == 0 and "rmmc-replay: read" not in err and "replaying" not in err,
              "no progress with %s: %s" % (args, err))

print("%d failure(s)" % len(failures))
sys.exit(1 if failures else 0)
