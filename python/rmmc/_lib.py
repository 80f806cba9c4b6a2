# SPDX-License-Identifier: Apache-2.0
"""Loading librmmc with ctypes, the C signatures, and status -> exception.

The package ships librmmc.so beside this file (pip install . builds it);
$RMMC_LIB names another one (a development build) instead.

SIGNATURES is the one table of C signatures the package calls through
ctypes: librmmc's, and those of the two libraries the package compiles at
the user's site (the native PyTorch backend, rmmc/_torch_native.cpp, and
the RMM bridge, rmmc/_rmm_bridge.cpp); declare() sets them on a loaded
library. Every struct here is held against its C header by
tests/python/test_struct_layout.py.
"""
import ctypes
import os
import threading

from ._runtime import load as _load

_HERE = os.path.dirname(os.path.abspath(__file__))

# rmmc_status_t (include/rmmc/status.h): values are stable.
STATUS_NAMES = {
    0: "SUCCESS", -1: "ERROR_INVALID_ARGUMENT", -2: "ERROR_OUT_OF_MEMORY", -3: "ERROR_CUDA",
    -4: "ERROR_UNKNOWN_POINTER", -5: "ERROR_NOT_SUPPORTED", -6: "ERROR_NO_DEVICE",
    -7: "ERROR_INCOMPATIBLE", -8: "ERROR_PARSE", -9: "ERROR_IO", -10: "ERROR_IN_USE",
    -11: "ERROR_INTERNAL", -12: "ERROR_STALE",
}

FIELD_BYTES, FIELD_COUNT, FIELD_TEXT = 1, 2, 3


class RmmcError(RuntimeError):
    """An rmmc call failed. `status` is the rmmc_status_t (an int),
    `status_name` its name ("ERROR_PARSE"), `message` rmmc's sentence."""

    def __init__(self, status, message, what=None):
        self.status = status
        self.status_name = STATUS_NAMES.get(status, "UNKNOWN_STATUS")
        self.message = message
        self.what = what
        text = "%s: %s" % (self.status_name, message)
        super().__init__("%s: %s" % (what, text) if what else text)

    def __reduce__(self):
        # Pickled whole (Dask and multiprocessing send a worker's error back).
        return (type(self), (self.status, self.message, self.what))


class OutOfMemoryError(RmmcError, MemoryError):
    """RMMC_ERROR_OUT_OF_MEMORY: also a MemoryError."""


class ParseError(RmmcError, ValueError):
    """RMMC_ERROR_PARSE: a stack spec or setting that does not parse."""


class InvalidArgumentError(RmmcError, ValueError):
    """RMMC_ERROR_INVALID_ARGUMENT."""


class NoDeviceError(RmmcError):
    """RMMC_ERROR_NO_DEVICE: no GPU, or none set for the device."""


class UnknownPointerError(RmmcError, ValueError):
    """RMMC_ERROR_UNKNOWN_POINTER: freeing what the resource did not hand out."""


class NotSupportedError(RmmcError):
    """RMMC_ERROR_NOT_SUPPORTED: the stack cannot do that (share host memory, say)."""


class StaleError(RmmcError):
    """RMMC_ERROR_STALE: an IPC handle whose block was freed or whose exporter exited."""


_CLASSES = {-1: InvalidArgumentError, -2: OutOfMemoryError, -4: UnknownPointerError,
            -5: NotSupportedError, -6: NoDeviceError, -8: ParseError, -12: StaleError}


def error_for(status, message, what=None):
    """The exception for a failed status."""
    return _CLASSES.get(status, RmmcError)(status, message, what)


class Field(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("kind", ctypes.c_int),
                ("value", ctypes.c_uint64), ("text", ctypes.c_char_p)]


FIELD_CB = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(Field))


class Statistics(ctypes.Structure):
    """rmmc_statistics_t (include/rmmc/statistics_adaptor.h)."""
    _fields_ = [("size", ctypes.c_size_t), ("current_bytes", ctypes.c_int64),
                ("peak_bytes", ctypes.c_int64), ("total_bytes", ctypes.c_uint64),
                ("current_count", ctypes.c_int64), ("peak_count", ctypes.c_int64),
                ("total_count", ctypes.c_uint64), ("deallocations", ctypes.c_uint64)]


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


