# SPDX-License-Identifier: Apache-2.0
"""The rmmc Python package on the CPU: specs, the host resource through
Resource objects, the registry, statistics scopes, reports and every error
path as an exception. Needs no GPU (host stacks only)."""
import ctypes
import os
import re
import warnings

import pytest

import rmmc
from conftest import run_python


def test_version_matches_the_library():
    assert re.fullmatch(r"\d+\.\d+\.\d+", rmmc.version())
    assert rmmc.__version__ == rmmc.version() == "0.4.0"
    assert os.path.basename(rmmc.library_path()).startswith("librmmc.so")


def test_resource_allocates_writes_and_counts():
    with rmmc.Resource("statistics > pool(initial=1MiB) > host") as r:
        assert r.name == "statistics" and r.memory_kind == "host" and r.device == -1
        p = r.allocate(5000)
        assert p % 256 == 0
        ctypes.memset(p, 0xAB, 5000)
        assert ctypes.string_at(p + 4999, 1) == b"\xab"
        f = r.figures()
        assert f["in_use"] == 5000 and f["outstanding"] == 1 and isinstance(f["in_use"], rmmc.Bytes)
        q = r.allocate(100, alignment=4096)
        assert q % 4096 == 0
        r.deallocate(q, 100, alignment=4096)
        r.deallocate(p, 5000)
        layers = r.layers()
        assert [name for name, _ in layers] == ["statistics", "pool", "host"]
        assert layers[0][1]["in_use"] == 0 and layers[0][1]["peak"] == 5100
        assert layers[1][1]["reserved"] >= 1 << 20
        assert "statistics" in r.status() and "pool" in r.status()
        r.release_cached()
        assert r.allocate(0) == 0
        r.deallocate(0, 0)
    assert "closed" in repr(r)


def test_errors_are_exceptions_with_status_and_message():
    with pytest.raises(rmmc.ParseError) as e:
        rmmc.Resource("pool > hots")
    assert e.value.status == -8 and e.value.status_name == "ERROR_PARSE"
    assert "unknown resource 'hots'" in e.value.message and "^^^^" in e.value.message
    assert isinstance(e.value, ValueError) and isinstance(e.value, rmmc.RmmcError)
    with pytest.raises(TypeError):
        rmmc.Resource(42)
    with rmmc.Resource("limiting(limit=4KiB) > host") as r:
        with pytest.raises(rmmc.OutOfMemoryError) as e:
            r.allocate(8192)
        assert isinstance(e.value, MemoryError) and e.value.status == -2
        assert "out of memory" in e.value.message and "limit 4.00 KiB" in e.value.message
        with pytest.raises(rmmc.InvalidArgumentError) as e:
            r.allocate(64, alignment=3)
        assert "alignment" in e.value.message
    with rmmc.Resource("tracking > host") as r:
        with pytest.raises(rmmc.UnknownPointerError):
            r.deallocate(0x12345600, 64)
    r = rmmc.Resource("host")
    r.close()
    r.close()  # idempotent
    with pytest.raises(rmmc.InvalidArgumentError):
        r.allocate(64)
    with pytest.raises(rmmc.ParseError):
        rmmc.validate("pool(inital=1GiB) > host")
    rmmc.validate("pool(initial=1GiB) > host")


def test_set_alloc_conf_takes_the_spec_then_the_environment_then_the_default(monkeypatch):
    monkeypatch.setenv("RMMC_ALLOC_CONF", "x")  # so that the value before comes back at the end
    monkeypatch.delenv("RMMC_ALLOC_CONF")
    assert rmmc.set_alloc_conf(None, "pool > host") == "pool > host"
    assert os.environ["RMMC_ALLOC_CONF"] == "pool > host"
    assert rmmc.set_alloc_conf(None, "host") == "pool > host"  # the environment's, kept
    assert rmmc.set_alloc_conf("statistics > host", "host") == "statistics > host"
    assert os.environ["RMMC_ALLOC_CONF"] == "statistics > host"
    monkeypatch.setenv("RMMC_ALLOC_CONF", "")
    assert rmmc.set_alloc_conf("", "arena > host") == "arena > host"  # empty counts as unset
    with pytest.raises(rmmc.ParseError) as e:
        rmmc.set_alloc_conf("pool(inital=1GiB) > host", "host")
    assert "did you mean 'initial'" in e.value.message
    assert os.environ["RMMC_ALLOC_CONF"] == "arena > host"  # left alone


