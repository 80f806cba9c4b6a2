#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch's own allocator tests as the bar for rmmc's native backend.

Runs the allocator classes of PyTorch's test/test_cuda.py -- TestCuda's
memory, graph, stream, record_stream, OOM and memory-fraction tests,
TestMemPool and TestBlockStateAbsorption -- under native PyTorch and under
rmmc (installed by the launcher: `python -m rmmc.torch --spec SPEC -m
pytest ...`), each test in its own process (--jobs at a time) and all in
one pytest process, and prints the differential: the tests that pass
natively and do not pass under rmmc. Writes everything to --json.

The test file: --test-file, else .torch-tests/test_cuda.py (git-ignored;
--fetch downloads the installed torch's own, at its git_version, where
GitHub is reachable). A test file of a newer release than the installed
torch runs with tests/python/gpu/torch_tests_shim.py, which defines the
few torch.testing names it imports that the installed torch lacks.

Tests that check what only PyTorch's caching allocator can mean are
listed in NOT_APPLICABLE with the reason (the README repeats them): their
outcomes are reported, not counted.

The per-test runs (--jobs at a time) and the two one-process runs (native
and rmmc) go at once; the few tests whose bodies read the device's own
memory figures (mem_get_info, total_memory) run, in whichever process,
while no other test process is in a test or initializing CUDA
(gpu_lock.py: a lock every pytest process here takes). Each failure's
assertion (the E lines of pytest's report and where it failed) is in the
JSON ("why") and printed under the differential. TESTS="a,b" (or
--tests) runs only those tests (test names, or Class::test), -k a regular
expression over the node ids.

    PYTHONPATH=python:tests/python/gpu RMMC_LIB=build/librmmc.so \\
        python3 tests/python/gpu/torch_tests.py [--spec "pool > cuda"] [--jobs 12]

Exit status: 0 no differential, 1 a test that passes natively does not
under rmmc (or a run broke), 2 bad usage or no test file, 77 no GPU.
"""
import argparse
import ast
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
DEFAULT_FILE = os.path.join(ROOT, ".torch-tests", "test_cuda.py")

CLASSES = ("TestCuda", "TestMemPool", "TestBlockStateAbsorption")
# TestCuda's tests of the allocator: memory, graphs, streams and events,
# record_stream, out of memory, the memory fraction. Host (pinned) memory
# and NVML's device figures are not the CUDA allocator's.
TESTCUDA_WANT = re.compile(r"memory|graph|stream|event|oom|fraction|allocator")
TESTCUDA_SKIP = re.compile(r"pinned|host_memory|cudart|device_memory_used")
# What a test's body reads that other processes on the GPU change: such a
# test runs alone in the per-test phase.
DEVICE_WIDE = re.compile(r"\b(mem_get_info|total_memory|device_memory_used)\b")

# Tests whose assertions are rules of PyTorch's caching allocator itself,
# not of what an allocator must do: reported, not counted (README, "PyTorch's
# own tests").
NOT_APPLICABLE = {
    "TestCuda::test_graph_memory_stats_and_use_result_after_destroy_graph":
        "asserts the caching allocator's own segment sizes per size class (a 2 MiB "
        "segment per small request, 20 MiB for 1-10 MiB, 2 MiB rounding above) and its "
        "split of reserved bytes and segments between a small and a large pool; rmmc's "
        "pool has one heap and its own growth sizes",
    "TestMemPool::test_mempool_no_split":
        "asserts that a pool which splits packs two 4 MiB tensors into one segment (the "
        "caching allocator's 20 MiB segments for 1-10 MiB requests); rmmc's private pools "
        "grow by what a request needs, so both pools hold one segment per tensor (a "
        "no_split pool's stack is its spec's base layer: one allocation per block)",
}

RESULT_ORDER = ("passed", "xfailed", "skipped", "failed", "error", "xpassed", "crashed",
                "timeout", "missing")


def base_name(nodeid):
    """Class::test of a node id, parameters dropped."""
    parts = nodeid.split("::")
    name = re.sub(r"\[.*\]$", "", parts[-1])
    return "%s::%s" % (parts[-2] if len(parts) > 2 else "", name)


def static_info(path):
    """From the test file's source: {Class::test: {"serial": bool,
    "device_wide": bool}} (serialTest decorators; bodies that read the
    device's own figures)."""
    with open(path) as f:
        src = f.read()
    tree = ast.parse(src)
    info = {}
    for cls in tree.body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef) or not fn.name.startswith("test"):
                continue
            decos = [ast.get_source_segment(src, d) or "" for d in fn.decorator_list]
            body = ast.get_source_segment(src, fn) or ""
            info["%s::%s" % (cls.name, fn.name)] = {
                "serial": any("serialTest" in d for d in decos),
                "device_wide": bool(DEVICE_WIDE.search(body)),
            }
    return info