class SleepState(ctypes.Structure):
    """rmmc_pool_sleep_state_t (include/rmmc/pool_resource.h)."""
    _fields_ = [("size", ctypes.c_size_t), ("can_sleep", ctypes.c_bool),
                ("paused", ctypes.c_bool), ("mode", ctypes.c_int), ("held", ctypes.c_size_t),
                ("unmapped", ctypes.c_size_t), ("backed_up", ctypes.c_size_t),
                ("backup_ranges", ctypes.c_size_t), ("host_bytes", ctypes.c_size_t),
                ("pauses", ctypes.c_uint64), ("resumes", ctypes.c_uint64)]


PAUSE_MODES = {"backup": 1, "discard": 2}  # rmmc_pool_pause_mode_t


IPC_HANDLE_BYTES = 4096
IPC_MAX_FDS = 976
IpcHandle = ctypes.c_ubyte * IPC_HANDLE_BYTES


class IpcInfo(ctypes.Structure):
    """rmmc_ipc_info_t (include/rmmc/ipc.h)."""
    _fields_ = [("size", ctypes.c_size_t), ("kind", ctypes.c_int), ("bytes", ctypes.c_size_t),
                ("nfds", ctypes.c_size_t), ("handle_bytes", ctypes.c_size_t),
                ("exporter_pid", ctypes.c_int), ("exporter_device", ctypes.c_int),
                ("device_uuid", ctypes.c_ubyte * 16), ("generation", ctypes.c_uint64)]


class IpcStats(ctypes.Structure):
    """rmmc_ipc_stats_t."""
    _fields_ = [("size", ctypes.c_size_t)] + [(name, ctypes.c_uint64) for name in (
        "exports", "imports", "open_bases", "opens", "unverified")]


_vp, _sz, _i, _st = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int


class Buffer(ctypes.Structure):
    """rmmc_buffer_t (include/rmmc/buffer.h)."""
    _fields_ = [("data", _vp), ("size", _sz), ("capacity", _sz), ("stream", _vp),
                ("resource", _vp), ("device", _i)]


class TrackedAllocation(ctypes.Structure):
    """rmmc_tracked_allocation_t (include/rmmc/tracking_adaptor.h)."""
    _fields_ = [("size", _sz), ("ptr", _vp), ("bytes", _sz), ("alignment", _sz),
                ("stream", _vp), ("thread", ctypes.c_uint64), ("serial", ctypes.c_uint64),
                ("frames", ctypes.POINTER(_vp)), ("nframes", _i)]


TRACKED_CB = ctypes.CFUNCTYPE(None, _vp, ctypes.POINTER(TrackedAllocation))

# Writing a resource in Python (include/rmmc/resource_ops.h): the slots
# rmmc.mr.CallbackMemoryResource fills (version 1); the later slots stay NULL.
ALLOCATE_SLOT = ctypes.CFUNCTYPE(_st, _vp, _sz, _sz, _vp, ctypes.POINTER(_vp))
DEALLOCATE_SLOT = ctypes.CFUNCTYPE(_st, _vp, _vp, _sz, _sz, _vp)
DESTROY_SLOT = ctypes.CFUNCTYPE(None, _vp)


class ResourceOps(ctypes.Structure):
    """rmmc_resource_ops_t (version 4's layout; a table of version 1 sets
    only the first slots)."""
    _fields_ = [("version", _i), ("name", ctypes.c_char_p), ("allocate", ALLOCATE_SLOT),
                ("deallocate", DEALLOCATE_SLOT), ("is_equal", _vp), ("release_cached", _vp),
                ("describe", _vp), ("destroy", DESTROY_SLOT), ("upstream", _vp),
                ("vm_page_size", _vp), ("vm_reserve", _vp), ("vm_unreserve", _vp),
                ("vm_map", _vp), ("vm_unmap", _vp), ("get_allocation", _vp),
                ("set_memory_hooks", _vp), ("enable_peer_access", _vp), ("vm_set_access", _vp)]


