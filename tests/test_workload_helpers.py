#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/workloads' shared helpers without a GPU: workload_driver.py (the
worker runner, the summary's path, importing PyTorch) and workload_rmmc.py's
worker helpers (worker_load, layers_json, plugin_summary), and
torch_demo.py's worker where PyTorch is missing.
Usage: test_workload_helpers.py PATH/TO/bench/workloads
"""
import contextlib
import importlib.util
import io
import os
import subprocess
import sys

HERE = os.path.abspath(sys.argv[1])
sys.path.insert(0, HERE)
import workload_driver as wd  # noqa: E402
import workload_rmmc as wr  # noqa: E402

passed, failures = 0, []


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL:", what)


TAG = "TEST_RESULT "


def run(code, timeout=30):
    """run_worker over `python -c code`: (result, error, echoed output)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result, err = wd.run_worker([sys.executable, "-c", code], dict(os.environ), "fake",
                                    timeout, TAG)
    return result, err, out.getvalue()


# ---- run_worker ----
r, e, out = run("print('hello'); print(%r + '{\"a\": 1}'); print('bye')" % TAG)
check(r == {"a": 1} and e is None, "a summary is read (%r, %r)" % (r, e))
check("hello\n" in out and "bye\n" in out
      and not any(line.startswith(TAG) for line in out.splitlines()),
      "the output is echoed, the summary line is not")
check(out.startswith("=== fake: ") and "=== fake run took" in out, "the run is announced and timed")
r, e, out = run("import sys; print(%r + '{\"a\": 2}'); print('oops'); sys.exit(5)" % TAG)
check(r == {"a": 2} and e.startswith("the fake run failed (exit 5); last output:")
      and "oops" in e, "a failed run keeps its summary and says why (%r)" % e)
r, e, out = run("print('nothing here')")
check(r is None and e.startswith("the fake run printed no summary") and "nothing here" in e,
      "a run without a summary (%r)" % e)
r, e, out = run("print(%r + '{not json')" % TAG)
check(r is None and "unreadable summary" in e, "an unreadable summary is reported (%r)" % e)
r, e, out = run("import time; print('started', flush=True); time.sleep(60)", timeout=1)
check(e is not None and e.startswith("the fake run timed out after 1 s") and "started" in e,
      "a hung run is killed by the watchdog (%r)" % e)
with contextlib.redirect_stdout(io.StringIO()):
    r, e = wd.run_worker([os.path.join(HERE, "no-such-program")], dict(os.environ), "gone", 5,
                         TAG)
check(r is None and e.startswith("could not start the gone run"), "a worker that cannot start")

# ---- summary_path ----
saved_out = os.environ.pop("OUT", None)
check(wd.summary_path(None, "x.json") is None, "no --json, no OUT: nowhere")
check(wd.summary_path("/tmp/a.json", "x.json") == "/tmp/a.json", "--json wins")
os.environ["OUT"] = "/tmp/outdir"
check(wd.summary_path(None, "x.json") == "/tmp/outdir/x.json", "$OUT/name")
check(wd.summary_path("/tmp/a.json", "x.json") == "/tmp/a.json", "--json wins over OUT")
del os.environ["OUT"]
if saved_out is not None:
    os.environ["OUT"] = saved_out

# ---- start_torch ----
have_torch = importlib.util.find_spec("torch") is not None and \
    importlib.util.find_spec("torchvision") is not None
if not have_torch:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        got = wd.start_torch()
    check(got == (None, None, 3) and "torch and torchvision are needed" in err.getvalue(),
          "start_torch without PyTorch: exit status 3 (%r)" % (got,))
    p = subprocess.run([sys.executable, os.path.join(HERE, "torch_demo.py"), "--worker", "native"],
                       capture_output=True, text=True, timeout=60)
    check(p.returncode == 3 and "torch and torchvision are needed" in p.stderr,
          "torch_demo.py's worker without PyTorch exits 3 (%d: %s)" % (p.returncode, p.stderr))
else:
    print("PyTorch is installed: the without-PyTorch checks are skipped")

# ---- workload_rmmc's worker helpers ----
saved_conf = os.environ.pop("RMMC_ALLOC_CONF", None)
check(wr.worker_load("native", None, "pool > cuda") is None
      and "RMMC_ALLOC_CONF" not in os.environ, "worker_load: a native worker loads nothing")
if saved_conf is not None:
    os.environ["RMMC_ALLOC_CONF"] = saved_conf

layers = [("pool", {"reserved": 4096, "peak_reserved": 8192, "policy": "best", "ratio": 2.0}),
          ("cuda", {"calls": 3})]
check(wr.layers_json(layers) == [
    {"layer": "pool", "figures": {"reserved": 4096, "peak_reserved": 8192, "policy": "best",
                                  "ratio": 2}},
    {"layer": "cuda", "figures": {"calls": 3}}], "layers_json: ints but for text")


class FakeRmmc:
    def __init__(self, status, message=""):
        self.answer = (status, "pool > cuda", message)

    def config_status(self):
        return self.answer


figs = [f for _, f in layers]
got, problem = wr.plugin_summary(FakeRmmc("SUCCESS"), "pool > cuda",
                                 {"peak_bytes": 1000, "allocations": 7}, figs)
check(got == {"spec": "pool > cuda", "config_status": "SUCCESS", "config_spec": "pool > cuda",
              "config_message": "", "peak_allocated_bytes": 1000, "peak_reserved_bytes": 8192}
      and problem is None, "plugin_summary: the peaks, the config (%r)" % (got,))
got, problem = wr.plugin_summary(FakeRmmc("SUCCESS"), "s", {"peak_bytes": 0, "allocations": 0},
                                 [{"calls": 1}])
check(got["peak_reserved_bytes"] is None and problem == "PyTorch allocated nothing through rmmc",
      "plugin_summary: no reservation figure, nothing allocated (%r)" % problem)
got, problem = wr.plugin_summary(FakeRmmc("ERROR_PARSE", "bad spec"), "s",
                                 {"peak_bytes": 0, "allocations": 0}, figs)
check(problem == "RMMC_ALLOC_CONF was not used: bad spec" and got["config_status"] == "ERROR_PARSE",
      "plugin_summary: an unused spec comes first (%r)" % problem)

print("%d passed, %d failed" % (passed, len(failures)))
sys.exit(1 if failures else 0)
