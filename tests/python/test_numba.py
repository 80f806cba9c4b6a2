# SPDX-License-Identifier: Apache-2.0
"""rmmc.numba, Numba's EMM plugin, on a host stack. With numba-cuda
installed (and no GPU) it runs against Numba's own classes; without it,
against a stand-in of the four names the plugin uses from Numba
(HostOnlyCUDAMemoryManager, MemoryPointer, IpcHandle, device_extents)
with Numba's signatures, so what is tested is the plugin's own logic:
blocks from the registry's stack, freed by the finalizer Numba calls,
nothing freed twice after a context reset, and an IPC handle refused in
one sentence when CUDA cannot share the block. scripts/gpu-rapids runs it
under Numba on a GPU (NUMBA_CUDA_MEMORY_MANAGER=rmmc.numba)."""
import ctypes
import sys
import types

import pytest

import rmmc
from rmmc._lib import lib


def _stand_in_numba():
    """A minimal numba / numba.cuda with the EMM plugin interface's names."""
    numba = types.ModuleType("numba")
    cuda = types.ModuleType("numba.cuda")

    class HostOnlyCUDAMemoryManager:
        def __init__(self, context):
            self.context = context
            self.allocations = {}

    class MemoryPointer:
        def __init__(self, context, pointer, size, owner=None, finalizer=None):
            self.context, self.handle, self.size = context, pointer, size
            self._finalizer = finalizer

        def free(self):
            self._finalizer()

    class IpcHandle:
        def __init__(self, base, handle, size, source_info=None, offset=0):
            self.base, self.handle, self.size, self.offset = base, handle, size, offset

    cuda.HostOnlyCUDAMemoryManager = HostOnlyCUDAMemoryManager
    cuda.MemoryPointer = MemoryPointer
    cuda.IpcHandle = IpcHandle
    cuda.cudadrv = types.SimpleNamespace(driver=types.SimpleNamespace(
        device_extents=lambda m: (int(m.handle) - 512, int(m.handle) + m.size)))
    numba.cuda = cuda
    return numba, cuda


@pytest.fixture
def plugin(monkeypatch):
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        numba, cuda = _stand_in_numba()
        monkeypatch.setitem(sys.modules, "numba", numba)
        monkeypatch.setitem(sys.modules, "numba.cuda", cuda)
        drv = types.ModuleType("cuda.bindings.driver")
        drv.CUdeviceptr = int
        drv.CUresult = types.SimpleNamespace(CUDA_SUCCESS=0)
        drv.cuIpcGetMemHandle = lambda start: (201, None)  # CUDA_ERROR_INVALID_CONTEXT
        pkg = types.ModuleType("cuda")
        bindings = types.ModuleType("cuda.bindings")
        bindings.driver = drv
        pkg.bindings = bindings
        for name, mod in (("cuda", pkg), ("cuda.bindings", bindings),
                          ("cuda.bindings.driver", drv)):
            monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.delitem(sys.modules, "rmmc.numba", raising=False)
    import rmmc.numba
    lib().rmmc_registry_clear()
    rmmc.set_default("statistics > pool(initial=1MiB) > host", device=0)
    yield rmmc.numba
    lib().rmmc_registry_clear()


def in_use():
    return int(rmmc.get_default(0).figures()["in_use"])


def test_memalloc_serves_numba_from_the_registry_stack(plugin):
    mgr = plugin.RmmcNumbaManager(context="ctx")
    assert mgr.interface_version == 1
    assert plugin._numba_memory_manager is plugin.RmmcNumbaManager
    m = mgr.memalloc(4096)
    assert m.size == 4096 and m.context == "ctx"
    ptr = int(m.handle)
    ctypes.memset(ptr, 9, 4096)  # host stack: the block is real memory
    assert ctypes.string_at(ptr + 4095, 1) == b"\x09"
    assert in_use() == 4096 and ptr in mgr.allocations
    m2 = mgr.memalloc(100)
    assert in_use() == 4096 + 100
    m.free()
    assert in_use() == 100 and ptr not in mgr.allocations
    # A context reset clears the allocations; a late finalizer frees nothing.
    mgr.allocations.clear()
    m2.free()


def test_out_of_memory_is_rmmcs_memoryerror(plugin):
    lib().rmmc_registry_clear()
    rmmc.set_default("limiting(limit=64KiB) > host", device=0)
    mgr = plugin.RmmcNumbaManager(context=None)
    with pytest.raises(MemoryError, match="limiting"):
        mgr.memalloc(1 << 20)
    assert mgr.allocations == {}


def test_ipc_refused_in_one_sentence_where_cuda_cannot_share(plugin):
    if "numba" in sys.modules and hasattr(sys.modules["numba"], "__version__"):
        pytest.skip("with Numba installed the IPC path needs a GPU (scripts/gpu-rapids)")
    mgr = plugin.RmmcNumbaManager(context=None)
    m = mgr.memalloc(1000)
    with pytest.raises(rmmc.NotSupportedError, match=r"pool\(expandable=false\) > cuda"):
        mgr.get_ipc_handle(m)
    m.free()
    assert in_use() == 0
