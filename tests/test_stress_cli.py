#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""rmmc-stress: a clean run passes with every figure consistent, an injected
corruption is caught (exit 1, corruptions == injected), bad command lines
exit 2.

Usage: test_stress_cli.py PATH/TO/rmmc-stress host|gpu
host: host mode (CPU fill and check; runs anywhere).
gpu:  GPU mode (kernels); exits 77 (skipped) without a GPU.
"""
import json
import os
import subprocess
import sys
import tempfile

STRESS, MODE = sys.argv[1], sys.argv[2]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args, timeout=240):
    p = subprocess.run([STRESS, f"--{MODE}", "--quiet", *args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


OPS = 20000 if MODE == "host" else 200000
SMALL = ("--ops", str(OPS), "--threads", "4", "--streams", "2", "--seed", "7")

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "stress.json")

    # A clean run over the default stacks.
    rc, out, err = run(*SMALL, "--json", path)
    if MODE == "gpu" and rc == 77:
        print("no GPU (or no kernels): skipped")
        sys.exit(77)
    print(out)
    check(rc == 0, f"clean run exits 0 (rc {rc}, stderr {err!r})")
    doc = json.load(open(path))
    check(doc["mode"] == MODE, f"mode {MODE}: {doc['mode']}")
    check(doc["schema_version"] == 1, f"schema_version 1: {doc.get('schema_version')}")
    check(doc["passed"] is True, "passed is true")
    check(doc["threads"] == 4 and doc["streams_per_thread"] == 2, "4 threads x 2 streams")
    want_stacks = 7 if MODE == "gpu" else 6
    check(len(doc["stacks"]) == want_stacks, f"{want_stacks} default stacks: {len(doc['stacks'])}")
    for s in doc["stacks"]:
        name = s["stack"]
        check(s["passed"] and s["ran"] and s["error"] is None, f"{name}: passed ({s['error']})")
        check(s["verify"] == ("kernel" if MODE == "gpu" else "cpu"), f"{name}: verify {s['verify']}")
        check(s["ops"] >= OPS, f"{name}: at least {OPS} ops: {s['ops']}")
        check(s["corruptions"] == 0 and s["injected"] == 0, f"{name}: no corruption")
        check(s["unexpected"] == 0 and s["misaligned"] == 0, f"{name}: no unexpected status")
        check(s["allocations"] == s["deallocations"] > OPS // 4,
              f"{name}: every block freed: {s['allocations']} / {s['deallocations']}")
        check(s["leaked_bytes"] == 0 and s["leaked_count"] == 0, f"{name}: nothing leaked")
        check(s["statistics_allocations"] == s["allocations"]
              and s["statistics_deallocations"] == s["deallocations"],
              f"{name}: statistics counted what the program did")
        check(s["moved_streams"] > 0, f"{name}: blocks moved between streams")
        check(s["handed_to_threads"] > 0, f"{name}: blocks handed between threads")
        check(s["zero_byte_requests"] > 0, f"{name}: 0-byte requests made")
        if "max=" not in name and "limiting(" not in name:  # bounded stacks may refuse, cleanly
            check(s["oom"] == 0, f"{name}: no out of memory with the default sizes: {s['oom']}")
        check(s["bytes_allocated"] > s["allocations"], f"{name}: bytes counted")
        layers = s["layers"]
        check(layers and layers[0]["name"] == "statistics", f"{name}: layers listed from the top")
        for l in layers:
            check(l.get("in_use", 0) == 0 and l.get("outstanding", 0) == 0,
                  f"{name}: layer {l['name']} back to 0: {l}")
        if "aligned(" in name or "pool >" in name:
            check(s["aligned"] > 0, f"{name}: alignments above 256 B requested and served")
    check("PASSED" in out and "FAILED" not in out, "the table says PASSED")

    # The same seed makes the same operations (single thread: no scheduling).
    one = ("--ops", "3000", "--threads", "1", "--streams", "3", "--stack",
           "statistics > pool > " + ("cuda" if MODE == "gpu" else "host"))
    runs = []
    for k in range(2):
        p = os.path.join(tmp, f"seed{k}.json")
        rc, out, err = run(*one, "--json", p)
        check(rc == 0, f"single-thread run exits 0 (rc {rc}, {err!r})")
        runs.append(json.load(open(p))["stacks"][0])
    keys = ("ops", "allocations", "bytes_allocated", "moved_streams", "aligned")
    check(all(runs[0][k] == runs[1][k] for k in keys), f"same seed, same ops: {runs}")

    # Injected corruption must be caught, counted exactly and fail the run.
    for spec in ("statistics > pool > ", "statistics > arena > "):
        spec += "cuda" if MODE == "gpu" else "host"
        rc, out, err = run(*SMALL, "--stack", spec, "--inject-corruption", "--json", path)
        check(rc == 1, f"{spec}: injected corruption exits 1 (rc {rc}, {err!r})")
        s = json.load(open(path))["stacks"][0]
        check(s["injected"] >= 1, f"{spec}: something injected: {s['injected']}")
        check(s["corruptions"] == s["injected"],
              f"{spec}: every injected corruption caught: {s['corruptions']} / {s['injected']}")
        check(not s["passed"] and "corrupted" in s["error"], f"{spec}: failure says why: {s['error']}")
        check(s["leaked_bytes"] == 0, f"{spec}: still nothing leaked")
        check("FAILED" in out, f"{spec}: the table says FAILED")

    # Full fill on the CPU, odd sizes only (tails of 1-7 bytes).
    if MODE == "host":
        rc, out, err = run("--ops", "4000", "--threads", "2", "--streams", "2", "--fill", "full",
                           "--max-bytes", "77", "--large-bytes", "0", "--stack",
                           "statistics > binning > pool > host")
        check(rc == 0, f"small sizes, full fill: exit 0 (rc {rc}, {err!r})")

    # A stack of the wrong memory for the mode fails the run, with a reason.
    if MODE == "host":
        rc, out, err = run("--ops", "100", "--stack", "statistics > cuda")
        check(rc == 1 and "FAILED" in out, f"a cuda stack in host mode fails (rc {rc})")

    # A device per thread. One device (any machine): the run is as without
    # --devices, nothing crosses. Two (host mode always; GPU mode where the
    # machine has them): each device's stack ends at zero on its own, blocks
    # handed across devices are freed by the taker, per-device items build
    # each device's own stack.
    base = "cuda" if MODE == "gpu" else "host"
    config = f"statistics > pool > {base}; 1: statistics > pool(expandable=false) > {base}"
    for devices in ("0", "0,1"):
        rc, out, err = run("--ops", str(OPS // 2), "--threads", "4", "--streams", "2",
                           "--devices", devices, "--stack", f"statistics > pool > {base}",
                           "--stack", f"statistics > binning > pool > {base}",
                           "--stack", config, "--json", path)
        if rc == 77 and devices == "0,1" and "this machine has 1" in err:
            print("one GPU: --devices 0,1 skipped (exit 77)")
            continue
        check(rc == 0, f"--devices {devices}: exit 0 (rc {rc}, {err!r}, {out})")
        doc = json.load(open(path))
        ids = [int(d) for d in devices.split(",")]
        check(doc["devices"] == ids, f"--devices {devices}: devices {doc['devices']}")
        check(f"thread i on device i mod {len(ids)}" in out, f"--devices {devices}: said so")
        for s in doc["stacks"]:
            name = s["stack"]
            check(s["passed"] and s["error"] is None, f"{devices} {name}: passed ({s['error']})")
            per = s["per_device"]
            check([d["device"] for d in per] == ids, f"{devices} {name}: a stack per device")
            for d in per:
                check(d["statistics_allocations"] == d["statistics_deallocations"] > 0
                      and d["leaked_bytes"] == 0,
                      f"{devices} {name}: device {d['device']}'s own stack back to zero: {d}")
            check(sum(d["statistics_allocations"] for d in per) == s["allocations"],
                  f"{devices} {name}: the devices' statistics add up to what the program did")
            check({l["device"] for l in s["layers"]} == set(ids),
                  f"{devices} {name}: layers of every device listed")
            if len(ids) == 1:
                check(s["cross_device_frees"] == 0, f"{name}: nothing crosses one device")
            else:
                check(s["cross_device_frees"] > 0, f"{name}: blocks freed across devices: "
                      f"{s['cross_device_frees']}")
                want = "owner stack" if "binning" in per[0]["spec"] else "rmmc_deallocate"
                check(s["cross_device_path"] == want,
                      f"{name}: crossing blocks go back through {want}: {s['cross_device_path']}")
        if len(ids) == 2:
            per = doc["stacks"][2]["per_device"]
            check(per[0]["spec"] == f"statistics > pool > {base}"
                  and per[1]["spec"] == f"statistics > pool(expandable=false) > {base}",
                  f"per-device items: {per}")

    # Bad command lines.
    for args in (("--threads", "0"), ("--streams", "65"), ("--ops", "x"), ("--stack", "pool >"),
                 ("--fill", "half"), ("--max-bytes", "4MiB", "--large-bytes", "1MiB"),
                 ("--devices", "0,0"), ("--devices", "64"), ("--devices", "a"),
                 ("--devices", "0,1,2", "--threads", "2"), ("--stack", "pool > host; 1: pool("),
                 ("--bogus",), ("extra",)):
        rc, out, err = run(*args)
        check(rc == 2 and "rmmc-stress:" in err, f"{args}: exit 2 with a message (rc {rc})")
        check(out == "", f"{args}: nothing on stdout")
    rc, out, err = run("--ops", "10", "--threads", "1", "--json", os.path.join(tmp, "no/such/dir.json"))
    check(rc == 3, f"unwritable --json exits 3 (rc {rc})")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all checks passed")
