# SPDX-License-Identifier: Apache-2.0
"""ctypes bindings for the parts of librmmc the Python examples use.

Finds librmmc.so (a path given, $RMMC_LIB, or the build directories next
to this file), declares the C signatures once, and wraps what the examples
need: the PyTorch and CuPy plug-ins (installed with every hook rmmc offers),
the plug-ins' figures, every layer's figures of a device's stack, memory
hooks on a device's stack, the RMMC_ALLOC_CONF status and the last error.

Run it alone to check the bindings against a library on any machine (no
GPU needed: the self-test sets a host resource in the registry):

    python3 examples/rmmc_ctypes.py --self-test [path/to/librmmc.so]
"""

import ctypes
import glob
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

STATUS_NAMES = {
    0: "SUCCESS", -1: "ERROR_INVALID_ARGUMENT", -2: "ERROR_OUT_OF_MEMORY", -3: "ERROR_CUDA",
    -4: "ERROR_UNKNOWN_POINTER", -5: "ERROR_NOT_SUPPORTED", -6: "ERROR_NO_DEVICE",
    -7: "ERROR_INCOMPATIBLE", -8: "ERROR_PARSE", -9: "ERROR_IO", -10: "ERROR_IN_USE",
    -11: "ERROR_INTERNAL", -12: "ERROR_STALE",
}

FIELD_BYTES, FIELD_COUNT, FIELD_TEXT = 1, 2, 3


class Field(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("kind", ctypes.c_int),
                ("value", ctypes.c_uint64), ("text", ctypes.c_char_p)]


FIELD_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(Field))


class PluginStats(ctypes.Structure):
    """rmmc_plugin_stats_t (include/rmmc/plugins.h)."""
    _fields_ = [("size", ctypes.c_size_t)] + [(name, ctypes.c_uint64) for name in (
        "allocations", "allocation_failures", "deallocations", "deallocation_failures",
        "unknown_frees", "recorded_streams", "live_blocks", "bytes_in_use", "peak_bytes",
        "limit")]


# Memory hooks (include/rmmc/resource.h): on_acquire/on_release(ptr, bytes, user).
MEMORY_HOOK = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)


class MemoryHooks(ctypes.Structure):
    """rmmc_memory_hooks_t."""
    _fields_ = [("size", ctypes.c_size_t), ("on_acquire", MEMORY_HOOK),
                ("on_release", MEMORY_HOOK), ("user", ctypes.c_void_p)]


class RmmcError(RuntimeError):
    pass


class Bytes(int):
    """A figure that counts bytes (RMMC_FIELD_BYTES)."""


def find_library(path=None):
    """The path of librmmc.so: `path`, $RMMC_LIB, a build directory, or,
    installed as <prefix>/share/rmmc/rmmc_ctypes.py, <prefix>'s libdir."""
    candidates = [path, os.environ.get("RMMC_LIB")]
    root = os.path.dirname(HERE)
    for build in ("build", "build-release", "builddir", "build-asan"):
        candidates.append(os.path.join(root, build, "librmmc.so"))
    prefix = os.path.dirname(root)
    for pattern in ("lib*/librmmc.so", "lib*/*/librmmc.so"):
        candidates.extend(sorted(glob.glob(os.path.join(prefix, pattern))))
    for c in candidates:
        if c and os.path.isdir(c):
            c = os.path.join(c, "librmmc.so")
        if c and os.path.exists(c):
            return os.path.abspath(c)
    raise RmmcError("librmmc.so not found: pass its path (--lib) or set RMMC_LIB "
                    "(tried: %s)" % ", ".join(c for c in candidates if c))