def test_closing_with_live_blocks_warns():
    r = rmmc.Resource("pool > host")
    r.allocate(1000)
    with pytest.warns(ResourceWarning, match=r"closed with 1 block\(s\) \(1000 bytes\)"):
        r.close()
    r = rmmc.Resource("pool > host")
    p = r.allocate(1000)
    r.deallocate(p, 1000)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        r.close()


def test_registry_default_figures_and_report():
    installed = rmmc.set_default("statistics > pool > host", device=0)
    try:
        assert isinstance(installed, rmmc.Resource) and installed.name == "statistics"
        layers = rmmc.stack_figures(0)
        assert [n for n, _ in layers] == ["statistics", "pool", "host"]
        text = rmmc.memory_status(0)
        assert "rmmc memory status: device 0" in text and "pool" in text
        with rmmc.get_default(0) as d:
            assert d.handle == installed.handle
        rmmc.release_cached(0)
        other = rmmc.Resource("host")
        rmmc.set_default(other, device=0)
        assert rmmc.stack_figures(0)[0][0] == "host"
        other.close()
    finally:
        installed.close()
        rmmc.lib().rmmc_registry_clear()
    with pytest.raises(rmmc.InvalidArgumentError):
        rmmc.stack_figures(-3)


def test_statistics_scope_wraps_and_restores():
    pool = rmmc.set_default("pool > host", device=0)
    lib = rmmc.lib()
    try:
        with rmmc.statistics(0) as outer:
            assert rmmc.stack_figures(0)[0][0] == "statistics"  # wrapped for the block
            a = lib.rmmc_torch_alloc(4000, 0, None)
            with rmmc.statistics(0) as inner:
                b = lib.rmmc_torch_alloc(6000, 0, None)
                assert inner.get()["current_bytes"] == 6000
                lib.rmmc_torch_free(b, 6000, 0, None)
            assert inner.peak_bytes == 6000 and inner.current_bytes == 0
            assert inner.total_count == 1 and inner.deallocations == 1
            lib.rmmc_torch_free(a, 4000, 0, None)
        assert outer.peak_bytes == 10000 and outer.total_bytes == 10000
        assert outer.current_bytes == 0 and outer.total_count == 2
        assert rmmc.stack_figures(0)[0][0] == "pool"  # put back
        # A stack that has a statistics layer on top is used as it is.
        rmmc.set_default("statistics > host", device=0).close()
        with rmmc.statistics(0) as s:
            p = lib.rmmc_torch_alloc(512, 0, None)
            lib.rmmc_torch_free(p, 512, 0, None)
        assert s.total_bytes == 512
        assert rmmc.stack_figures(0)[0][1]["scopes"] == 0
        # Changing the registry inside the block is reported.
        with pytest.raises(rmmc.RmmcError, match="changed inside the statistics block"):
            with rmmc.statistics(0):
                rmmc.set_default("host", device=0).close()
    finally:
        pool.close()
        lib.rmmc_registry_clear()


def test_plugin_figures():
    rmmc.set_default("host", device=0).close()
    lib = rmmc.lib()
    try:
        lib.rmmc_plugin_reset_stats()
        p = lib.rmmc_cupy_malloc(None, 3000, 0)
        assert rmmc.plugin_stats(0)["bytes_in_use"] == 3000
        lib.rmmc_cupy_free(None, p, 0)
        lib.rmmc_cupy_free(None, p, 0)  # unknown: counted, reported
        s = rmmc.plugin_stats()
        assert s["unknown_frees"] == 1 and s["peak_bytes"] == 3000
        assert "not allocated through rmmc" in rmmc.plugin_last_error()
    finally:
        lib.rmmc_registry_clear()