def selected(nodeid, classes):
    cls, name = base_name(nodeid).split("::")
    if cls not in classes:
        return False
    if cls == "TestCuda":
        return bool(TESTCUDA_WANT.search(name)) and not TESTCUDA_SKIP.search(name)
    return True


def choose(ids, select=None, tests=""):
    """The ids matching `select` (a regular expression) and naming one of
    `tests` ("a,b": test names or Class::test; empty: all), and the names
    of `tests` that matched none."""
    if select:
        ids = [n for n in ids if re.search(select, n)]
    wanted = [t.strip() for t in (tests or "").split(",") if t.strip()]
    if not wanted:
        return ids, []
    named = lambda n: {base_name(n), base_name(n).split("::")[1]}  # noqa: E731
    unknown = [t for t in wanted if not any(t in named(n) for n in ids)]
    return [n for n in ids if named(n) & set(wanted)], unknown


# ---------------------------------------------------------------- running

def base_env():
    env = dict(os.environ)
    paths = [os.path.join(ROOT, "python"), HERE]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "RMMC_TORCH_AUTOLOAD"):
        env.pop(k, None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(LOCK_ENV)
    return env


# gpu_lock.py's settings for every test process (main() sets them).
LOCK_ENV = {}


# The lines of pytest's report of a failure that say why: its E lines (the
# assertion and its message), without PyTorch's how-to-rerun advice, and
# where it failed.
REPRO = re.compile(r"To execute this test, run the following|^\s*python \S+\.py \w+\.\w+|"
                   r"PYTORCH_PRINT_REPRO_ON_FAILURE")
WHERE = re.compile(r"^\S+:\d+: \w+")


def failure_summary(message, max_lines=8):
    """What a failure's report says of why, in a few lines ("" if nothing)."""
    lines, where = [], ""
    for line in (message or "").splitlines():
        if line.startswith("E ") or line == "E":
            text = line[1:].strip()
            if text and not REPRO.search(text):
                lines.append(text)
        elif WHERE.match(line.strip()):
            where = line.strip()
    if not lines:  # no E lines (a skip's reason, a crash): its first lines
        lines = [l.strip() for l in (message or "").splitlines()
                 if l.strip() and not REPRO.search(l)][:3]
    if len(lines) > max_lines:
        lines = lines[:max_lines - 1] + ["... (%d more lines)" % (len(lines) - max_lines + 1)]
    if where and where not in lines:
        lines.append(where)
    return "\n".join(l[:300] for l in lines)


def pytest_cmd(mode, spec, args):
    base = ["-m", "pytest", "-p", "torch_tests_shim", "-p", "gpu_lock", "-p", "no:cacheprovider"]
    if mode == "rmmc":
        return [sys.executable, "-m", "rmmc.torch", "--spec", spec, "--backend", "native"] + \
            base + args
    return [sys.executable] + base + args


def parse_junit(path):
    """{nodeid-ish "Class::test[param]": (outcome, message)} from a junit XML."""
    out = {}
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return out
    for tc in root.iter("testcase"):
        cls = (tc.get("classname") or "").split(".")[-1]
        key = "%s::%s" % (cls, tc.get("name"))
        outcome, message = "passed", ""
        for child in tc:
            tag = child.tag
            msg = (child.get("message") or "") + "\n" + (child.text or "")
            if tag == "failure":
                outcome = "xpassed" if "XPASS" in msg or "Unexpected success" in msg else "failed"
            elif tag == "error":
                outcome = "error"
            elif tag == "skipped":
                outcome = "xfailed" if (child.get("type") or "").endswith("xfail") or \
                    "expected failure" in msg.lower() else "skipped"
            else:
                continue
            message = msg.strip()[-20000:]
            break
        out[key] = (outcome, message)
    return out


VERBOSE_LINE = re.compile(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
VERBOSE_OUTCOME = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error",
                   "SKIPPED": "skipped", "XFAIL": "xfailed", "XPASS": "xpassed"}


def parse_verbose(output):
    """{key: (outcome, "")} from pytest -v's lines: what a process that
    died before writing its junit report had finished."""
    out = {}
    for line in output.splitlines():
        m = VERBOSE_LINE.match(line.strip())
        if m:
            out.setdefault(key_of(m.group(1)), (VERBOSE_OUTCOME[m.group(2)], ""))
    return out


def key_of(nodeid):
    parts = nodeid.split("::")
    return "%s::%s" % (parts[-2], parts[-1]) if len(parts) > 2 else nodeid


def run_pytest(mode, spec, file, nodeids, timeout, cwd):
    """Runs `nodeids` of `file` in one pytest process; returns ({key:
    (outcome, message)}, seconds, exit status, output tail)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = os.path.join(tmp, "junit.xml")
        ids = [os.path.basename(file) + "::" + n.split("::", 1)[1] for n in nodeids]
        cmd = pytest_cmd(mode, spec, ["-v", "-rN", "--junitxml=" + junit] + ids)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=cwd, env=base_env(), capture_output=True, text=True,
                               timeout=timeout)
            rc, output = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            output = e.stdout if isinstance(e.stdout, str) else (e.stdout or b"").decode(
                errors="replace")
            rc = "timeout"
        seconds = round(time.time() - t0, 1)
        results = parse_junit(junit)
        if not results:  # died before the report: what -v printed
            results = parse_verbose(output)
    tail = output[-3000:]
    got, lost = {}, False
    for n in nodeids:  # in the order they ran
        k = key_of(n)
        if k in results:
            got[k] = results[k]
        elif rc == "timeout":
            got[k] = ("timeout" if not lost else "missing",
                      "no result within %d s" % timeout)
            lost = True
        else:
            # the first without a result is the one the process died in
            got[k] = ("crashed" if not lost else "missing",
                      "no result (exit status %s): %s" % (rc, tail[-1200:]))
            lost = True
    return got, seconds, rc, tail


def collect(file, cwd, timeout):
    """The test file's node ids, as native PyTorch's pytest collects them."""
    cmd = pytest_cmd("torch", "", ["--collect-only", "-q", os.path.basename(file)])
    p = subprocess.run(cmd, cwd=cwd, env=base_env(), capture_output=True, text=True,
                       timeout=timeout)
    ids = [l.strip() for l in p.stdout.splitlines() if "::" in l and not l.startswith(" ")]
    if not ids:
        raise RuntimeError("collecting %s found no tests (exit status %d):\n%s"
                           % (file, p.returncode, (p.stdout + p.stderr)[-3000:]))
    return ids


# ---------------------------------------------------------------- the file

def fetch(dest):
    """Downloads the installed torch's own test/test_cuda.py (at its
    git_version, the commit it was built from) to `dest`."""
    import urllib.request
    import torch
    ref = getattr(torch.version, "git_version", None) or "v" + torch.__version__.split("+")[0]
    url = "https://raw.githubusercontent.com/pytorch/pytorch/%s/test/test_cuda.py" % ref
    with urllib.request.urlopen(url, timeout=60) as r:
        data = r.read()
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, "wb") as f:
        f.write(data)
    with open(os.path.join(os.path.dirname(dest), "SOURCE"), "w") as f:
        f.write("%s\ntorch %s\n" % (url, torch.__version__))
    return url


# ---------------------------------------------------------------- the differential

def differential(native, rmmc):
    """Keys that pass natively (or fail as expected) and not so under rmmc."""
    out = []
    for k, (n_out, _) in native.items():
        r_out = rmmc.get(k, ("missing", ""))[0]
        if n_out in ("passed", "xfailed") and r_out != n_out:
            out.append(k)
    return out


def counts(results):
    c = {}
    for outcome, _ in results.values():
        c[outcome] = c.get(outcome, 0) + 1
    return {k: c[k] for k in RESULT_ORDER if k in c}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--test-file", default=DEFAULT_FILE)
    ap.add_argument("--fetch", action="store_true",
                    help="download the installed torch's test_cuda.py to --test-file first")
    ap.add_argument("--spec", default="pool > cuda", help="rmmc's stack (default: %(default)s)")
    ap.add_argument("--jobs", type=int, default=12,
                    help="per-test processes at once (the two one-process runs go beside them)")
    ap.add_argument("--mode", choices=("both", "per-test", "one-process"), default="both")
    ap.add_argument("--classes", default=",".join(CLASSES))
    ap.add_argument("-k", dest="select", help="a regular expression the tests' names must match")
    ap.add_argument("--tests", default=os.environ.get("TESTS", ""),
                    help="only these tests, comma-separated: test names or Class::test "
                         "(default: $TESTS)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per test process")
    ap.add_argument("--budget", type=int, default=0,
                    help="seconds for everything (0: none): per-test runs still waiting when "
                         "it is spent are reported as not run")
    ap.add_argument("--json", help="default: $OUT/torch_tests.json")
    ap.add_argument("--list", action="store_true", help="print the selected tests and stop")
    args = ap.parse_args()
    start = time.time()
    file = os.path.abspath(args.test_file)
    if args.fetch:
        print("torch_tests: fetched %s" % fetch(file), flush=True)
    if not os.path.exists(file):
        print("torch_tests: no test file at %s: give --test-file, or --fetch where GitHub "
              "is reachable (the README's \"PyTorch's own tests\" says how the GPU machine, "
              "which has no network, gets one)" % file, file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError:
        print("torch_tests: no torch: skipped")
        return 77
    if not torch.cuda.is_available():
        print("torch_tests: no GPU: skipped")
        return 77
    cwd = os.path.dirname(file)
    classes = tuple(c.strip() for c in args.classes.split(",") if c.strip())
    info = static_info(file)
    ids = [n for n in collect(file, cwd, args.timeout) if selected(n, classes)]
    ids, unknown = choose(ids, args.select, args.tests)
    if unknown:
        print("torch_tests: no such test among the selected: %s" % ", ".join(unknown),
              file=sys.stderr)
        return 2
    if not ids:
        print("torch_tests: no test selected", file=sys.stderr)
        return 2
    print("torch_tests: %d tests of %s (torch %s, %s), rmmc stack %r"
          % (len(ids), os.path.basename(file), torch.__version__, torch.cuda.get_device_name(),
             args.spec), flush=True)
    if args.list:
        print("\n".join(ids))
        return 0
    # The tests that read the device's own figures run while no other test
    # process is in a test (gpu_lock.py); theirs go first, so that the
    # budget never leaves them unrun.
    exclusive = sorted({base_name(n) for n in ids
                        if info.get(base_name(n), {}).get("device_wide")})
    lock_dir = tempfile.mkdtemp(prefix="torch_tests_lock.")
    LOCK_ENV.update({"TORCH_TESTS_LOCK": os.path.join(lock_dir, "gpu.lock"),
                     "TORCH_TESTS_EXCLUSIVE": ",".join(exclusive)})
    order = [n for n in ids if base_name(n) in exclusive] + \
        [n for n in ids if base_name(n) not in exclusive]
    lock = threading.Lock()
    per = {"torch": {}, "rmmc": {}}
    secs = {"torch": {}, "rmmc": {}}
    one = {}

    def one_test(mode, n):
        left = args.budget - (time.time() - start) if args.budget else None
        if left is not None and left <= 0:
            got = {key_of(n): ("missing", "not run: the --budget of %d s was spent" % args.budget)}
            seconds = 0.0
        else:
            limit = args.timeout if left is None else max(30, min(args.timeout, int(left) + 30))
            got, seconds, _, _ = run_pytest(mode, args.spec, file, [n], limit, cwd)
        outcome, message = list(got.values())[0]
        with lock:
            per[mode].update(got)
            secs[mode][key_of(n)] = seconds
            done = sum(len(v) for v in per.values())
        why = failure_summary(message).splitlines() if outcome not in ("passed", "xfailed") else []
        print("  [%3d/%d] %-5s %-8s %5.1fs %s%s" % (
            done, 2 * len(ids), mode, outcome, seconds, key_of(n),
            ("  -- " + why[0][:120]) if why else ""), flush=True)

    def one_process(mode):
        limit = max(args.timeout, 900)
        if args.budget:
            limit = max(60, int(args.budget - (time.time() - start)) + 30)
        got, seconds, rc, tail = run_pytest(mode, args.spec, file, ids, limit, cwd)
        with lock:
            one[mode] = {"results": got, "seconds": seconds, "exit": rc, "tail": tail}
        print("  one process, %s: %s in %.0fs (exit %s)" % (mode, counts(got), seconds, rc),
              flush=True)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = []
        if args.mode in ("both", "one-process"):
            futures += [pool.submit(one_process, m) for m in ("torch", "rmmc")]
        if args.mode in ("both", "per-test"):
            with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as tests:
                jobs = [tests.submit(one_test, mode, n) for n in order for mode in ("torch", "rmmc")]
                for f in jobs:
                    f.result()
        for f in futures:
            f.result()
    shutil.rmtree(lock_dir, ignore_errors=True)

    report = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
              "test_file": file, "spec": args.spec, "tests": len(ids),
              "not_applicable": NOT_APPLICABLE, "seconds": round(time.time() - start, 1)}
    bad = False
    lines = []
    for label, native, mine in (
            ("per-test", per["torch"], per["rmmc"]),
            ("one-process", one.get("torch", {}).get("results", {}),
             one.get("rmmc", {}).get("results", {}))):
        if not native:
            continue
        diff = differential(native, mine)
        counted = [k for k in diff if base_name(k) not in NOT_APPLICABLE]
        bad = bad or bool(counted)
        report[label] = {
            "native": counts(native), "rmmc": counts(mine),
            "differential": counted,
            "not_applicable_differing": [k for k in diff if base_name(k) in NOT_APPLICABLE],
            "outcomes": {k: {"torch": native[k][0], "rmmc": mine.get(k, ("missing", ""))[0]}
                         for k in sorted(native)},
            "messages": {k: {"torch": native[k][1][-800:],
                             "rmmc": mine.get(k, ("", ""))[1][-1500:]}
                         for k in sorted(native) if k in diff or native[k][0] != "passed"},
            # why each one that did not pass failed: its report's E lines
            # and where (failure_summary)
            "why": {k: {m: failure_summary(r[k][1]) for m, r in (("torch", native), ("rmmc", mine))
                        if k in r and r[k][0] not in ("passed", "xfailed")}
                    for k in sorted(set(native) | set(mine))
                    if any(k in r and r[k][0] not in ("passed", "xfailed")
                           for r in (native, mine))},
        }
        lines.append("%s: native %s; rmmc %s; passing natively, not under rmmc: %d%s" % (
            label, counts(native), counts(mine), len(counted),
            " (+%d not applicable)" % (len(diff) - len(counted)) if len(diff) > len(counted)
            else ""))
        for k in diff:
            outcome, message = mine.get(k, ("missing", "no result"))
            lines.append("    %-9s %s%s" % (
                outcome, k, "  [not applicable]" if base_name(k) in NOT_APPLICABLE else ""))
            for w in failure_summary(message).splitlines():
                lines.append("              | " + w)
    if one:
        report["one_process_runs"] = {m: {k: v for k, v in r.items() if k != "results"}
                                      for m, r in one.items()}
        for m, r in one.items():
            if r["exit"] == "timeout":
                bad = True
                lines.append("one-process %s run timed out" % m)
    report["seconds_per_test"] = secs
    print("\n== torch_tests differential (%s, %d tests, %.0f s)" % (
        os.path.basename(file), len(ids), time.time() - start))
    print("\n".join(lines))
    for k, why in NOT_APPLICABLE.items():
        print("  not applicable: %s: %s" % (k, why))
    path = args.json or (os.path.join(os.environ["OUT"], "torch_tests.json")
                         if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
