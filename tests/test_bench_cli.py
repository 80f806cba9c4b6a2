#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""rmmc-bench's command line: the table, the JSON records and the exit codes.

Runs the program on host stacks with tiny op counts (a few seconds in all).
Usage: test_bench_cli.py PATH/TO/rmmc-bench
"""
import json
import os
import subprocess
import sys
import tempfile

BENCH = sys.argv[1]
FIELDS = {
    "stack": str, "baseline": bool, "memory": str, "pattern": str, "label": str,
    "threads": int, "ops": int, "ops_requested": int, "runs": int, "sizes": list,
    "size_min": int, "size_max": int, "live": int, "seed": int, "device": str,
    "device_id": int, "cpu": str, "status": str, "ratio_to": str,
}
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args, env=None):
    # The checks below describe a machine without a GPU (the CUDA baselines
    # are skipped): hide any GPU so they hold on the GPU machine too.
    env = dict(os.environ if env is None else env)
    env["CUDA_VISIBLE_DEVICES"] = ""
    p = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=60, env=env)
    return p.returncode, p.stdout, p.stderr


def quick(*args):
    return ("--ops", "200", "--repeat", "2", "--quiet", *args)


with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "out.json")

    # Host stacks, both patterns, two thread counts, JSON.
    rc, out, err = run(*quick("--stack", " host ", "--pattern", "pair,random", "--size", "256",
                              "--min", "256", "--max", "64KiB", "--live", "16",
                              "--threads", "1,2", "--json", path))
    check(rc == 0, f"host run exits 0 (rc {rc}, stderr {err!r})")
    records = json.load(open(path))
    check(isinstance(records, list), "JSON is an array")
    check(len(records) == 8, f"8 records (malloc, host x 2 patterns x 2 thread counts), got {len(records)}")
    for rec in records:
        for key, kind in FIELDS.items():
            check(isinstance(rec.get(key), kind), f"record field {key} is {kind.__name__}: {rec}")
        check(rec["status"] == "ok", f"status ok: {rec}")
        check(rec["schema_version"] == 1, f"schema_version 1: {rec}")
        check(rec["ns_per_call"] > 0, "ns_per_call > 0")
        check(rec["min"] <= rec["ns_per_call"] <= rec["max"], "min <= ns_per_call <= max")
        check(rec["runs"] == 2 and len(rec["ns_runs"]) == 2, "2 runs")
        check(rec["ops"] == 200, "200 ops")
        check(rec["threads"] in (1, 2), "threads 1 or 2")
        check(rec["ratio_to"] == "malloc", "ratio to malloc without a GPU or --baseline")
        check(isinstance(rec["ratio"], (int, float)), "ratio is a number")
        if rec["pattern"] == "pair":
            check(rec["sizes"] == [256] and rec["live"] == 0, "pair sizes")
        else:
            check(rec["sizes"] == [256, 65536] and rec["live"] == 16, "random sizes and live")
        if rec["threads"] == 2:
            check(isinstance(rec["scaling_vs_1_thread"], (int, float)), "scaling vs 1 thread")
    stacks = {r["stack"] for r in records}
    check(stacks == {"malloc", " host "}, f"stacks as given: {stacks}")
    check([r["baseline"] for r in records if r["stack"] == "malloc"] == [True] * 4, "malloc is a baseline")
    for word in ("stack", "pattern", "thr", "ns/call", "min", "ops/s", "ratio", "malloc",
                 "random 256B-64KiB live 16", "pair 256B"):
        check(word in out, f"table shows {word!r}")

    check(all(r.get("one_stream") is False for r in records), "one_stream false by default")
    check("every thread on one stream" not in out, "no one-stream note by default")

    # --one-stream: said in the header and in every record.
    rc, out, err = run(*quick("--stack", "pool > host", "--pattern", "random", "--min", "256",
                              "--max", "64KiB", "--live", "16", "--threads", "2",
                              "--one-stream", "--json", path))
    check(rc == 0, f"--one-stream exits 0 ({rc}, {err!r})")
    check("every thread on one stream" in out, f"--one-stream in the header: {out!r}")
    check(all(r.get("one_stream") is True for r in json.load(open(path))), "one_stream true")

    # --baseline picks the ratio's denominator.
    rc, out, err = run(*quick("--stack", "host", "--pattern", "pair", "--size", "1KiB",
                              "--baseline", "host", "--json", path))
    check(rc == 0, f"--baseline host exits 0 ({err!r})")
    by_stack = {r["stack"]: r for r in json.load(open(path))}
    check(by_stack["host"]["ratio"] == 1 and by_stack["host"]["ratio_to"] == "host", "host ratio 1")

    # A bad spec: exit 2, message with the word and a caret, nothing measured.
    rc, out, err = run(*quick("--stack", "nosuch > host", "--json", path))
    check(rc == 2, f"bad spec exits 2 (rc {rc})")
    check("unknown resource 'nosuch'" in err and "^^^^^^" in err and "nosuch > host" in err,
          f"bad spec message with caret: {err!r}")
    rc, out, err = run(*quick("--stack", "host(size=1)"))
    check(rc == 2 and "host has no option 'size'" in err, f"bad option: {err!r}")

    # --skip-invalid: a note instead, the rest still runs.
    rc, out, err = run(*quick("--stack", "nosuch > host", "--stack", "host", "--skip-invalid",
                              "--pattern", "pair", "--size", "256"))
    check(rc == 0 and "# skipped 'nosuch > host'" in out and "\nhost " in out,
          f"--skip-invalid skips with a note ({rc}, {out!r})")

    # Bad flags and values: exit 2 with a message.
    for args, needle in [(["--frobnicate"], "unknown option '--frobnicate'"),
                         (["--ops"], "--ops needs a value"),
                         (["--ops", "12x"], "--ops wants a whole number"),
                         (["--threads", "0"], "--threads wants a whole number"),
                         (["--size", "12XB"], "is not a size"),
                         (["--min", "1MiB", "--max", "1KiB"], "--min is larger than --max"),
                         (["--pattern", "zigzag"], "'zigzag' is not a pattern"),
                         (["--budget", "-1"], "--budget wants seconds"),
                         (["--baseline", "nope"], "--baseline 'nope' is not one of the stacks"),
                         (["stray"], "unexpected argument 'stray'")]:
        rc, out, err = run(*args)
        check(rc == 2 and needle in err, f"{args}: exit 2 with {needle!r} (rc {rc}, {err!r})")
        check(out == "", f"{args}: nothing on stdout")

    # A failing allocation is reported: exit 1, FAILED row, status in JSON.
    env = dict(os.environ)
    env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":allocator_may_return_null=1").lstrip(":")
    rc, out, err = run("--stack", "host", "--pattern", "pair", "--size", "8388608TiB",
                       "--ops", "2", "--repeat", "1", "--quiet", "--json", path, env=env)
    check(rc == 1, f"failed allocation exits 1 (rc {rc})")
    check("FAILED" in out and "ERROR_OUT_OF_MEMORY" in err, f"failure shown: {out!r} {err!r}")
    records = json.load(open(path))
    check(len(records) == 2 and all(r["status"] == "failed" and r["error"] and r["ns_per_call"] is None
                                    for r in records), f"failed records: {records}")

    # The --json file cannot be written: exit 3.
    rc, out, err = run(*quick("--json", os.path.join(tmp, "no", "such", "dir.json")))
    check(rc == 3 and "cannot write --json" in err, f"unwritable JSON exits 3 ({rc}, {err!r})")

    # Default stacks: malloc and host run; specs this build lacks are notes.
    rc, out, err = run(*quick("--pattern", "pair", "--size", "256", "--json", path))
    check(rc == 0, f"default stacks exit 0 ({err!r})")
    stacks = {r["stack"] for r in json.load(open(path))}
    check({"malloc", "host"} <= stacks, f"default stacks include malloc and host: {stacks}")
    check("no CUDA device" in out or "cuda" in stacks, "CUDA baselines run or are skipped with a note")

    # --list and --help.
    rc, out, err = run("--list")
    check(rc == 0 and "host" in out and "cuda_async" in out and "malloc" in out, "--list")
    rc, out, err = run("--help")
    check(rc == 0 and "Exit status" in out and "What is timed" in out, "--help")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all rmmc-bench command-line checks passed")