def test_sizes_and_help():
    assert rmmc.parse_size("64MiB") == 64 << 20
    assert rmmc.parse_size("1.5GiB") == 3 << 29
    with pytest.raises(rmmc.ParseError):
        rmmc.parse_size("lots")
    assert re.search(r"^\s+pool\s", rmmc.stack_help(), re.M)


def test_set_default_spec_for_every_device():
    r = run_python("import rmmc\n"
                   "rmmc.set_default('statistics > pool > cuda')\n"
                   "print(rmmc.config_status())\n")
    assert r.returncode == 0, r.stderr
    assert "('SUCCESS', 'statistics > pool > cuda', '')" in r.stdout
    r = run_python("import rmmc\n"
                   "try:\n"
                   "    rmmc.set_default('expandable_segments:True')\n"
                   "except rmmc.ParseError as e:\n"
                   "    print(e.message)\n")
    assert "RMMC_ALLOC_CONF='pool > cuda'" in r.stdout, r.stdout + r.stderr


def test_broken_alloc_conf_raises_in_the_plugins():
    code = ("import rmmc, rmmc._plugin\n"
            "try:\n"
            "    rmmc._plugin.prepare(None, None)\n"
            "    print('no error')\n"
            "except rmmc.ParseError as e:\n"
            "    print('ParseError', e.status, e.message.splitlines()[0])\n"
            "print(rmmc.config_status()[0])\n")
    r = run_python(code, {"RMMC_ALLOC_CONF": "pool > hots", "RMMC_ALLOC_CONF_FALLBACK": None})
    assert r.returncode == 0, r.stderr
    assert "ParseError -8 RMMC_ALLOC_CONF is not a valid stack spec" in r.stdout, r.stdout
    assert "RMMC_ALLOC_CONF_FALLBACK=1" in r.stderr  # said once on stderr
    # Opting into the fallback: no exception, the status still says why.
    r = run_python(code, {"RMMC_ALLOC_CONF": "pool > hots", "RMMC_ALLOC_CONF_FALLBACK": "1"})
    assert r.returncode == 0 and "no error" in r.stdout and "ERROR_PARSE" in r.stdout, r.stdout
    # A spec given to use() replaces the broken environment.
    r = run_python("import rmmc, rmmc._plugin\n"
                   "rmmc._plugin.prepare('pool > cuda', None)\n"
                   "print(rmmc.config_status()[0])\n", {"RMMC_ALLOC_CONF": "pool > hots"})
    assert r.returncode == 0 and r.stdout.strip() == "SUCCESS", r.stdout + r.stderr


def test_library_override_and_missing_library(tmp_path):
    r = run_python("import rmmc\nrmmc.version()\n", {"RMMC_LIB": str(tmp_path / "nope.so")})
    assert r.returncode != 0 and "RMMC_LIB=" in r.stderr and "no such library" in r.stderr


def test_rmmc_errors_survive_pickling():
    # What a Dask worker's failed task sends back to the client.
    import pickle
    e = rmmc.OutOfMemoryError(-2, "out of memory: limiting ...", "allocate(5)")
    f = pickle.loads(pickle.dumps(e))
    assert type(f) is rmmc.OutOfMemoryError and isinstance(f, MemoryError)
    assert (f.status, f.status_name, f.message, f.what, str(f)) == \
        (-2, "ERROR_OUT_OF_MEMORY", "out of memory: limiting ...", "allocate(5)", str(e))
    g = pickle.loads(pickle.dumps(rmmc.ParseError(-8, "bad spec")))
    assert type(g) is rmmc.ParseError and g.what is None and str(g) == "ERROR_PARSE: bad spec"
