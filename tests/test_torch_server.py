#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/workloads/torch_server.py without a GPU: its arguments, workload plan,
checksum comparison, report, JSON and exit codes.

The worker processes are replaced by small Python programs that print a
made-up summary (or fail, hang, print none), so the driver runs as it would
on the GPU machine. Where torch and torchvision are importable, a tiny
--device cpu run goes through the real workers too (skipped otherwise).
Usage: test_torch_server.py PATH/TO/torch_server.py [PATH/TO/librmmc.so]
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
LIB = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else None
passed, failures = 0, []


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL:", what)


spec = importlib.util.spec_from_file_location("torch_server", SCRIPT)
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)


def cli(*args, timeout=60):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


# ---- the workload plan ----
for name, w in ts.WORKLOADS.items():
    shapes = ts.cnn_shapes(w)
    plans = [ts.request_plan(7, i, w) for i in range(2000)]
    check(plans == [ts.request_plan(7, i, w) for i in range(2000)],
          name + ": plan is deterministic")
    check([p["id"] for p in plans] == list(range(2000)), name + ": ids")
    check(plans != [ts.request_plan(8, i, w) for i in range(2000)], name + ": seed matters")
    check(len({p["seed"] for p in plans}) == 2000, name + ": one input seed per request")
    first = [(p["batch"], p["size"]) for p in plans[:2 * len(shapes)] if p["kind"] == "cnn"]
    check(first == shapes, name + ": the first requests cover every CNN shape in order")
    check([p["kind"] for p in plans[:6]] == ["cnn", "text"] * 3, name + ": alternating start")
    cnn = [p for p in plans if p["kind"] == "cnn"]
    text = [p for p in plans if p["kind"] == "text"]
    check(all((p["batch"], p["size"]) in shapes for p in cnn), name + ": CNN shapes")
    check(all(w["text_batch"][0] <= p["batch"] <= w["text_batch"][1]
              and w["seq"][0] <= p["size"] <= w["seq"][1] for p in text), name + ": text shapes")
    check(800 < len(cnn) < 1200, name + ": about half CNN (%d)" % len(cnn))
    check(len({p["size"] for p in text}) > 10, name + ": varied sequence lengths")
full = ts.WORKLOADS["full"]
check(ts.request_plan(0, 100, full) == ts.request_plan(0, 100, full), "plan: repeatable")
check(ts.percentile([5, 1, 4, 2, 3], 50) == 3 and ts.percentile([5, 1, 4, 2, 3], 99) == 5
      and ts.percentile([7], 1) == 7 and ts.percentile(list(range(1, 101)), 99) == 99,
      "percentile: nearest rank")

# ---- checksums ----
nan, inf = float("nan"), float("inf")
check(ts.same_checksum([1.5, 2.0, 7], [1.5, 2.0, 7], 0), "exact: equal")
check(not ts.same_checksum([1.5, 2.0, 7], [1.5, 2.0, 8], 0), "exact: bit sums differ")
check(not ts.same_checksum([1.5, 2.0, 7], [1.5000001, 2.0, 7], 0), "exact: float sums differ")
check(ts.same_checksum([nan, nan, 7], [nan, nan, 7], 0), "exact: NaN equals NaN")
check(not ts.same_checksum([nan, nan, 7], [1.0, 1.0, 7], 0), "exact: NaN against a number")
check(ts.same_checksum([1e-6, 100.0, 7], [2e-6, 100.0, 9], 1e-6),
      "rtol: a cancelling sum is judged against the magnitudes")
check(not ts.same_checksum([1e-6, 100.0, 7], [1e-2, 100.0, 9], 1e-6), "rtol: too far")
check(not ts.same_checksum([1.0, inf, 7], [1.0, 5.0, 7], 0.5), "rtol: inf against a number")
c = ts.compare_checksums({"checksums": [[1.0, 1.0, 1], [2.0, 2.0, 2], [3.0, 3.0, 3]]},
                         {"checksums": [[1.0, 1.0, 1], [2.0, 2.0, 5], [3.5, 3.5, 3]]}, 0)
check(c["mismatches"] == 2 and c["first_mismatches"] == [1, 2] and c["compared"] == 3,
      "compare: mismatches listed: %s" % c)
check(abs(c["max_relative_difference"] - 0.5 / 3.5) < 1e-12, "compare: largest difference")
c = ts.compare_checksums({"checksums": [[1.0, 1.0, 1]] * 3}, {"checksums": [[1.0, 1.0, 1]]}, 0)
check(c["mismatches"] == 2, "compare: missing requests count as mismatches")


# ---- steady-state figures ----
def stack(syncs, chunks, reserved, peak):
    return [{"layer": "statistics", "figures": {"in_use": 10, "peak": peak, "allocations": 5}},
            {"layer": "pool", "figures": {"reserved": reserved, "reserved_peak": reserved,
                                          "device_syncs": syncs, "grows": chunks,
                                          "free_on_stream": "stream=default free=0 fresh=0"}},
            {"layer": "cuda", "figures": {}}]


