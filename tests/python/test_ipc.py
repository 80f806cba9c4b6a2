# SPDX-License-Identifier: Apache-2.0
"""rmmc.ipc and memory hooks from Python. On the CPU: hooks over host pools
(ranges equal to what the pool holds), exports refused for host memory,
damaged handles, per-device specs. On a GPU (skipped without one, required
by scripts/gpu-python): two interpreters sharing chunks and pages through
a UNIX socket, data both ways, and stale handles; PyTorch tensors shared
through bench/workloads/torch_ipc.py when PyTorch is there."""
import os
import re
import subprocess
import sys

import pytest

import rmmc
import rmmc.ipc
from conftest import run_python, skip_unless

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_hooks_follow_a_host_pool():
    held = {}

    def acquire(p, n):
        assert p not in held
        held[p] = n

    def release(p, n):
        assert held.pop(p) == n

    with rmmc.Resource("statistics > pool(expandable=true, page=64KiB) > host") as r:
        blocks = [(r.allocate(n), n) for n in (1000, 300000, 5 << 20, 70000)]
        r.set_memory_hooks(acquire, release)  # hears of what the pool holds already
        assert sum(held.values()) == r.layers()[1][1]["reserved"] > 0
        blocks += [(r.allocate(n), n) for n in (9 << 20, 123456)]
        assert sum(held.values()) == r.layers()[1][1]["reserved"]
        for p, n in blocks:
            r.deallocate(p, n)
        r.release_cached()
        assert sum(held.values()) == r.layers()[1][1]["reserved"] == 0
        r.set_memory_hooks(None, None)
    with rmmc.Resource("statistics > host") as r:
        with pytest.raises(rmmc.NotSupportedError) as e:
            r.set_memory_hooks(acquire, release)
        assert "pool" in e.value.message


def test_registry_hooks_and_device_specs():
    seen = []
    with rmmc.Resource("pool(expandable=false) > host") as r:
        rmmc.set_default(r, device=0)
        rmmc.set_memory_hooks(lambda p, n: seen.append(n), None, device=0)
        p = r.allocate(40 << 20)
        assert sum(seen) == r.figures()["reserved"] >= 40 << 20
        r.deallocate(p, 40 << 20)
        rmmc.set_memory_hooks(device=0)
    conf = "pool > cuda; 1: pool(max=40GiB) > cuda; 2-3: cuda_async"
    assert rmmc.device_spec(conf, 0) == "pool > cuda"
    assert rmmc.device_spec(conf, 1) == "pool(max=40GiB) > cuda"
    assert rmmc.device_spec(conf, 3) == "cuda_async"
    with pytest.raises(rmmc.ParseError, match="names device 1 in two items"):
        rmmc.device_spec("1: cuda; 0-1: host", 0)


def test_exports_refused_and_damaged_handles():
    with rmmc.Resource("pool > host") as r:
        p = r.allocate(4096)
        with pytest.raises(rmmc.NotSupportedError, match="host memory"):
            rmmc.ipc.export(p, resource=r)
        r.deallocate(p, 4096)
    with pytest.raises(rmmc.InvalidArgumentError, match="not an rmmc IPC handle"):
        rmmc.ipc.import_handle(b"\0" * 200)
    with pytest.raises(rmmc.InvalidArgumentError, match="not an rmmc IPC handle"):
        rmmc.ipc.check_handle(b"garbage")
    with pytest.raises(rmmc.UnknownPointerError):
        rmmc.ipc.close(0x1000)
    with pytest.raises(rmmc.UnknownPointerError):
        rmmc.ipc.revoke(0x1000)
    assert rmmc.ipc.stats()["imports"] == 0


# ---- on a GPU ----

def _gpu():
    return rmmc.device_count() > 0


@pytest.mark.skipif(not _gpu() and os.environ.get("RMMC_REQUIRE_GPU") != "1", reason="no GPU")
def test_two_interpreters_share_chunks_and_pages():
    code = os.path.join(ROOT, "examples", "ipc_demo.py")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, code, "--check"], capture_output=True, text=True,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "chunks: ok" in r.stdout and "pages: ok" in r.stdout and "stale: ok" in r.stdout


@pytest.mark.skipif(not _gpu() and os.environ.get("RMMC_REQUIRE_GPU") != "1", reason="no GPU")
def test_torch_tensors_shared():
    try:
        import torch  # noqa: F401
    except ImportError:
        skip_unless(False, "PyTorch is not installed")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "workloads", "torch_ipc.py")],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    # One line per case (torch_ipc.py): rmmc.ipc passes on both backends and
    # both kinds of pool; PyTorch's own sharing passes on the native backend.
    for case in ("native rmmc.ipc chunks", "native rmmc.ipc pages", "plugin rmmc.ipc chunks",
                 "plugin rmmc.ipc pages", "native torch.multiprocessing chunks",
                 "native torch.multiprocessing pages"):
        assert re.search(r"^\s+PASS %s \(" % re.escape(case), r.stdout, re.M), (case, r.stdout)
    assert "torch_ipc: PASS" in r.stdout, r.stdout
