# SPDX-License-Identifier: Apache-2.0
"""rmmc.dist: every rank's figures in one table, on host stacks. The pure
parts (stack_summary, format_table) over real stacks of several processes;
gather_figures over a real gloo process group of two ranks when PyTorch is
installed (skipped otherwise: CI has no PyTorch)."""
import json
import os
import re
import subprocess
import sys

import pytest

import rmmc
import rmmc.dist
from conftest import run_python

MiB = 1 << 20


def test_stack_summary_reads_live_peak_and_reserved_of_a_pool():
    with rmmc.Resource("statistics > pool(initial=4MiB) > host") as r:
        a = r.allocate(3 * MiB)
        b = r.allocate(1 * MiB)
        r.deallocate(a, 3 * MiB)
        s = rmmc.dist.stack_summary(r.layers())
        assert s["stack"] == "statistics > pool > host"
        assert s["live"] == 1 * MiB and s["peak_live"] == 4 * MiB
        pool = dict(r.layers())["pool"]
        assert s["reserved"] == pool["reserved"] >= 4 * MiB
        assert s["peak_reserved"] == pool["reserved_peak"] >= s["reserved"]
        r.deallocate(b, 1 * MiB)


def test_stack_summary_without_a_pool_or_layers():
    assert rmmc.dist.stack_summary([]) == {"stack": "", "live": None, "peak_live": None,
                                           "reserved": None, "peak_reserved": None}
    s = rmmc.dist.stack_summary([("tracking", {"in_use": 5}), ("host", {"in_use": 5, "peak": 9})])
    assert s == {"stack": "tracking > host", "live": 5, "peak_live": 9, "reserved": None,
                 "peak_reserved": 9}


def test_rank_figures_of_a_resource_with_extra_figures():
    with rmmc.Resource("pool(initial=2MiB) > host") as r:
        p = r.allocate(MiB)
        f = rmmc.dist.rank_figures(r, extra={"step_ms": 12.5, "losses": [1.0, 0.5]}, rank=3)
        r.deallocate(p, MiB)
    assert f["rank"] == 3 and f["device"] == -1 and f["stack"] == "pool > host"
    # No statistics layer: the pool's own peak, which counts the 4 MiB span
    # its stream heap took for the 1 MiB block.
    pool = dict(f["layers"])["pool"]
    assert f["live"] == MiB and f["peak_live"] == pool["peak"] >= MiB
    assert f["reserved"] == pool["reserved"] >= 2 * MiB
    assert f["step_ms"] == 12.5 and f["losses"] == [1.0, 0.5]
    assert [name for name, _ in f["layers"]] == ["pool", "host"]
    json.dumps(f)  # what gather_object and client.run carry: plain data
    with pytest.raises(TypeError):
        rmmc.dist.rank_figures("pool > host")


def test_rank_figures_reads_the_registry_stack():
    code = """
import json, rmmc, rmmc.dist
rmmc.set_default("statistics > pool(initial=1MiB) > host", device=0)
r = rmmc.get_default()
p = r.allocate(300000)
print(json.dumps(rmmc.dist.rank_figures()))
r.deallocate(p, 300000)
"""
    out = run_python(code, env={"RANK": "5", "WORLD_SIZE": "8", "RMMC_ALLOC_CONF": None})
    assert out.returncode == 0, out.stderr
    f = json.loads(out.stdout)
    assert f["rank"] == 5 and f["world"] == 8 and f["stack"] == "statistics > pool > host"
    assert f["live"] == 300000 and f["peak_live"] == 300000


def test_format_table_over_figures_of_several_processes():
    # Two processes, each with its own stack, as two ranks would be.
    code = """
import json, sys, rmmc, rmmc.dist
rank = int(sys.argv[1]) if len(sys.argv) > 1 else 0
with rmmc.Resource("pool(initial=%dMiB) > host" % (2 + RANK)) as r:
    p = r.allocate((RANK + 1) << 20)
    print(json.dumps(rmmc.dist.rank_figures(r, rank=RANK, extra={"step_ms": 10.0 + RANK})))
    r.deallocate(p, (RANK + 1) << 20)
"""
    rows = []
    for rank in (1, 0):
        out = run_python(code.replace("RANK", str(rank)))
        assert out.returncode == 0, out.stderr
        rows.append(json.loads(out.stdout))
    text = rmmc.dist.format_table(rows)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["rank", "host", "dev"] and "step_ms" in lines[0]
    body = [line for line in lines if re.match(r"\d ", line)]
    assert [line.split()[0] for line in body] == ["0", "1"]  # sorted by rank
    assert "1.00 MiB" in body[0] and "2.00 MiB" in body[1]  # live of each rank
    assert "10.000" in body[0] and "11.000" in body[1]
    total = lines[-1]
    assert total.startswith("all 2") and "3.00 MiB" in total  # the live bytes of both ranks
    # A chosen set of columns, and None cells.
    one = rmmc.dist.format_table([{"rank": 0, "reserved": None}], [("rank", "r"), ("reserved", "res")])
    assert one.splitlines()[2].split() == ["0", "-"]


def test_gather_without_a_process_group_returns_this_rank():
    f = {"rank": 0, "live": 1}
    assert rmmc.dist.gather_figures(f) == [f]


def test_distributed_summary_over_gloo_with_host_stacks(tmp_path):
    pytest.importorskip("torch")
    code = """
import os, sys, datetime
import torch.distributed as td, torch.multiprocessing as mp
import rmmc, rmmc.dist

def run(rank, path):
    td.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=2,
                          timeout=datetime.timedelta(seconds=60))
    with rmmc.Resource("statistics > pool(initial=1MiB) > host") as r:
        p = r.allocate((rank + 1) * 100000)
        text = rmmc.dist.distributed_summary(r, extra={"step_ms": 1.0 + rank})
        rows = rmmc.dist.gather_figures(rmmc.dist.rank_figures(r), dst=1)
        r.deallocate(p, (rank + 1) * 100000)
    if rank == 0:
        assert rows is None
        print(text, flush=True)
    else:
        assert text is None and [x["rank"] for x in rows] == [0, 1]
        assert [x["live"] for x in rows] == [100000, 200000]
    td.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(run, args=(sys.argv[1],), nprocs=2)
"""
    script = tmp_path / "gloo_summary.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "rendezvous")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    body = [line for line in lines if re.match(r"[01] ", line)]
    assert len(body) == 2 and "97.66 KiB" in body[0] and "195.31 KiB" in body[1]
    assert lines[-1].startswith("all 2") and "292.97 KiB" in lines[-1]