def plugin(peak):
    return {"allocations": 100, "deallocations": 90, "peak_bytes": peak, "bytes_in_use": 0}


m = ts.memory_summary({"figures_warm": {"stack": stack(3, 4, 100, 50), "plugin_stats": plugin(9)},
                       "figures_end": {"stack": stack(5, 7, 120, 60), "plugin_stats": plugin(9)}},
                      True)
check(m["steady_device_syncs"] == 2 and m["steady_upstream_calls"] == 3, "rmmc steady: %s" % m)
check(m["steady_deltas"]["stack"][1]["deltas"]["reserved"] == 20
      and "free_on_stream" not in m["steady_deltas"]["stack"][1]["deltas"], "rmmc deltas")
m = ts.memory_summary({"figures_warm": {"stack": [{"layer": "x", "figures": {"a": 1}}],
                                        "plugin_stats": plugin(1)},
                       "figures_end": {"stack": [{"layer": "x", "figures": {"a": 4}}],
                                       "plugin_stats": plugin(1)}}, True)
check(m["steady_device_syncs"] is None and m["steady_upstream_calls"] is None,
      "rmmc steady: figures a stack lacks are None")
torch_warm = {"num_sync_all_streams": 1, "num_device_alloc": 10, "num_device_free": 2,
              "allocated_bytes.all.peak": 7}
torch_end = {"num_sync_all_streams": 4, "num_device_alloc": 12, "num_device_free": 3,
             "allocated_bytes.all.peak": 7}
m = ts.memory_summary({"figures_warm": {"torch_memory_stats": torch_warm},
                       "figures_end": {"torch_memory_stats": torch_end}}, False)
check(m["steady_device_syncs"] == 3 and m["steady_upstream_calls"] == 3,
      "native steady: %s" % m)
check(ts.memory_summary({"figures_warm": None, "figures_end": None}, False)["steady_deltas"]
      is None, "no figures: None")

# ---- arguments (the real command line) ----
for bad in (["--threads", "0"], ["--requests", "0"], ["--warmup", "-1"], ["--modes", "native,gpu"],
            ["--modes", ","], ["--rtol", "-1"], ["--rtol", "nan"], ["--timeout", "0"],
            ["--modes", "native", "--spec", "pool > cuda"], ["--spec", " "],
            ["--device", "cpu"], ["--device", "tpu"], ["--dtype", "int8"], ["--bogus"]):
    rc, out, err = cli(*bad)
    check(rc == 2 and "error" in err and "Traceback" not in err,
          "bad arguments %s: exit %d, %r" % (bad, rc, err[-300:]))
rc, out, _ = cli("--help")
check(rc == 0 and "--threads" in out and "--spec" in out, "--help")
rc, _, err = cli("--modes", "rmmc", "--lib", "/nonexistent/librmmc.so")
check(rc == 2 and "no such file" in err, "a missing library: exit 2 (%r)" % err[-200:])
if LIB:
    rc, _, err = cli("--lib", LIB, "--spec", "pool > cuda", "--spec", "pool(inital=1GiB) > cuda")
    check(rc == 2 and "does not parse" in err and "inital" in err,
          "a bad second spec: exit 2 before any run (%r)" % err[-300:])
a, problems = ts.parse_args(["--modes", "rmmc,native", "--spec", "a", "--spec", "b"])
check(not problems and a.modes == ["native", "rmmc"], "modes run in a fixed order")
check([r[0] for r in ts.plan_runs(a)] == ["native", "rmmc1", "rmmc2"], "labels per spec")
a, _ = ts.parse_args([])
check(a.spec == [os.environ.get("RMMC_ALLOC_CONF") or ts.DEFAULT_SPEC] and a.dtype == "float16"
      and a.threads == 8, "defaults")
check([r[0] for r in ts.plan_runs(a)] == ["native", "expandable", "rmmc"], "default runs")
env = ts.worker_env("expandable")
check(env["PYTORCH_CUDA_ALLOC_CONF"] == ts.EXPANDABLE_CONF and "CUBLAS_WORKSPACE_CONFIG" in env
      and "RMMC_ALLOC_CONF" not in env, "expandable environment")
check("PYTORCH_CUDA_ALLOC_CONF" not in ts.worker_env("native"), "native environment")
cmd = ts.worker_command("rmmc2", "rmmc", "pool > cuda", a)
check(cmd[cmd.index("--spec") + 1] == "pool > cuda" and cmd[cmd.index("--label") + 1] == "rmmc2"
      and cmd[cmd.index("--threads") + 1] == "8", "worker command: %s" % cmd)


