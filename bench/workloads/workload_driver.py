# SPDX-License-Identifier: Apache-2.0
"""What the side-by-side drivers share (torch_demo.py, torch_server.py,
torch_graphs.py): a worker process per allocator, since PyTorch's
allocator can only be chosen before the first CUDA use. A worker imports
PyTorch (start_torch) and prints its summary as one tagged JSON line; the
driver runs it under a watchdog (run_worker) and writes the comparison
where --json or $OUT says (summary_path)."""
import json
import os
import subprocess
import sys
import threading
import time


def start_torch(cuda=True):
    """(torch, torchvision, None) for a worker, or (None, None, exit
    status) once the reason is printed: 3 without torch and torchvision,
    4 when `cuda` and PyTorch sees no CUDA device."""
    try:
        import torch
        import torchvision
    except ImportError as e:
        print("error: torch and torchvision are needed (%s)" % e, file=sys.stderr)
        return None, None, 3
    if cuda and not torch.cuda.is_available():
        print("error: no CUDA device visible to PyTorch", file=sys.stderr)
        return None, None, 4
    return torch, torchvision, None


def run_worker(cmd, env, label, timeout, tag):
    """Runs one worker process, echoing its output but the line that
    starts with `tag` (its JSON summary); returns (summary dict or None,
    error text or None). A watchdog kills a run that hangs, silent or not,
    after `timeout` seconds."""
    print("=== %s: %s" % (label, " ".join(cmd)), flush=True)
    t0 = time.time()
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                text=True, bufsize=1)
    except OSError as e:
        return None, "could not start the %s run: %s" % (label, e)
    timed_out = threading.Event()

    def kill():
        timed_out.set()
        proc.kill()
    watchdog = threading.Timer(timeout, kill)
    watchdog.start()
    result, tail = None, []
    try:
        for line in proc.stdout:
            if line.startswith(tag):
                try:
                    result = json.loads(line[len(tag):])
                except ValueError as e:
                    tail = (tail + ["(unreadable summary: %s)\n" % e])[-40:]
                continue
            sys.stdout.write(line)
            tail = (tail + [line])[-40:]
        proc.wait()
    finally:
        watchdog.cancel()
    print("=== %s run took %.0f s" % (label, time.time() - t0), flush=True)
    if timed_out.is_set():
        return result, "the %s run timed out after %d s; last output:\n%s" % (
            label, timeout, "".join(tail))
    if proc.returncode != 0:
        return result, "the %s run failed (exit %d); last output:\n%s" % (
            label, proc.returncode, "".join(tail))
    if result is None:
        return None, "the %s run printed no summary; last output:\n%s" % (label, "".join(tail))
    return result, None


def summary_path(path, name):
    """Where a driver writes its JSON: `path` (--json), else $OUT/name
    when OUT is set, else None (nowhere)."""
    return path or (os.path.join(os.environ["OUT"], name) if os.environ.get("OUT") else None)
