#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What every command-line tool shares, and the rough edges issue 14 named:

- `--version` prints "NAME X.Y.Z" (the library's version) on each tool;
- an unknown option, an unknown short option and a missing value read the
  same on each tool ("NAME: unknown option '--x'" and the --help hint), exit 2;
- rmmc-replay opens --json and --svg before the replay: a path that cannot
  be written fails at once (exit 2, no table printed, the flag named);
- rmmc-replay keeps the first out-of-memory message whole (it used to stop
  at 255 characters, mid-sentence, in the table and the JSON);
- the SVG draws the live line after (on top of) the reserved lines;
- rmmc-stress prints progress lines while a stack runs.

Host stacks only; a few seconds.
Usage: test_tools_cli.py RMMC-BENCH RMMC-REPLAY RMMC-STRESS VERSION
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

BENCH, REPLAY, STRESS, VERSION = sys.argv[1:5]
TOOLS = {"rmmc-bench": BENCH, "rmmc-replay": REPLAY, "rmmc-stress": STRESS}
SVG = "{http://www.w3.org/2000/svg}"
LOG = ("Thread,Time,Action,Pointer,Size,Stream\n"
       "0,1,allocate,0x1000,1000,0x0\n"
       "0,2,allocate,0x2000,5000,0x0\n"
       "0,3,free,0x1000,1000,0x0\n"
       "0,4,allocate,0x3000,2000,0x0\n"
       "0,5,free,0x3000,2000,0x0\n")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(exe, *args, timeout=120):
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def test_version():
    for name, exe in TOOLS.items():
        rc, out, err = run(exe, "--version")
        check(rc == 0 and out == "%s %s\n" % (name, VERSION),
              "%s --version: rc %d, %r %r" % (name, rc, out, err))


def test_bad_options():
    for name, exe in TOOLS.items():
        for args, want in ((["--no-such-flag"], "unknown option '--no-such-flag'"),
                           (["--no-such-flag=3"], "unknown option '--no-such-flag'"),
                           (["-Z"], "unknown option '-Z'"),
                           (["--json"], "--json needs a value")):
            rc, out, err = run(exe, *args)
            expect = "%s: %s\n(%s --help lists the options)\n" % (name, want, name)
            check(rc == 2 and err == expect and out == "",
                  "%s %s: rc %d, stderr %r (want %r)" % (name, args, rc, err, expect))


def test_replay_outputs_open_first(tmp):
    log = os.path.join(tmp, "log.csv")
    with open(log, "w") as f:
        f.write(LOG)
    bad = os.path.join(tmp, "no-such-dir", "out")
    for flag in ("--json", "--svg"):
        rc, out, err = run(REPLAY, "--stack", "pool > host", flag, bad, log)
        check(rc == 2, "%s to a bad path: exit %d" % (flag, rc))
        check(err.startswith("rmmc-replay: %s: cannot write %s: " % (flag, bad)),
              "%s to a bad path: %r" % (flag, err))
        check("ratio" not in out and "events" not in out,
              "%s to a bad path: the log was replayed first: %r" % (flag, out))
    # A good --json beside a bad --svg: neither is written.
    good = os.path.join(tmp, "good.json")
    rc, _, _ = run(REPLAY, "--json", good, "--svg", bad, log)
    check(rc == 2, "bad --svg after a good --json: exit %d" % rc)


def test_replay_whole_oom_message(tmp):
    log = os.path.join(tmp, "oom.csv")
    with open(log, "w") as f:
        f.write(LOG)
    out_json = os.path.join(tmp, "oom.json")
    stack = "statistics > limiting(limit=4KiB) > pool(initial=1MiB) > host"
    rc, out, err = run(REPLAY, "--stack", stack, "--json", out_json, log)
    check(rc == 0, "oom replay: exit %d %r" % (rc, err))
    with open(out_json) as f:
        rec = json.load(f)[0]
    msg = rec.get("first_failure", "")
    check(rec["failures"] == 1, str(rec))
    # The message ends with the whole stack listing (outermost to base).
    check(len(msg) > 256 and msg.startswith("event 1: out of memory") and msg.endswith("> host"),
          "first_failure cut short (%d characters): %r" % (len(msg), msg))
    check(msg in out, "the table's failure line is not the whole message: %r" % out)


def test_svg_live_on_top(tmp):
    log = os.path.join(tmp, "svg.csv")
    with open(log, "w") as f:
        f.write(LOG)
    svg = os.path.join(tmp, "plot.svg")
    rc, _, err = run(REPLAY, "--quiet", "--stack", "host", "--stack", "pool > host", "--svg", svg, log)
    check(rc == 0, "svg replay: exit %d %r" % (rc, err))
    paths = list(ET.parse(svg).getroot().iter(SVG + "path"))
    series = [p.get("data-series") for p in paths]
    check(series == ["reserved", "reserved", "live"], "SVG series order: %s" % series)


def test_stress_progress():
    t0 = time.monotonic()
    rc, out, err = run(STRESS, "--host", "--threads", "2", "--streams", "1", "--ops", "60000",
                       "--progress", "0.01", "--stack", "pool > host", "--stack", "binning > pool > host",
                       timeout=200)
    check(rc == 0, "stress: exit %d\n%s\n%s" % (rc, out, err))
    lines = err.splitlines()
    progress = [l for l in lines if re.match(r"rmmc-stress: \[\d/2\] \d+% \(\d+ of 60000 ops\), [\d.]+ s$", l)]
    starts = [i for i, l in enumerate(lines) if re.match(r"rmmc-stress: \[\d/2\] \S", l) and "%" not in l]
    check(len(starts) == 2, "stack start lines: %r" % lines)
    check(len(progress) >= 1, "no progress line in %.1f s: %r" % (time.monotonic() - t0, lines[:10]))
    rc, _, err = run(STRESS, "--host", "--ops", "1000", "--progress", "0", "--stack", "host")
    check(rc == 2 and "--progress wants seconds" in err, "--progress 0: rc %d %r" % (rc, err))
    rc, _, err = run(STRESS, "--host", "--quiet", "--ops", "20000", "--progress", "0.01",
                     "--stack", "pool > host")
    check(rc == 0 and err == "", "--quiet still printed: %r" % err)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        test_version()
        test_bad_options()
        test_replay_outputs_open_first(tmp)
        test_replay_whole_oom_message(tmp)
        test_svg_live_on_top(tmp)
        test_stress_progress()
    if failures:
        print("%d check(s) failed" % len(failures))
        return 1
    print("tools CLI: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