# ---- the driver, with made-up workers ----
tmp = tempfile.mkdtemp()


def summary(label, rps, checksums, reserved, allocated, syncs=0):
    mode = "rmmc" if label.startswith("rmmc") else label
    r = {"mode": mode, "label": label, "requests_per_s": rps, "checksums": checksums,
         "latency_ms": {"p50": 10.0, "p99": 30.0}, "peak_reserved_bytes": reserved,
         "peak_allocated_bytes": allocated, "device_used_peak_bytes": reserved + (500 << 20)}
    if mode == "rmmc":
        r["figures_warm"] = {"stack": stack(7, 2, reserved, allocated), "plugin_stats": plugin(1)}
        r["figures_end"] = {"stack": stack(7 + syncs, 2, reserved, allocated),
                            "plugin_stats": plugin(1)}
    else:
        r["figures_warm"] = {"torch_memory_stats": torch_warm}
        r["figures_end"] = {"torch_memory_stats": torch_end}
    r.update(ts.memory_summary(r, mode == "rmmc"))
    return r


def fake(behaviour):
    """behaviour: label -> ("ok", summary) | ("fail", text) | ("hang",) | ("silent",)."""
    def command(label, mode, spec, args):
        b = behaviour[label]
        if b[0] == "ok":
            path = os.path.join(tmp, label + ".json")
            with open(path, "w") as f:
                json.dump(b[1], f)
            code = ("print('[%s] serving'); print(%r + open(%r).read())"
                    % (label, ts.RESULT_TAG, path))
        elif b[0] == "fail":
            code = ("import sys; print('[x] line one'); print(%r, file=sys.stderr); sys.exit(3)"
                    % b[1])
        elif b[0] == "hang":
            code = "import time; print('[x] stuck', flush=True); time.sleep(60)"
        else:
            code = "print('no summary here')"
        return [sys.executable, "-c", code]
    return command