class Rmmc:
    """librmmc loaded with ctypes."""

    def __init__(self, path=None):
        self.path = find_library(path)
        self.lib = lib = ctypes.CDLL(self.path)
        vp, sz, i, st = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int
        sigs = {
            "rmmc_torch_alloc": (vp, [sz, i, vp]),
            "rmmc_torch_free": (None, [vp, sz, i, vp]),
            "rmmc_torch_init": (None, [i]),
            "rmmc_torch_empty_cache": (None, []),
            "rmmc_torch_set_memory_fraction": (None, [ctypes.c_double, i]),
            "rmmc_torch_record_stream": (None, [vp, vp]),
            "rmmc_cupy_malloc": (vp, [vp, sz, i]),
            "rmmc_cupy_free": (None, [vp, vp, i]),
            "rmmc_plugin_get_stats": (st, [i, ctypes.POINTER(PluginStats)]),
            "rmmc_plugin_set_limit": (st, [i, sz]),
            "rmmc_plugin_release_cached": (st, []),
            "rmmc_plugin_last_error": (sz, [ctypes.c_char_p, sz]),
            "rmmc_plugin_reset_stats": (None, []),
            "rmmc_default_config_status": (st, [ctypes.POINTER(ctypes.c_char_p),
                                                ctypes.POINTER(ctypes.c_char_p)]),
            "rmmc_stack_validate": (st, [ctypes.c_char_p]),
            "rmmc_stack_create": (st, [ctypes.c_char_p, i, ctypes.POINTER(vp)]),
            "rmmc_stack_help": (sz, [ctypes.c_char_p, sz]),
            "rmmc_last_error_message": (ctypes.c_char_p, []),
            "rmmc_device_count": (i, []),
            "rmmc_get_device_resource": (st, [i, ctypes.POINTER(vp)]),
            "rmmc_set_device_resource": (st, [i, vp, ctypes.POINTER(vp)]),
            "rmmc_registry_clear": (None, []),
            "rmmc_host_resource_create": (st, [ctypes.POINTER(vp)]),
            "rmmc_resource_release": (None, [vp]),
            "rmmc_resource_name": (ctypes.c_char_p, [vp]),
            "rmmc_resource_upstream": (vp, [vp]),
            "rmmc_resource_describe": (None, [vp, FIELD_CB, vp]),
            "rmmc_plugin_set_memory_hooks": (st, [i, ctypes.POINTER(MemoryHooks)]),
            "rmmc_torch_base_alloc": (vp, [vp, ctypes.POINTER(sz)]),
        }
        self._hooks = {}
        for name, (res, args) in sigs.items():
            fn = getattr(lib, name)
            fn.restype = res
            fn.argtypes = args

    def set_memory_hooks(self, device, on_acquire=None, on_release=None):
        """Calls on_acquire(ptr, nbytes) for each range the device's stack
        takes from the system (those held now too) and on_release(ptr,
        nbytes) before it gives one back: NCCL/RDMA/cuFile registration
        following the pool the plug-ins allocate from. None, None removes
        them. They run under the pool's lock on the thread that grows it."""
        hooks = None
        if on_acquire is not None or on_release is not None:
            hooks = MemoryHooks()
            hooks.size = ctypes.sizeof(MemoryHooks)
            if on_acquire is not None:
                hooks.on_acquire = MEMORY_HOOK(lambda p, n, _u: on_acquire(p, n))
            if on_release is not None:
                hooks.on_release = MEMORY_HOOK(lambda p, n, _u: on_release(p, n))
        self._check(self.lib.rmmc_plugin_set_memory_hooks(device, hooks), "set_memory_hooks")
        self._hooks[device] = hooks  # rmmc keeps calling them: keep them alive

    # ---- addresses for the frameworks ----

    def address(self, name):
        """The address of an exported function, as the frameworks want it."""
        return ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value

    def torch_allocator(self, fraction=None):
        """Builds PyTorch's CUDAPluggableAllocator over rmmc with every hook
        rmmc provides and makes it current. Call before any CUDA use."""
        import torch
        if os.environ.get("RMMC_TORCH_BACKEND", "").strip().lower() == "native":
            # rmmc's native PyTorch backend (the rmmc package, python/ on
            # PYTHONPATH), over this same library.
            os.environ["RMMC_LIB"] = self.path
            import rmmc.torch
            self._native = rmmc.torch.use(backend="native", fraction=fraction)
            return self._native
        alloc = torch.cuda.memory.CUDAPluggableAllocator(
            self.path, "rmmc_torch_alloc", "rmmc_torch_free")
        hooks = alloc.allocator()
        for setter, fn in (("set_init_fn", "rmmc_torch_init"),
                           ("set_reset_fn", "rmmc_torch_empty_cache"),
                           ("set_memory_fraction_fn", "rmmc_torch_set_memory_fraction"),
                           ("set_record_stream_fn", "rmmc_torch_record_stream"),
                           ("set_begin_allocate_to_pool", "rmmc_torch_begin_allocate_to_pool"),
                           ("set_end_allocate_to_pool_fn", "rmmc_torch_end_allocate_to_pool"),
                           ("set_release_pool", "rmmc_torch_release_pool"),
                           ("set_base_alloc_fn", "rmmc_torch_base_alloc")):
            if hasattr(hooks, setter):  # older PyTorch versions lack some
                getattr(hooks, setter)(self.address(fn))
        torch.cuda.memory.change_current_allocator(alloc)
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction)
        return alloc

    def cupy_allocator(self, stream=0):
        """A CuPy allocator function over rmmc (for cupy.cuda.set_allocator)
        that raises CuPy's OutOfMemoryError with rmmc's message on failure
        (CFunctionAllocator itself would hand out a NULL pointer)."""
        import cupy
        c_alloc = cupy.cuda.memory.CFunctionAllocator(
            stream, self.address("rmmc_cupy_malloc"), self.address("rmmc_cupy_free"), self.lib)

        def malloc(size):
            mp = c_alloc.malloc(size)
            if size and not mp.ptr:
                raise MemoryError("rmmc could not allocate %d bytes: %s"
                                  % (size, self.last_error()))
            return mp
        return malloc

    # ---- figures ----

    def plugin_stats(self, device=-1):
        if getattr(self, "_native", None) is not None:
            # The native backend keeps PyTorch's own figures: the same keys.
            import torch
            m = torch.cuda.memory_stats(None if device < 0 else device)
            return {"allocations": m.get("allocation.all.allocated", 0),
                    "allocation_failures": m.get("num_ooms", 0),
                    "deallocations": m.get("allocation.all.freed", 0),
                    "deallocation_failures": 0, "unknown_frees": 0, "recorded_streams": 0,
                    "live_blocks": m.get("allocation.all.current", 0),
                    "bytes_in_use": m.get("requested_bytes.all.current", 0),
                    "peak_bytes": m.get("requested_bytes.all.peak", 0), "limit": 0}
        s = PluginStats()
        s.size = ctypes.sizeof(PluginStats)
        self._check(self.lib.rmmc_plugin_get_stats(device, ctypes.byref(s)), "plugin_get_stats")
        return {name: getattr(s, name) for name, _ in PluginStats._fields_ if name != "size"}

    def describe(self, resource):
        """A resource's own figures as a dict."""
        out = {}

        def emit(_ctx, field):
            f = field.contents
            key = f.key.decode()
            if f.kind == FIELD_TEXT:
                out[key] = f.text.decode() if f.text else ""
            else:
                out[key] = Bytes(f.value) if f.kind == FIELD_BYTES else int(f.value)
        cb = FIELD_CB(emit)
        self.lib.rmmc_resource_describe(resource, cb, None)
        return out

    def stack_figures(self, device=0):
        """[(layer name, figures)] of device's registry resource, outermost
        first. Builds the device's default if none exists yet."""
        r = ctypes.c_void_p()
        self._check(self.lib.rmmc_get_device_resource(device, ctypes.byref(r)),
                    "get_device_resource")
        layers = []
        p = r.value
        while p:
            layers.append((self.lib.rmmc_resource_name(p).decode(), self.describe(p)))
            p = self.lib.rmmc_resource_upstream(p)
        return layers

    def config_status(self):
        """(status name, spec chosen, message) of RMMC_ALLOC_CONF."""
        spec, msg = ctypes.c_char_p(), ctypes.c_char_p()
        st = self.lib.rmmc_default_config_status(ctypes.byref(spec), ctypes.byref(msg))
        return STATUS_NAMES.get(st, str(st)), spec.value.decode(), msg.value.decode()

    def validate(self, spec):
        """None if `spec` parses, else the parser's message."""
        st = self.lib.rmmc_stack_validate(spec.encode())
        return None if st == 0 else self.lib.rmmc_last_error_message().decode()

    def stack_help(self):
        n = self.lib.rmmc_stack_help(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.rmmc_stack_help(buf, n + 1)
        return buf.value.decode()

    def last_error(self):
        """The last plug-in failure on any thread."""
        n = self.lib.rmmc_plugin_last_error(None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self.lib.rmmc_plugin_last_error(buf, n + 1)
        return buf.value.decode()

    def _check(self, status, what):
        if status != 0:
            raise RmmcError("%s: %s: %s" % (what, STATUS_NAMES.get(status, status),
                                            self.lib.rmmc_last_error_message().decode()))


def open_checked(lib, spec):
    """Loads librmmc (lib: a path or None to search) and checks `spec`.
    Returns (Rmmc, None), or (None, message) saying what stopped it: the
    library not loading, or the spec not parsing (with the resources this
    library knows). For scripts that must fail before spending GPU time."""
    try:
        rm = Rmmc(lib)
    except (RmmcError, OSError) as e:
        return None, str(e)
    problem = rm.validate(spec)
    if problem:
        return None, ("spec %r does not parse:\n%s\nresources this librmmc knows:\n%s"
                      % (spec, problem, rm.stack_help()))
    return rm, None


def format_figures(layers):
    """One line per layer: 'statistics: peak=1.5 GiB, ...'."""
    def fmt(key, v):
        if isinstance(v, Bytes):
            return "%s=%.1f MiB" % (key, v / 2**20)
        return "%s=%s" % (key, v)
    return "\n".join("  %-12s %s" % (name + ":", ", ".join(fmt(k, v) for k, v in figs.items())
                                    or "(no figures)") for name, figs in layers)


def _self_test(path):
    """Checks the bindings over a host resource: no GPU needed."""
    rm = Rmmc(path)
    host = ctypes.c_void_p()
    rm._check(rm.lib.rmmc_host_resource_create(ctypes.byref(host)), "host_resource_create")
    rm._check(rm.lib.rmmc_set_device_resource(0, host, None), "set_device_resource")
    rm.lib.rmmc_plugin_reset_stats()
    a = rm.lib.rmmc_cupy_malloc(None, 1000, 0)
    b = rm.lib.rmmc_torch_alloc(5000, 0, None)
    assert a and b, rm.last_error()
    ctypes.memset(a, 7, 1000)
    s = rm.plugin_stats(0)
    assert s["allocations"] == 2 and s["bytes_in_use"] == 6000 and s["live_blocks"] == 2, s
    rm.lib.rmmc_cupy_free(None, a, 0)
    rm.lib.rmmc_torch_free(b, 5000, 0, None)
    rm.lib.rmmc_cupy_free(None, a, 0)  # double free: counted, not fatal
    s = rm.plugin_stats(-1)
    assert s["deallocations"] == 2 and s["unknown_frees"] == 1 and s["peak_bytes"] == 6000, s
    assert "not allocated through rmmc" in rm.last_error(), rm.last_error()
    layers = rm.stack_figures(0)
    assert layers and layers[0][0] == "host", layers
    assert format_figures(layers).strip().startswith("host:"), format_figures(layers)
    assert rm.validate("host") is None and "unknown resource" in rm.validate("hots > host")
    assert "host" in rm.stack_help()
    status, spec, _ = rm.config_status()
    assert status in STATUS_NAMES.values() and spec, (status, spec)
    rm.lib.rmmc_registry_clear()
    rm.lib.rmmc_resource_release(host)
    # Memory hooks through the plug-ins: the ranges a host pool takes.
    pool = ctypes.c_void_p()
    rm._check(rm.lib.rmmc_stack_create(b"pool(expandable=false) > host", -1, ctypes.byref(pool)),
              "stack_create")
    rm._check(rm.lib.rmmc_set_device_resource(0, pool, None), "set_device_resource")
    held = {}
    rm.set_memory_hooks(0, lambda p, n: held.__setitem__(p, n), lambda p, n: held.pop(p))
    c = rm.lib.rmmc_torch_alloc(50 << 20, 0, None)
    assert c and sum(held.values()) >= 50 << 20, held
    size = ctypes.c_size_t()
    assert rm.lib.rmmc_torch_base_alloc(c, ctypes.byref(size)) == c and size.value == 50 << 20
    rm.lib.rmmc_torch_free(c, 50 << 20, 0, None)
    rm.lib.rmmc_registry_clear()
    rm.lib.rmmc_resource_release(pool)  # gives every chunk back
    assert held == {}, held
    print("rmmc_ctypes self-test passed (%s)" % rm.path)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--self-test":
        _self_test(sys.argv[2] if len(sys.argv) > 2 else None)
    else:
        print(__doc__)