class ResourceBase(ctypes.Structure):
    """struct rmmc_resource, the base a resource embeds first."""
    _fields_ = [("ops", ctypes.POINTER(ResourceOps)), ("refcount", ctypes.c_long),
                ("kind", _i), ("device", _i)]


FAILURE_CB = ctypes.CFUNCTYPE(ctypes.c_bool, _sz, _vp)

# The RMM bridge's callback when the rmmc resource over an RMM object dies.
ON_DESTROY = ctypes.CFUNCTYPE(None, _vp)


def library_path():
    """The librmmc.so this package uses: $RMMC_LIB, else the one shipped in it."""
    env = os.environ.get("RMMC_LIB")
    if env:
        path = os.path.join(env, "librmmc.so") if os.path.isdir(env) else env
        if not os.path.exists(path):
            raise OSError("RMMC_LIB=%s: no such library" % env)
        return os.path.abspath(path)
    path = os.path.join(_HERE, "librmmc.so")
    if not os.path.exists(path):
        raise OSError("librmmc.so is not in the rmmc package (%s): install the package with "
                      "`pip install .` from rmmc's checkout, or set RMMC_LIB" % _HERE)
    return path


_BP = ctypes.POINTER(Buffer)
_LIBRMMC = {
    "rmmc_version": (_i, []),
    "rmmc_version_string": (ctypes.c_char_p, []),
    "rmmc_status_name": (ctypes.c_char_p, [_st]),
    "rmmc_last_error_message": (ctypes.c_char_p, []),
    "rmmc_clear_last_error": (None, []),
    "rmmc_device_count": (_i, []),
    "rmmc_get_current_device": (_st, [ctypes.POINTER(_i)]),
    "rmmc_stack_create": (_st, [ctypes.c_char_p, _i, ctypes.POINTER(_vp)]),
    "rmmc_stack_validate": (_st, [ctypes.c_char_p]),
    "rmmc_stack_help": (_sz, [ctypes.c_char_p, _sz]),
    "rmmc_parse_size": (_st, [ctypes.c_char_p, ctypes.POINTER(_sz)]),
    "rmmc_set_default_spec": (_st, [ctypes.c_char_p]),
    "rmmc_default_config_status": (_st, [ctypes.POINTER(ctypes.c_char_p),
                                         ctypes.POINTER(ctypes.c_char_p)]),
    "rmmc_get_device_resource": (_st, [_i, ctypes.POINTER(_vp)]),
    "rmmc_retain_device_resource": (_st, [_i, ctypes.POINTER(_vp)]),
    "rmmc_set_device_resource": (_st, [_i, _vp, ctypes.POINTER(_vp)]),
    "rmmc_registry_clear": (None, []),
    "rmmc_resource_allocate": (_st, [_vp, _sz, _sz, _vp, ctypes.POINTER(_vp)]),
    "rmmc_resource_deallocate": (_st, [_vp, _vp, _sz, _sz, _vp]),
    "rmmc_resource_retain": (_vp, [_vp]),
    "rmmc_resource_release": (None, [_vp]),
    "rmmc_resource_release_cached": (_st, [_vp]),
    "rmmc_resource_name": (ctypes.c_char_p, [_vp]),
    "rmmc_resource_memory_kind": (_i, [_vp]),
    "rmmc_memory_kind_name": (ctypes.c_char_p, [_i]),
    "rmmc_resource_device": (_i, [_vp]),
    "rmmc_resource_upstream": (_vp, [_vp]),
    "rmmc_resource_describe": (None, [_vp, FIELD_CB, _vp]),
    "rmmc_memory_status_string": (_st, [_i, ctypes.c_char_p, _sz, ctypes.POINTER(_sz)]),
    "rmmc_resource_status_string": (_st, [_vp, ctypes.c_char_p, _sz, ctypes.POINTER(_sz)]),
    "rmmc_statistics_adaptor_create": (_st, [_vp, ctypes.POINTER(_vp)]),
    "rmmc_statistics_adaptor_get": (_st, [_vp, ctypes.POINTER(Statistics)]),
    "rmmc_statistics_adaptor_push": (_st, [_vp]),
    "rmmc_statistics_adaptor_pop": (_st, [_vp, ctypes.POINTER(Statistics)]),
    "rmmc_statistics_adaptor_get_depth": (_i, [_vp]),
    "rmmc_statistics_adaptor_push_scope": (_st, [_vp, ctypes.POINTER(ctypes.c_uint64)]),
    "rmmc_statistics_adaptor_get_scope": (_st, [_vp, ctypes.c_uint64, ctypes.POINTER(Statistics)]),
    "rmmc_statistics_adaptor_pop_scope": (_st, [_vp, ctypes.c_uint64, ctypes.POINTER(Statistics)]),
    "rmmc_plugin_get_stats": (_st, [_i, ctypes.POINTER(PluginStats)]),
    "rmmc_plugin_set_limit": (_st, [_i, _sz]),
    "rmmc_plugin_release_cached": (_st, []),
    "rmmc_plugin_last_error": (_sz, [ctypes.c_char_p, _sz]),
    "rmmc_plugin_reset_stats": (None, []),
    "rmmc_torch_alloc": (_vp, [_sz, _i, _vp]),
    "rmmc_torch_free": (None, [_vp, _sz, _i, _vp]),
    "rmmc_cupy_malloc": (_vp, [_vp, _sz, _i]),
    "rmmc_cupy_free": (None, [_vp, _vp, _i]),
    "rmmc_torch_init": (None, [_i]),
    "rmmc_torch_raise_on_failure": (None, [_i]),
    "rmmc_torch_empty_cache": (None, []),
    "rmmc_torch_set_memory_fraction": (None, [ctypes.c_double, _i]),
    "rmmc_torch_record_stream": (None, [_vp, _vp]),
    "rmmc_torch_base_alloc": (_vp, [_vp, ctypes.POINTER(_sz)]),
    "rmmc_resource_set_memory_hooks": (_st, [_vp, ctypes.POINTER(MemoryHooks)]),
    "rmmc_pool_pause": (_st, [_vp, _i, _vp]),
    "rmmc_pool_resume": (_st, [_vp, _vp]),
    "rmmc_pool_sleep_state": (_st, [_vp, ctypes.POINTER(SleepState)]),
    "rmmc_plugin_set_memory_hooks": (_st, [_i, ctypes.POINTER(MemoryHooks)]),
    "rmmc_ipc_export": (_st, [_vp, _vp, ctypes.POINTER(IpcHandle), ctypes.POINTER(_i), _sz,
                              ctypes.POINTER(_sz)]),
    "rmmc_ipc_import": (_st, [ctypes.POINTER(IpcHandle), ctypes.POINTER(_i), _sz,
                              ctypes.POINTER(_vp)]),
    "rmmc_ipc_close": (_st, [_vp]),
    "rmmc_ipc_revoke": (_st, [_vp]),
    "rmmc_ipc_check": (_st, [ctypes.POINTER(IpcHandle)]),
    "rmmc_ipc_handle_info": (_st, [ctypes.POINTER(IpcHandle), ctypes.POINTER(IpcInfo)]),
    "rmmc_ipc_send": (_st, [_i, ctypes.POINTER(IpcHandle), ctypes.POINTER(_i), _sz]),
    "rmmc_ipc_recv": (_st, [_i, ctypes.POINTER(IpcHandle), ctypes.POINTER(_i), _sz,
                            ctypes.POINTER(_sz)]),
    "rmmc_ipc_get_stats": (_st, [ctypes.POINTER(IpcStats)]),
    "rmmc_default_config_device_spec": (_st, [ctypes.c_char_p, _i, ctypes.c_char_p, _sz]),
    # the RMM-style layer (rmmc.mr, rmmc.stats, rmmc.DeviceBuffer, streams)
    "rmmc_stack_create_over": (_st, [ctypes.c_char_p, _vp, ctypes.POINTER(_vp)]),
    "rmmc_stack_help_resource": (_st, [ctypes.c_char_p, ctypes.c_char_p, _sz,
                                       ctypes.POINTER(_sz)]),
    "rmmc_device_memory_info": (_st, [_i, ctypes.POINTER(_sz), ctypes.POINTER(_sz)]),
    "rmmc_format_bytes": (ctypes.c_char_p, [ctypes.c_uint64, ctypes.c_char_p, _sz]),
    "rmmc_stream_create": (_st, [ctypes.c_uint, ctypes.POINTER(_vp)]),
    "rmmc_stream_destroy": (_st, [_vp]),
    "rmmc_stream_synchronize": (_st, [_vp]),
    "rmmc_resource_init": (None, [ctypes.POINTER(ResourceBase), ctypes.POINTER(ResourceOps),
                                  _i, _i]),
    "rmmc_set_error": (_st, [_st, ctypes.c_char_p]),
    "rmmc_cuda_async_resource_create_view": (_st, [_i, _vp, ctypes.POINTER(_vp)]),
    "rmmc_cuda_async_resource_pool": (_vp, [_vp]),
    "rmmc_binning_resource_bin_count": (_sz, [_vp]),
    "rmmc_binning_resource_bin_size": (_sz, [_vp, _sz]),
    "rmmc_binning_resource_bin": (_vp, [_vp, _sz]),
    "rmmc_limiting_adaptor_get_limit": (_sz, [_vp]),
    "rmmc_limiting_adaptor_get_used": (_sz, [_vp]),
    "rmmc_tracking_adaptor_get_outstanding_count": (_sz, [_vp]),
    "rmmc_tracking_adaptor_get_outstanding_bytes": (_sz, [_vp]),
    "rmmc_tracking_adaptor_for_each": (_st, [_vp, TRACKED_CB, _vp]),
    "rmmc_logging_adaptor_flush": (_st, [_vp]),
    "rmmc_failure_callback_adaptor_create": (_st, [_vp, FAILURE_CB, _vp, ctypes.POINTER(_vp)]),
    "rmmc_resource_refcount": (ctypes.c_long, [_vp]),
    "rmmc_buffer_create": (_st, [_BP, _sz, _vp, _vp]),
    "rmmc_buffer_create_from": (_st, [_BP, _vp, _sz, _vp, _vp]),
    "rmmc_buffer_create_copy": (_st, [_BP, _BP, _vp, _vp]),
    "rmmc_buffer_destroy": (_st, [_BP]),
    "rmmc_buffer_move": (_st, [_BP, _BP]),
    "rmmc_buffer_resize": (_st, [_BP, _sz]),
    "rmmc_buffer_reserve": (_st, [_BP, _sz]),
    "rmmc_buffer_copy_to_host": (_st, [_BP, _sz, _vp, _sz]),
    "rmmc_buffer_copy_from_host": (_st, [_BP, _sz, _vp, _sz]),
    "rmmc_buffer_copy_from_host_async": (_st, [_BP, _sz, _vp, _sz]),
    "rmmc_buffer_set_stream": (_st, [_BP, _vp]),
}