def drive(behaviour, *argv):
    """Runs main() in this process with made-up workers; returns (exit
    code, printed text, JSON summary)."""
    ts.worker_command = fake(behaviour)
    path = os.path.join(tmp, "out.json")
    if os.path.exists(path):
        os.remove(path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = ts.main(["--json", path, *argv])
    data = json.load(open(path)) if os.path.exists(path) else None
    return rc, out.getvalue(), data


REF = [[1.0, 2.0, 3], [4.0, 5.0, 6], [float("nan"), float("nan"), 9]]
GIB = 1 << 30
no_rmmc = ("--modes", "native,expandable")
good = {"native": ("ok", summary("native", 100.0, REF, 3 * GIB, 2 * GIB)),
        "expandable": ("ok", summary("expandable", 80.0, REF, 4 * GIB, 2 * GIB)),
        "rmmc": ("ok", summary("rmmc", 88.0, REF, int(2.1 * GIB), 2 * GIB)),
        "rmmc1": ("ok", summary("rmmc1", 88.0, REF, int(2.1 * GIB), 2 * GIB)),
        "rmmc2": ("ok", summary("rmmc2", 70.0, REF, int(3 * GIB), 2 * GIB, syncs=5))}
lib_args = ("--lib", LIB) if LIB else ()

rc, text, data = drive(good, *no_rmmc)
check(rc == 0 and data["errors"] == [] and data["reference"] == "native",
      "two good runs: exit 0 (%d)\n%s" % (rc, text))
check(data["comparison"]["expandable"]["checksums"]["mismatches"] == 0, "NaN checksums match")
check(abs(data["comparison"]["native"]["rps_vs_expandable"] - 1.25) < 1e-9, "native vs expandable")
check(abs(data["comparison"]["expandable"]["reserved_over_allocated"] - 2.0) < 1e-9, "ratio")
lines = text.splitlines()
row = [ln for ln in lines if ln.startswith("expandable ")]
check(row and "equal" in row[0] and "4,096 MiB" in row[0] and "2.00x" in row[0]
      and row[0].split()[-2:] == ["3", "3"], "table row: %s" % row)
check(any(ln.startswith("native ") and "reference" in ln for ln in lines), "reference row")
check("[native] serving" in text, "the workers' output is passed on")

if LIB:
    rc, text, data = drive(good, *lib_args)
    t = data["comparison"]["rmmc"]["targets"]
    check(rc == 0 and data["comparison"]["rmmc"]["targets_met"] and all(t.values()),
          "rmmc meets every target: %s\n%s" % (t, text))
    check(abs(data["comparison"]["rmmc"]["rps_vs_expandable"] - 1.1) < 1e-9, "rmmc vs expandable")
    check("targets for rmmc (issue 12)" in text and "NO" not in text, "targets line")
    check("rmmc pool: {" in text, "every layer's figures printed")
    check(data["runs"]["rmmc"]["steady_device_syncs"] == 0, "rmmc steady syncs")

    rc, text, data = drive(good, *lib_args, "--spec", "pool > cuda",
                           "--spec", "statistics > pool > cuda")
    t = data["comparison"]["rmmc2"]["targets"]
    check(rc == 0 and data["comparison"]["rmmc1"]["targets_met"]
          and not data["comparison"]["rmmc2"]["targets_met"]
          and t["no_steady_device_syncs"] is False and t["rps_at_least_expandable"] is False
          and t["checksums_equal_native"] is True, "a missed target: exit 0 (%d), %s" % (rc, t))
    check("targets missed by: rmmc2" in text and "rmmc2: statistics > pool > cuda" in text
          and data["specs"] == {"rmmc1": "pool > cuda", "rmmc2": "statistics > pool > cuda"},
          "specs in the report and the JSON")
    rc, _, _ = drive(good, *lib_args, "--spec", "pool > cuda", "--spec", "statistics > pool > cuda",
                     "--strict")
    check(rc == 1, "--strict: a missed target exits 1")

bad = dict(good)
bad["expandable"] = ("ok", summary("expandable", 80.0, [[1.0, 2.0, 3], [4.0, 5.0, 7], REF[2]],
                                   4 * GIB, 2 * GIB))
rc, text, data = drive(bad, *no_rmmc)
check(rc == 1 and data["comparison"]["expandable"]["checksums"]["first_mismatches"] == [1]
      and any("differ" in e for e in data["errors"]), "a checksum mismatch: exit 1")
check(any(ln.startswith("expandable ") and "1 differ" in ln for ln in text.splitlines()),
      "mismatch in the table")
close = dict(good)
close["expandable"] = ("ok", summary("expandable", 80.0, [[1.0000001, 2.0, 4], REF[1], REF[2]],
                                     4 * GIB, 2 * GIB))
rc, _, _ = drive(close, *no_rmmc)
check(rc == 1, "exact by default")
rc, _, data = drive(close, *no_rmmc, "--rtol", "1e-6")
check(rc == 0 and data["rtol"] == 1e-6, "within --rtol: exit 0")

failing = dict(good)
failing["expandable"] = ("fail", "boom: CUDA out of memory")
rc, text, data = drive(failing, *no_rmmc)
check(rc == 1 and "expandable" not in data["runs"] and "native" in data["runs"]
      and any("boom: CUDA out of memory" in e and "exit 3" in e for e in data["errors"]),
      "a failed run: exit 1 with its output's tail: %s" % data["errors"])
check(data["comparison"]["native"]["rps_vs_expandable"] is None, "no expandable: no ratio")
hanging = dict(good)
hanging["native"] = ("hang",)
rc, text, data = drive(hanging, *no_rmmc, "--timeout", "2")
check(rc == 1 and any("timed out after 2 s" in e and "stuck" in e for e in data["errors"])
      and data["reference"] == "expandable", "a hung run is killed: %s" % data["errors"])
silent = dict(good)
silent["native"] = ("silent",)
rc, _, data = drive(silent, *no_rmmc)
check(rc == 1 and any("printed no summary" in e and "no summary here" in e
                      for e in data["errors"]), "a run without a summary: exit 1")
out_dir = tempfile.mkdtemp()
os.environ["OUT"] = out_dir
ts.worker_command = fake(good)
with contextlib.redirect_stdout(io.StringIO()):
    rc = ts.main(list(no_rmmc))
check(rc == 0 and os.path.exists(os.path.join(out_dir, "torch_server.json")),
      "$OUT/torch_server.json")
del os.environ["OUT"]

# ---- the real workers on a CPU, where torch is installed ----
if all(importlib.util.find_spec(m) for m in ("torch", "torchvision")):
    path = os.path.join(tmp, "cpu.json")
    rc, out, err = cli("--device", "cpu", "--tiny", "--modes", "native,expandable",
                       "--threads", "3", "--requests", "24", "--warmup", "8", "--json", path,
                       timeout=300)
    data = json.load(open(path)) if os.path.exists(path) else {}
    runs = data.get("runs", {})
    check(rc == 0 and set(runs) == {"native", "expandable"},
          "cpu run: exit %d\n%s%s" % (rc, out, err))
    for r in runs.values():
        check(len(r["checksums"]) == 32 and sum(r["served_per_thread"]) == 24
              and r["requests_per_s"] > 0 and r["timed_kinds"]["cnn"] + r["timed_kinds"]["text"]
              == 24, "cpu run: figures of %s" % r["label"])
    check(data.get("comparison", {}).get("expandable", {}).get("checksums", {}).get("mismatches")
          == 0, "cpu run: the same checksums in two processes")
else:
    print("skipped: the CPU run of the real workers (no torch and torchvision here)")

print("%d passed, %d failed" % (passed, len(failures)))
sys.exit(1 if failures else 0)
