#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The Python examples import the rmmc package and check their stack spec
before they touch a framework: without a GPU (or the framework) each one
must load the package over the given library, refuse a misspelled spec
with rmmc's message (exit 2), and with a good spec get as far as the
framework (exit 3: not installed, 4: no GPU), or, where both are there,
run to their own "OK" (exit 0).
Usage: test_python_examples.py LIBRMMC EXAMPLE.py...
"""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.abspath(sys.argv[1])
failures = []


def run(script, *args):
    env = dict(os.environ, RMMC_LIB=LIB, PYTHONPATH=os.path.join(ROOT, "python"))
    env.pop("RMMC_ALLOC_CONF", None)
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True,
                       env=env, timeout=120, cwd="/")
    return p.returncode, p.stdout + p.stderr


for script in sys.argv[2:]:
    name = os.path.basename(script)
    rc, out = run(script, "--spec", "statistics > pool(inital=1MiB) > cuda")
    if rc != 2 or "did you mean 'initial'" not in out or "Traceback" in out:
        failures.append("%s with a misspelled spec: exit %d\n%s" % (name, rc, out[-600:]))
    rc, out = run(script, "--spec", "statistics > pool > cuda")
    if not (rc in (3, 4) or (rc == 0 and out.rstrip().endswith("OK"))) or "Traceback" in out:
        failures.append("%s with a good spec: exit %d (3, 4 or 0 and OK expected)\n%s"
                        % (name, rc, out[-600:]))
    print("%s: %s" % (name, "ok" if not any(f.startswith(name) for f in failures) else "FAIL"))

for f in failures:
    print("FAIL:", f)
sys.exit(1 if failures else 0)
