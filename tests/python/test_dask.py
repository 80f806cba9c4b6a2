# SPDX-License-Identifier: Apache-2.0
"""rmmc.dask on the CPU: dask-cuda's options as specs, and a real
dask.distributed cluster of two worker processes (rmmc.dask.gpu_cluster,
one per "device") each given its own host stack by the plugin: a pipeline
over dask.array whose blocks go through each worker's rmmc stack equals the
NumPy reference, per-worker figures in one call, dask-cuda's logging and
tracking options, and a worker capped by `limiting` whose task fails with
rmmc's out-of-memory message while the cluster keeps serving. Skipped
without dask.distributed (scripts/check-python installs it)."""
import ctypes
import glob
import importlib.util
import os
import re

import pytest

pytest.importorskip("distributed")
np = pytest.importorskip("numpy")
da = pytest.importorskip("dask.array")
from distributed import Client  # noqa: E402

import rmmc  # noqa: E402
import rmmc.dask  # noqa: E402

MiB = 1 << 20


def test_spec_from_dask_cuda_options_with_dask_cudas_meaning():
    f = rmmc.dask.spec_from_options
    assert f() == "cuda"
    # Sizes through dask's parse_bytes, aligned down to 256 as dask-cuda does.
    assert f(rmm_pool_size="1GiB") == "pool(initial=1073741824) > cuda"
    assert f(rmm_pool_size="5000M") == "pool(initial=5000000000) > cuda"
    assert f(rmm_pool_size="1GB", rmm_maximum_pool_size="2GB") == \
        "pool(initial=1000000000, maximum_size=2000000000) > cuda"
    assert f(rmm_pool_size=1000) == "pool(initial=768) > cuda"
    # A float in (0, 1] is a fraction of the device's TOTAL memory.
    total = 80 * 2 ** 30
    assert f(rmm_pool_size=0.5, total_memory=total) == "pool(initial=%d) > cuda" % (total // 2)
    assert f(rmm_pool_size="0.25", rmm_maximum_pool_size=1.0, total_memory=total) == \
        "pool(initial=%d, maximum_size=%d) > cuda" % (total // 4, total)
    assert f(rmm_pool_size=1, total_memory=total) == "pool(initial=0) > cuda"  # int 1: one byte
    # 0 and None are unset; a maximum without a pool is ignored, as dask-cuda ignores it.
    assert f(rmm_pool_size=0, rmm_maximum_pool_size="2GiB") == "cuda"
    assert f(rmm_maximum_pool_size="2GiB") == "cuda"
    assert f(rmm_managed_memory=True, rmm_maximum_pool_size="2GiB") == "managed"
    assert f(rmm_pool_size="2GiB", rmm_managed_memory=True) == "pool(initial=2147483648) > managed"
    assert f(rmm_async=True) == "cuda_async"
    assert f(rmm_async=True, rmm_release_threshold="4GiB", rmm_maximum_pool_size="8GiB") == \
        "limiting(limit=8589934592) > cuda_async(release_threshold=4294967296)"
    assert f(rmm_track_allocations=True, rmm_pool_size="1MiB", base="host") == \
        "tracking > pool(initial=1048576) > host"
    # dask-cuda's log names: rmm_log_<worker name's last part>.dev<device>.txt,
    # logging only where dask-cuda sets RMM up (a pool, managed memory, async).
    assert f(rmm_log_directory="/tmp/logs", worker_name="tcp://10.0.0.1:4000/w3",
             rmm_pool_size="1MiB", rmm_track_allocations=True) == \
        'tracking > logging(path="/tmp/logs/rmm_log_w3.dev0.txt") > pool(initial=1048576) > cuda'
    assert f(rmm_log_directory="/tmp/logs", worker_name=2, device=1, rmm_managed_memory=True) == \
        'logging(path="/tmp/logs/rmm_log_2.dev1.txt") > managed'
    assert f(rmm_log_directory="/tmp/logs", worker_name=2) == "cuda"
    assert f(rmm_allocator_external_lib_list="torch, cupy") == "cuda"
    for spec in (f(rmm_pool_size="1GiB", rmm_maximum_pool_size="2GiB", rmm_track_allocations=True,
                   rmm_log_directory="/tmp/x", worker_name=3),
                 f(rmm_async=True, rmm_release_threshold="2GiB"),
                 f(rmm_pool_size=0.1, rmm_managed_memory=True, total_memory=total)):
        rmmc.validate(spec)  # every spec the mapping writes parses


def test_options_dask_cuda_refuses_and_warns_about():
    f = rmmc.dask.spec_from_options
    with pytest.raises(ValueError, match="`rmm_release_threshold` requires `rmm_async`"):
        f(rmm_pool_size="1GiB", rmm_release_threshold="1GiB")
    with pytest.raises(ValueError, match="`rmm_managed_memory` is incompatible with the `rmm_async`"):
        f(rmm_async=True, rmm_managed_memory=True)
    with pytest.warns(FutureWarning, match="'rmm_pool_size' is not needed when 'rmm_async'"):
        assert f(rmm_async=True, rmm_pool_size="1GiB") == "cuda_async(initial=1073741824)"
    with pytest.raises(ValueError, match="Could not interpret"):
        f(rmm_pool_size="80%")  # dask's parse_bytes has no percentages
    with pytest.raises(ValueError, match="Could not interpret 'zz' as a byte unit"):
        f(rmm_pool_size="1zz")
    with pytest.raises(ValueError):
        f(rmm_pool_size=-1024)
    with pytest.raises(TypeError):
        f(rmm_pool_size=[1])
    with pytest.raises(ValueError, match="The library 'jax' is not supported"):
        f(rmm_allocator_external_lib_list=["jax"])
    with pytest.raises(ValueError, match="comma-separated string or a list"):
        f(rmm_allocator_external_lib_list=("cupy",))
    with pytest.raises(ValueError, match="spec or dask-cuda's options"):
        rmmc.dask.RmmcPlugin("pool > host", rmm_pool_size="1GiB")
    with pytest.raises(ValueError):  # refused where it is made, not on every worker
        rmmc.dask.RmmcPlugin(rmm_release_threshold="1GiB")
    p = rmmc.dask.RmmcPlugin(rmm_pool_size=0.5)  # a fraction: resolved on each worker
    assert p.options == {"rmm_pool_size": 0.5}
    p = rmmc.dask.RmmcPlugin(rmm_allocator_external_lib_list="cupy")
    assert (p.cupy, p.torch) == (True, False)  # the listed frameworks, and only those
    p = rmmc.dask.RmmcPlugin("pool > host", per_worker={"1": "limiting(limit=1MiB) > host"})
    assert p.worker_spec(1) == p.worker_spec("1") == "limiting(limit=1MiB) > host"
    assert p.worker_spec("0") == "pool > host"


def _through_rmmc(block):
    """A block copied into memory from this worker's registry stack and read
    back: the data goes through rmmc, and the result is the block's."""
    r = rmmc.get_default(0)
    n = block.nbytes
    p = r.allocate(n)
    try:
        ctypes.memmove(p, block.ctypes.data, n)
        out = np.empty_like(block)
        ctypes.memmove(out.ctypes.data, p, n)
    finally:
        r.deallocate(p, n)
    return out * 3 + 1


def _allocate_through_rmmc(nbytes):
    r = rmmc.get_default(0)
    p = r.allocate(nbytes)
    r.deallocate(p, nbytes)
    return nbytes


HAVE_RMM = importlib.util.find_spec("rmm") is not None


def _rmm_resource_is_rmmcs():
    import rmm
    with rmmc.get_default(0) as r:
        return rmm.mr.get_per_device_resource(0).handle == r.handle


@pytest.fixture(scope="module")
def client():
    cluster = rmmc.dask.gpu_cluster(devices=[0, 1])
    c = Client(cluster)
    c.wait_for_workers(2, timeout=120)
    yield c
    c.close()
    cluster.close()


def _addresses(client):
    return {str(w["name"]): a for a, w in client.scheduler_info()["workers"].items()}


def test_two_workers_each_see_their_own_device(client):
    by_name = _addresses(client)
    assert sorted(by_name) == ["0", "1"]
    seen = client.run(lambda: os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert sorted(seen[by_name[n]] for n in by_name) == ["0", "1"]


def test_pipeline_through_each_workers_stack_equals_numpy(client):
    rmmc.dask.install(client, "statistics > pool(initial=1MiB) > host", cupy=False, torch=False)
    rng = np.random.default_rng(7)
    x = rng.integers(0, 1000, size=(400, 300)).astype(np.int64)
    dx = da.from_array(x, chunks=(50, 300))
    y = dx.map_blocks(_through_rmmc, dtype=np.int64)
    result = (y.T @ y).sum(axis=0) + y.max(axis=1).sum()
    expected = ((x * 3 + 1).T @ (x * 3 + 1)).sum(axis=0) + (x * 3 + 1).max(axis=1).sum()
    np.testing.assert_array_equal(result.compute(), expected)
    figures = rmmc.dask.collect_figures(client)
    assert len(figures) == 2
    for f in figures.values():
        assert f["stack"] == "statistics > pool > host" and f["live"] == 0
        assert f["spec"] == "statistics > pool(initial=1MiB) > host"
        assert f["routed"] == ("rmm" if HAVE_RMM else "-")
        assert f["reserved"] >= MiB
    # Both workers took blocks (8 of them, spread by the scheduler), each
    # through its own stack: a block is 50 x 300 x 8 bytes.
    assert sum(f["peak_live"] > 0 for f in figures.values()) == 2
    assert max(f["peak_live"] for f in figures.values()) >= 50 * 300 * 8
    if HAVE_RMM:  # RMM's current resource on each worker is the worker's rmmc stack
        assert all(client.run(_rmm_resource_is_rmmcs).values())
    table = rmmc.dask.figures_table(client)
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["worker", "gpu", "stack"]
    assert [line.split()[0] for line in lines[2:4]] == ["0", "1"]
    assert lines[-1].startswith("all 2")


def test_dask_cuda_options_log_and_track_per_worker(client, tmp_path):
    logs = str(tmp_path / "logs")
    rmmc.dask.install(client, rmm_pool_size="1MiB", rmm_log_directory=logs,
                      rmm_track_allocations=True, base="host", cupy=False, torch=False)
    by_name = _addresses(client)
    for name, addr in by_name.items():
        assert client.submit(_allocate_through_rmmc, 3000 + int(name), workers=[addr],
                             pure=False).result() == 3000 + int(name)
    figures = rmmc.dask.collect_figures(client)
    for f in figures.values():
        assert f["stack"] == "tracking > logging > pool > host"
    rmmc.dask.install(client, "pool > host", cupy=False, torch=False)  # replaces: closes the logs
    files = sorted(glob.glob(os.path.join(logs, "rmm_log_*")))
    assert [os.path.basename(p) for p in files] == ["rmm_log_0.dev0.txt", "rmm_log_1.dev0.txt"]
    for name, path in zip(("0", "1"), files):
        text = open(path).read()
        # RMM's CSV, one file per worker, with that worker's request
        assert text.startswith("Thread,Time,Action,Pointer,Size,Stream")
        assert re.search(r",allocate,0x[0-9a-f]+,%d," % (3000 + int(name)), text), text


def test_capped_worker_fails_its_task_with_rmmcs_message_and_the_cluster_serves(client):
    rmmc.dask.install(client, "statistics > pool(initial=1MiB) > host", cupy=False, torch=False,
                      per_worker={"1": "limiting(limit=1MiB) > pool > host"})
    by_name = _addresses(client)
    big = client.submit(_allocate_through_rmmc, 4 * MiB, workers=[by_name["1"]], pure=False)
    with pytest.raises(rmmc.OutOfMemoryError) as e:
        big.result(timeout=60)
    assert e.value.status == -2 and isinstance(e.value, MemoryError)
    assert "out of memory" in e.value.message and "limit 1.00 MiB" in e.value.message
    # The same request on the other worker, and a small one on the capped
    # worker, still succeed: the cluster keeps serving.
    assert client.submit(_allocate_through_rmmc, 4 * MiB, workers=[by_name["0"]],
                         pure=False).result(timeout=60) == 4 * MiB
    assert client.submit(_allocate_through_rmmc, 1000, workers=[by_name["1"]],
                         pure=False).result(timeout=60) == 1000
    f = rmmc.dask.collect_figures(client)
    assert f[by_name["1"]]["stack"] == "limiting > pool > host"
    assert f[by_name["0"]]["stack"] == "statistics > pool > host"


def test_figures_without_the_plugin_say_so():
    with pytest.raises(RuntimeError, match="install the plugin"):
        rmmc.dask._WORKER.clear() or rmmc.dask.worker_figures()