_LL = ctypes.c_longlong
SIGNATURES = {
    # librmmc.so (include/rmmc/*.h)
    "librmmc": _LIBRMMC,
    # the native PyTorch backend's extern "C" entry points (_torch_native.cpp)
    "torch_native": {
        "rmmc_torch_native_install": (_i, [ctypes.c_char_p, _sz]),
        "rmmc_torch_native_torch_version": (ctypes.c_char_p, []),
        "rmmc_torch_native_pool_resource": (_vp, [_i, ctypes.c_uint64, ctypes.c_uint64]),
        "rmmc_torch_native_block_resource": (_vp, [_vp]),
        "rmmc_torch_native_set_pool_spec": (None, [ctypes.c_char_p]),
        "rmmc_torch_native_pool_count": (ctypes.c_long, [_i]),
        "rmmc_torch_native_pools_describe": (ctypes.c_long, [_i, ctypes.c_char_p, _sz]),
        "rmmc_torch_native_bytes_out": (_LL, [_i]),
        "rmmc_torch_native_stats": (_i, [_i, ctypes.POINTER(_LL), _i]),
        "rmmc_torch_native_last_error": (_sz, [ctypes.c_char_p, _sz]),
        "rmmc_torch_native_set_memory_hooks": (_i, [_i, ctypes.POINTER(MemoryHooks)]),
        "rmmc_torch_native_shareable_config": (_sz, [ctypes.c_char_p, ctypes.c_char_p, _sz]),
        "rmmc_torch_native_set_configs": (None, [ctypes.c_char_p, ctypes.c_char_p]),
    },
    # the RMM bridge's extern "C" entry points (_rmm_bridge.cpp)
    "rmm_bridge": {
        "rmmc_rmm_bridge_error": (ctypes.c_char_p, []),
        "rmmc_rmm_bridge_rmm_version": (ctypes.c_char_p, []),
        "rmmc_rmm_field_layout": (None, [ctypes.POINTER(_sz), ctypes.POINTER(_sz)]),
        "rmmc_rmm_resource_new": (_vp, [_vp]),
        "rmmc_rmm_resource_delete": (None, [_vp]),
        "rmmc_rmm_bind": (_i, [_vp, _vp]),
        "rmmc_rmm_unbind": (None, [_vp]),
        "rmmc_rmm_field_has_value": (_i, [_vp]),
        "rmmc_rmm_field_is": (_i, [_vp, _vp]),
        "rmmc_rmm_upstream_create": (_i, [_vp, _i, _i, ON_DESTROY, _vp, ctypes.POINTER(_vp)]),
        "rmmc_rmm_bench_pairs": (ctypes.c_double, [_vp, _vp, _sz, ctypes.c_long, _vp]),
    },
}


