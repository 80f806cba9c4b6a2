#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/workloads/torch_dist.py without a GPU: --compare's checks (identical
losses, median step time, peak reserved per rank) over made-up runs that
pass and runs that fail each check, its exit status and its report, and
the argument checks. The training itself needs torchrun and GPUs
(scripts/gpu-dist).
Usage: test_torch_dist.py PATH/TO/torch_dist.py
"""
import contextlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import tempfile

SCRIPT = os.path.abspath(sys.argv[1])
passed, failures = 0, []


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL:", what)


spec = importlib.util.spec_from_file_location("torch_dist", SCRIPT)
td = importlib.util.module_from_spec(spec)
spec.loader.exec_module(td)


def run(model, allocator, world, step_ms, peak, losses=None):
    return {"model": model, "allocator": allocator, "world": world,
            "ranks": [{"rank": r, "losses": losses or [2.5, 2.25, 2.0 + r],
                       "step_ms": step_ms + r, "peak_reserved": peak + r * 100}
                      for r in range(world)]}


def results(runs):
    return {c: ok for c, ok, _ in td.compare(runs)}


good = [run("ddp", "native", 2, 10.0, 1000), run("ddp", "rmmc", 2, 9.0, 900),
        run("ddp", "native", 2, 11.0, 1000), run("ddp", "rmmc", 2, 9.5, 900),
        run("ddp", "native", 2, 12.0, 1000), run("ddp", "rmmc", 2, 30.0, 900)]
r = results(good)
check(r.get("ddp 2 GPU(s): identical losses") is True, "equal losses pass")
# medians of the slowest rank: native 12.0 (11, 12, 13), rmmc 10.5 (10, 10.5, 31)
check(r.get("ddp 2 GPU(s): median step time rmmc <= native") is True, "median, not mean, of runs")
check(r.get("ddp 2 GPU(s): peak reserved per rank rmmc <= native") is True, "lower peak passes")
detail = {c: d for c, _, d in td.compare(good)}
check("rmmc 10.50 ms, native 12.00 ms" in detail["ddp 2 GPU(s): median step time rmmc <= native"],
      "step detail: %s" % detail["ddp 2 GPU(s): median step time rmmc <= native"])
check("runs 10.00-31.00 and 11.00-13.00" in detail["ddp 2 GPU(s): median step time rmmc <= native"],
      "the runs' spread (slowest rank of each): %s"
      % detail["ddp 2 GPU(s): median step time rmmc <= native"])

bad_loss = good[:-1] + [run("ddp", "rmmc", 2, 9.0, 900, losses=[2.5, 2.25, 2.0000001])]
check(results(bad_loss)["ddp 2 GPU(s): identical losses"] is False, "a differing loss fails")
short = good[:-1] + [run("ddp", "rmmc", 2, 9.0, 900, losses=[2.5])]
check(results(short)["ddp 2 GPU(s): identical losses"] is False, "a missing step fails")
slow = [run("fsdp", "native", 4, 10.0, 1000), run("fsdp", "rmmc", 4, 10.5, 900)]
r = results(slow)
check(r["fsdp 4 GPU(s): median step time rmmc <= native"] is False, "slower rmmc fails")
check(r["fsdp 4 GPU(s): peak reserved per rank rmmc <= native"] is True, "per-rank peaks")
fat = [run("fsdp", "native", 2, 10.0, 1000), run("fsdp", "rmmc", 2, 9.0, 1001)]
check(results(fat)["fsdp 2 GPU(s): peak reserved per rank rmmc <= native"] is False,
      "a higher peak on one rank fails")
alone = td.compare([run("ddp", "rmmc", 2, 9.0, 900)])
check(len(alone) == 1 and alone[0][1] is None, "no native run: nothing to compare (None)")
# Groups by model and world: ddp on 2 and on 4 GPUs are separate checks.
both = good + [run("ddp", "native", 4, 10.0, 1000), run("ddp", "rmmc", 4, 9.0, 900)]
check(len(td.compare(both)) == 6, "two worlds, three checks each")
# Several rmmc specs in one set of runs: each checked against the same
# native runs, under its own name; one spec alone keeps the plain name.
chunks = dict(run("fsdp", "rmmc", 2, 9.0, 1100), spec="pool(expandable=false) > cuda")
specs = [run("fsdp", "native", 2, 10.0, 1000), dict(run("fsdp", "rmmc", 2, 9.0, 900), spec="pool > cuda"),
         chunks]
r = results(specs)
check(len(r) == 6, "two specs, three checks each: %s" % sorted(r))
check(r.get("fsdp 2 GPU(s), pool > cuda: peak reserved per rank rmmc <= native") is True,
      "the lower spec passes under its name")
check(r.get("fsdp 2 GPU(s), pool(expandable=false) > cuda: peak reserved per rank rmmc <= native")
      is False, "the higher spec fails under its name")
check("fsdp 2 GPU(s): identical losses" in results(specs[:2]), "one spec: the plain name")
# A label names a variant the spec alone does not (an environment variable).
off = dict(run("fsdp", "rmmc", 2, 9.0, 1100), spec="pool > cuda", label="X=0 pool > cuda")
r = results(specs[:2] + [off])
check(r.get("fsdp 2 GPU(s), X=0 pool > cuda: peak reserved per rank rmmc <= native") is False
      and r.get("fsdp 2 GPU(s), pool > cuda: peak reserved per rank rmmc <= native") is True,
      "labels part runs of one spec: %s" % sorted(r))

# The timed steps' summary: medians over runs of the slowest rank's step and
# host time, medians per rank of the allocator's counters.
timed = [dict(run("fsdp", "native", 2, 10.0, 1000), steps=60, warmup=10),
         dict(run("fsdp", "rmmc", 2, 9.0, 900), steps=60, warmup=10, spec="pool > cuda")]
for r, grows in zip(timed, (0, 4)):
    for x in r["ranks"]:
        x["host_ms"] = 3.0 + x["rank"]
        x["timed"] = {"grows": grows + x["rank"], "shrinks": 2}
lines = td.timed_summary(timed)
check(lines == ["fsdp 2 GPU(s), native: step 11.00 ms, host 4.00 ms; per rank over 50 timed "
                "steps: grows 0.5, shrinks 2",
                "fsdp 2 GPU(s), pool > cuda: step 10.00 ms, host 4.00 ms; per rank over 50 "
                "timed steps: grows 4.5, shrinks 2"], "timed summary: %s" % lines)
check(td.timed_summary(good[:2])[0] == "ddp 2 GPU(s), native: step 11.00 ms",
      "runs without host times or counters: the step alone: %s" % td.timed_summary(good[:2]))

with tempfile.TemporaryDirectory() as tmp:
    paths = []
    for i, x in enumerate(good):
        p = os.path.join(tmp, "run%d.json" % i)
        with open(p, "w") as f:
            json.dump(x, f)
        paths.append(p)
    out = subprocess.run([sys.executable, SCRIPT, "--compare"] + paths, capture_output=True,
                         text=True, timeout=60)
    check(out.returncode == 0 and out.stdout.count("PASS ") == 3, "--compare passes: %s%s"
          % (out.stdout, out.stderr))
    p = os.path.join(tmp, "slow.json")
    with open(p, "w") as f:
        json.dump(run("ddp", "rmmc", 2, 99.0, 900), f)
    out = subprocess.run([sys.executable, SCRIPT, "--compare"] + paths + [p, p, p],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode == 1 and "FAIL   ddp 2 GPU(s): median step time" in out.stdout,
          "--compare fails on a slower median: %s" % out.stdout)
    out = subprocess.run([sys.executable, SCRIPT, "--compare", os.path.join(tmp, "none.json")],
                         capture_output=True, text=True, timeout=60)
    check(out.returncode == 1 and "none.json" in out.stderr, "a missing file is reported")

for argv in (["--steps", "0"], ["--allocator", "native", "--cap-rank", "1"], ["--model", "cnn"]):
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            td.parse(argv)
            check(False, "%s accepted" % argv)
        except SystemExit as e:
            check(e.code == 2, "%s exits 2" % argv)
a = td.parse(["--model", "fsdp", "--cap-rank", "1", "--cap", "1GiB"])
check(a.model == "fsdp" and a.cap_rank == 1 and a.cap == "1GiB" and a.allocator == "rmmc",
      "arguments parse")

print("%d checks passed, %d failed" % (passed, len(failures)))
sys.exit(1 if failures else 0)
