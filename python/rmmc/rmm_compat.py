# SPDX-License-Identifier: Apache-2.0
"""RMM's top-level calls over rmmc: reinitialize(), is_initialized() and
the reinitialize hooks (exported as rmmc.reinitialize, ...).

reinitialize() builds, for each device, the stack RMM's keywords describe
out of rmmc.mr objects and makes it the device's current resource:

    rmmc.reinitialize(pool_allocator=True, initial_pool_size="1GiB", devices=[0, 1])
    # device 0: pool(initial=1073741824) > cuda, the same on device 1

reinitialize_spec() returns that stack as a spec without building it.
"""
import os

from . import InvalidArgumentError, _args
from . import mr as _mr

__all__ = ["reinitialize", "reinitialize_spec", "is_initialized", "register_reinitialize_hook",
           "unregister_reinitialize_hook"]

_HOOKS: list = []


def _log_name(log_file_name, device):
    """RMM's name for device `device`'s log: "<stem>.dev<N><ext>", absolute
    (LoggingResourceAdaptor adds the suffix; reinitialize_spec writes it)."""
    if log_file_name is None:
        log_file_name = os.environ.get("RMM_LOG_FILE")
    if not log_file_name:
        raise InvalidArgumentError(-1, "RMM log file must be specified either using "
                                   "log_file_name= argument or RMM_LOG_FILE environment variable")
    stem, ext = os.path.splitext(log_file_name)
    return os.path.abspath("%s.dev%d%s" % (stem, device, ext))


def _build(device, pool_allocator, managed_memory, initial_pool_size,
           maximum_pool_size, logging, log_file_name, base):
    """The resource object for one device, innermost first."""
    if base is None:
        r = _mr.ManagedMemoryResource(device) if managed_memory else _mr.CudaMemoryResource(device)
    elif base == "host":
        r = _mr.HostMemoryResource()
    else:
        raise InvalidArgumentError(-1, "base is None (cuda or managed memory) or 'host', not %r"
                                   % (base,))
    if pool_allocator:
        r = _mr.PoolMemoryResource(r, initial_pool_size, maximum_pool_size)
    if logging:
        _log_name(log_file_name, device)  # refuse a missing name before anything is built
        layer = _mr.LoggingResourceAdaptor.__new__(_mr.LoggingResourceAdaptor)
        layer._for_device = device  # the device's suffix also over host memory
        layer.__init__(r, log_file_name)
        r = layer
    return r


def reinitialize(pool_allocator=False, managed_memory=False, initial_pool_size=None,
                 maximum_pool_size=None, devices=0, logging=False, log_file_name=None,
                 base=None):
    """RMM's rmm.reinitialize(): calls the registered hooks (last
    registered first), then for each of `devices` builds
    ``[logging >] [pool(initial=, maximum_size=) >] cuda|managed`` and makes it the
    device's current resource. Sizes as RMM reads them ("1GB" = 10**9,
    "1GiB" = 2**30, or an int); initial_pool_size None is half the device's
    free memory, as RMM; the log of device N is "<stem>.devN<ext>".
    `base="host"` (an rmmc addition) builds over host memory instead, for
    machines without a GPU. Nothing is installed unless every device's
    stack builds and installs: a failure leaves every device's resource as
    it was."""
    devs = _args.devices(devices)
    for func, args, kwargs in reversed(list(_HOOKS)):
        func(*args, **kwargs)
    built = [(d, _build(d, pool_allocator, managed_memory, initial_pool_size,
                        maximum_pool_size, logging, log_file_name, base)) for d in devs]
    _mr._set_per_device_resources(built)


def reinitialize_spec(pool_allocator=False, managed_memory=False, initial_pool_size=None,
                      maximum_pool_size=None, logging=False, log_file_name=None, device=0,
                      base=None):
    """The spec reinitialize() builds for `device`, as text."""
    parts = []
    if logging:
        parts.append('logging(path="%s")' % _log_name(log_file_name, device))
    if pool_allocator:
        opts = []
        if initial_pool_size is not None:
            opts.append("initial=%d" % _mr._size(initial_pool_size, "initial_pool_size"))
        elif base != "host":
            opts.append("initial=50%")  # RMM's default: half the device's free memory
        if maximum_pool_size is not None:
            opts.append("maximum_size=%d" % _mr._size(maximum_pool_size, "maximum_pool_size"))
        parts.append("pool(%s)" % ", ".join(opts) if opts else "pool")
    parts.append("host" if base == "host" else "managed" if managed_memory else "cuda")
    return " > ".join(parts)


is_initialized = _mr.is_initialized


def register_reinitialize_hook(func, *args, **kwargs):
    """Calls func(*args, **kwargs) at the start of every reinitialize()
    (hooks run last registered first). Returns func."""
    if not callable(func):
        raise TypeError("func must be callable")
    _HOOKS.append((func, args, kwargs))
    return func


def unregister_reinitialize_hook(func):
    """Removes every registration of func (compared with ==, so a bound
    method given again matches)."""
    _HOOKS[:] = [h for h in _HOOKS if h[0] != func]
