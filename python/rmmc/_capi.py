# SPDX-License-Identifier: Apache-2.0
"""The C signatures and structs the RMM-style layer (rmmc.mr, rmmc.stats,
rmmc.DeviceBuffer, rmmc.stack_help(name)) uses beyond _lib's, declared on
the same loaded library the first time it is asked for. Every struct here
is held against its C header by tests/python/test_struct_layout.py."""
import ctypes
import threading

from ._lib import check, lib

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

_BP = ctypes.POINTER(Buffer)
_SIGNATURES = {
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

_lock = threading.Lock()
_declared = False


def clib():
    """The loaded library with these signatures set as well."""
    global _declared
    handle = lib()
    if not _declared:
        with _lock:
            for name, (res, args) in _SIGNATURES.items():
                fn = getattr(handle, name)
                fn.restype = res
                fn.argtypes = args
            _declared = True
    return handle


def stack_help_resource(name):
    """rmmc_stack_help_resource as text; ParseError for an unknown name."""
    needed = ctypes.c_size_t()
    check(clib().rmmc_stack_help_resource(name.encode(), None, 0, ctypes.byref(needed)),
          "stack_help(%r)" % name)
    buf = ctypes.create_string_buffer(needed.value + 1)
    check(clib().rmmc_stack_help_resource(name.encode(), buf, len(buf), None),
          "stack_help(%r)" % name)
    return buf.value.decode()
