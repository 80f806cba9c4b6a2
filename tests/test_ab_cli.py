#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""rmmc-ab's command line (bench/ab.c): the result, the JSON object, the
error messages and exit codes, on host stacks with tiny bursts.

Usage: test_ab_cli.py PATH/TO/rmmc-ab PATH/TO/librmmc.so
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

AB, LIB = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args):
    env = dict(os.environ)
    env["CUDA_VISIBLE_DEVICES"] = ""  # host stacks, as on a machine without a GPU
    p = subprocess.run([AB, *args], capture_output=True, text=True, timeout=120, env=env)
    return p.returncode, p.stdout, p.stderr


QUICK = ("--bursts", "12", "--ops", "400")


def write_log(folder, name, lines):
    """An RMM CSV log of `lines` (after the header) in folder/name."""
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        f.write("Thread,Time,Action,Pointer,Size,Stream\n" + "".join(l + "\n" for l in lines))
    return path


def load(path):
    """The JSON object rmmc-ab wrote, or {} (the checks then fail)."""
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return {}


with tempfile.TemporaryDirectory() as tmp:
    copy = os.path.join(tmp, "librmmc-copy.so")
    shutil.copyfile(LIB, copy)
    out = os.path.join(tmp, "ab.json")

    # A library and its copy at another path: two libraries, two stacks.
    rc, so, se = run(*QUICK, "--json", out, "--placement", "3", LIB, copy)
    check(rc == 0, "A/A' pair: exit 0 (got %d: %s)" % (rc, se.strip()))
    addrs = re.findall(r"rmmc_resource_allocate at (0x[0-9a-f]+)", so)
    check(len(addrs) == 2 and addrs[0] != addrs[1],
          "a copy at another path loads as a second library (%s)" % addrs)
    check("on 'pool > host'" in so, "without a GPU the default stack is pool > host: " + so)
    try:
        rec = json.load(open(out))
    except (OSError, ValueError) as e:
        rec = {}
        check(False, "--json wrote one JSON object (%s)" % e)
    if rec:
        check(rec["case"] == "pair 256 t1" and rec["stack"] == "pool > host",
              "JSON names the case and stack: %s" % rec)
        check(rec["bursts"] == 12 and rec["ops"] == 400 and rec["placement"] == 3,
              "JSON gives bursts, ops and placement: %s" % rec)
        check(rec["a"] == LIB and rec["b"] == copy, "JSON names both libraries")
        check(rec["a_ns_per_call"] > 0 and rec["b_ns_per_call"] > 0, "both sides timed")
        lo, hi = rec["interval95"]
        check(lo <= rec["median_ratio"] <= hi, "the interval holds the median ratio: %s" % rec)
        check(0 <= rec["b_faster_bursts"] <= 12, "b_faster_bursts counts bursts")

    # The same path twice is one handle: an A/A run of the method itself.
    rc, so, se = run(*QUICK, LIB, LIB)
    addrs = re.findall(r"rmmc_resource_allocate at (0x[0-9a-f]+)", so)
    check(rc == 0 and len(addrs) == 2 and addrs[0] == addrs[1],
          "one library given twice: one handle (rc %d, %s)" % (rc, addrs))

    # The random case on two threads, each with its own key, odd seed: B first.
    rc, so, se = run(*QUICK, "--pattern", "random", "--min", "256", "--max", "65536",
                     "--live", "50", "--threads", "2", "--placement", "5", LIB, copy)
    check(rc == 0 and "random 256-65536 live 50 t2" in so,
          "random on 2 threads: exit 0 (%d: %s)" % (rc, se.strip()))

    # A stack that runs out: the failing call is named, exit 1.
    rc, so, se = run(*QUICK, "--stack", "limiting(limit=1MiB) > pool > host", "--pattern",
                     "random", "--min", "262144", "--max", "262144", "--live", "8", LIB, copy)
    check(rc == 1 and "allocate(262144 bytes) failed with ERROR_OUT_OF_MEMORY" in se,
          "a capped stack fails with the out-of-memory status (%d: %s)" % (rc, se.strip()))

    # Libraries that are not there, or not rmmc.
    rc, so, se = run(*QUICK, os.path.join(tmp, "missing.so"), LIB)
    check(rc == 1 and "cannot load" in se and "missing.so" in se,
          "a missing library: exit 1 naming it (%d: %s)" % (rc, se.strip()))
    libm = next((p for p in ("/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib64/libm.so.6",
                             "/lib64/libm.so.6") if os.path.exists(p)), None)
    if libm:
        rc, so, se = run(*QUICK, LIB, libm)
        check(rc == 1 and "has no rmmc_stack_create" in se,
              "a library that is not rmmc: exit 1 (%d: %s)" % (rc, se.strip()))

    # A spec that does not parse: the library's own message.
    rc, so, se = run(*QUICK, "--stack", "pool > nosuch", LIB, copy)
    check(rc == 1 and "'pool > nosuch' failed with ERROR_PARSE" in se,
          "a bad spec: exit 1 with the parse status (%d: %s)" % (rc, se.strip()))

    # --log: a pass of an RMM CSV log per burst. Three streams; a free the
    # log never allocated and an "allocate failure" are skipped; one block
    # stays live at the end (freed between passes, untimed).
    log = write_log(tmp, "tiny.csv", ["0,1,allocate,0x1000,256,0x0",
                                      "0,2,allocate,0x2000,4096,0x7f01",
                                      "0,3,free,0x1000,256,0x0",
                                      "0,4,allocate,0x1000,1048576,0x7f02",
                                      "0,5,free,0x9000,64,0x0",
                                      "0,6,allocate failure,0x0,99999999999,0x0",
                                      "0,7,free,0x2000,4096,0x7f01"])
    rc, so, se = run(*QUICK, "--log", log, "--json", out, LIB, copy)
    check(rc == 0 and "replay tiny.csv" in so, "--log: exit 0 (%d: %s)" % (rc, se.strip()))
    rec = load(out)
    check(rec.get("log_events") == 5 and rec.get("log_skipped") == 2 and
          rec.get("log_slots") == 2 and rec.get("log_streams") == 3 and rec.get("ops") == 5,
          "--log reads 5 events on 2 slots and 3 streams, skips 2: %s" % rec)
    # What a pass leaves live goes back before the next: under a 3 MiB cap
    # the 1 MiB block left each pass would run out by the third.
    rc, so, se = run(*QUICK, "--log", log, "--stack", "limiting(limit=3MiB) > pool > host",
                     LIB, copy)
    check(rc == 0, "--log frees what a pass leaves live (%d: %s)" % (rc, se.strip()))
    # --logged-threads: a thread per logged thread, in the log's order; a
    # block allocated on one thread is freed on the other.
    log2 = write_log(tmp, "two.csv", ["7,1,allocate,0x1000,1048576,0x7f01",
                                      "9,2,allocate,0x2000,512,0x7f02",
                                      "9,3,free,0x1000,1048576,0x7f02",
                                      "7,4,allocate,0x3000,1048576,0x7f01",
                                      "7,5,free,0x2000,512,0x7f01"])
    rc, so, se = run(*QUICK, "--log", log2, "--logged-threads", "--json", out, "--stack",
                     "limiting(limit=3MiB) > pool > host", LIB, copy)
    check(rc == 0 and "replay two.csv, logged threads" in so,
          "--logged-threads: exit 0 (%d: %s)" % (rc, se.strip()))
    rec = load(out)
    check(rec.get("log_threads") == 2 and rec.get("log_events") == 5 and
          rec.get("log_slots") == 2 and rec.get("a_ns_per_call", 0) > 0,
          "--logged-threads: 2 threads, 5 events on 2 slots, timed: %s" % rec)
    rc, so, se = run(*QUICK, "--logged-threads", LIB, copy)
    check(rc == 2 and "--logged-threads needs --log" in se, "--logged-threads alone: exit 2")
    bad = os.path.join(tmp, "bad.csv")
    with open(bad, "w") as f:
        f.write("a,b,c\n1,2,3\n")
    rc, so, se = run(*QUICK, "--log", bad, LIB, copy)
    check(rc == 1 and "not an RMM CSV log" in se, "--log, bad header: exit 1 (%d: %s)" % (rc, se))
    rc, so, se = run(*QUICK, "--log", os.path.join(tmp, "none.csv"), LIB, copy)
    check(rc == 1 and "cannot read" in se, "--log, no file: exit 1 (%d: %s)" % (rc, se))
    rc, so, se = run(*QUICK, "--log", log, "--threads", "2", LIB, copy)
    check(rc == 2 and "--log replays on one thread" in se, "--log with --threads: exit 2")

    # The command line itself.
    for args, what in (((LIB,), "give two libraries"),
                       ((LIB, LIB, LIB), "more than two libraries"),
                       (("--nosuch", "1", LIB, LIB), "unknown option '--nosuch'"),
                       (("--pattern", "zigzag", LIB, LIB), "--pattern takes pair or random"),
                       (("--ops", "many", LIB, LIB), "bad value for --ops: 'many'"),
                       (("--bursts", "0", LIB, LIB), "bad value for --bursts: '0'"),
                       (("--pattern", "random", "--min", "9", "--max", "8", LIB, LIB),
                        "--min is above --max"),
                       ((LIB, LIB, "--json"), "--json needs a value")):
        rc, so, se = run(*args)
        check(rc == 2 and what in se, "%s: exit 2 with '%s' (%d: %s)" % (args, what, rc,
                                                                          se.strip()))
    rc, so, se = run("--help")
    check(rc == 0 and "usage: rmmc-ab" in so, "--help prints the usage")

print("%d failures" % len(failures))
sys.exit(1 if failures else 0)