def declare(handle, library):
    """Sets SIGNATURES[library]'s restype and argtypes on a loaded library
    (a ctypes.CDLL); returns it."""
    for name, (res, args) in SIGNATURES[library].items():
        fn = getattr(handle, name)
        fn.restype = res
        fn.argtypes = args
    return handle

_lock = threading.Lock()
_loaded = None


def lib():
    """The loaded library (loaded on first use), with its signatures set."""
    global _loaded
    with _lock:
        if _loaded is None:
            path = library_path()
            handle = declare(_load(path), "librmmc")
            handle.path = path
            _loaded = handle
        return _loaded


def last_error():
    """This thread's last rmmc message."""
    return lib().rmmc_last_error_message().decode(errors="replace")


def check(status, what=None):
    """Raises the exception for a failed status, with this thread's message."""
    if status != 0:
        raise error_for(status, last_error(), what)


def address(name):
    """The address of an exported function (what PyTorch's and CuPy's
    allocator hooks take)."""
    return ctypes.cast(getattr(lib(), name), ctypes.c_void_p).value


def read_text(fn, *args):
    """Calls one of the (..., buf, len, needed) string functions."""
    needed = ctypes.c_size_t()
    check(fn(*args, None, 0, ctypes.byref(needed)))
    buf = ctypes.create_string_buffer(needed.value + 1)
    check(fn(*args, buf, needed.value + 1, ctypes.byref(needed)))
    return buf.value.decode(errors="replace")


def stack_help_resource(name):
    """rmmc_stack_help_resource as text; ParseError for an unknown name."""
    needed = ctypes.c_size_t()
    check(lib().rmmc_stack_help_resource(name.encode(), None, 0, ctypes.byref(needed)),
          "stack_help(%r)" % name)
    buf = ctypes.create_string_buffer(needed.value + 1)
    check(lib().rmmc_stack_help_resource(name.encode(), buf, len(buf), None),
          "stack_help(%r)" % name)
    return buf.value.decode()
