# SPDX-License-Identifier: Apache-2.0
"""PyTorch through rmmc: two lines.

    import rmmc.torch
    rmmc.torch.use("pool > cuda")   # before any CUDA use

use() installs rmmc as PyTorch's CUDA allocator. By default it is the
native backend (rmmc/_torch_native.cpp): PyTorch's whole CUDAAllocator
interface over rmmc, compiled against the installed torch with
torch.utils.cpp_extension the first time (a C++ compiler and the CUDA
toolkit's headers are needed; cached per torch version under
~/.cache/torch_extensions, or $RMMC_TORCH_BUILD_DIR). With it PyTorch's
own tools work as with its native allocator: memory_allocated / memory_stats
/ memory_summary, cudnn.benchmark (cacheInfo), torch.cuda.MemPool and
use_mem_pool, torch.cuda.graph, torch.compile(mode="reduce-overhead"),
memory history and snapshots, torch.OutOfMemoryError, torch.multiprocessing
sharing CUDA tensors (both processes on the native backend), and
torch.cuda.memory.get_allocator_backend() == "rmmc".

The backend is tested with torch 2.9 to 2.15 (TESTED_TORCH; it compiles
with -std=c++20 from 2.14, native_cxx_std). If it cannot be had, use()
falls back to the plug-in (torch.cuda.memory.CUDAPluggableAllocator over
librmmc's rmmc_torch_* functions) with one warning of one line: the torch
version (and whether it is newer than the newest tested), the step that
failed (compile, load, install) with its first error, and what does not
work with the plug-in. backend="plugin" (or RMMC_TORCH_BACKEND=plugin)
asks for the plug-in; backend="native" raises that line instead.

Under the native backend the stack's pages are shareable by default: a
cuda layer under a pool that does not say ipc= gets ipc=true
(NativeBackend.shareable_config), so torch.multiprocessing shares tensors
of `pool > cuda` as PyTorch shares its expandable segments; a device that
cannot share pages gets the spec as written, and cuda(ipc=false) opts out.
A pool layer that does not say stream_heaps= gets stream_heaps=1: one heap
per stream, as PyTorch has one small pool per stream.

Sleep mode: pause(mode) / resume() give the default stack's
memory back to the driver and take it again at the same addresses;
pause(pool=mempool, mode=...) does it for one torch.cuda.MemPool (or graph
pool) of the native backend, each pool on its own (weights backed up,
a cache discarded). A MemPool's stack is built from the device's spec, or
from the spec of a `with pool_spec(spec):` block around its creation
(mem_pool(spec) does both); it sleeps when its pool is expandable.

No code change: `python -m rmmc.torch --spec "pool > cuda" train.py ARGS`
(or `-m MODULE ARGS`; everything after the script or module is its own)
runs train.py with rmmc installed (in processes it spawns too), and
RMMC_TORCH_AUTOLOAD=1 with RMMC_ALLOC_CONF installs it at `import torch`
(PyTorch's torch.backends entry points).

PyTorch cannot swap an allocator it has started, so use() raises if CUDA is
already initialized in PyTorch.
"""
import contextlib
import ctypes
import numbers
import os
import re
import sys
import threading
import warnings

from ._lib import address, declare, lib, library_path
from ._plugin import prepare
from . import plugin_last_error, plugin_stats

_HOOKS = (("set_init_fn", "rmmc_torch_init"),
          ("set_reset_fn", "rmmc_torch_empty_cache"),
          ("set_memory_fraction_fn", "rmmc_torch_set_memory_fraction"),
          ("set_record_stream_fn", "rmmc_torch_record_stream"),
          # CUDA graphs: torch.cuda.graph's private pools
          ("set_begin_allocate_to_pool", "rmmc_torch_begin_allocate_to_pool"),
          ("set_end_allocate_to_pool_fn", "rmmc_torch_end_allocate_to_pool"),
          ("set_release_pool", "rmmc_torch_release_pool"),
          # getBaseAllocation: the chunk under a block (CUDA IPC in older PyTorch)
          ("set_base_alloc_fn", "rmmc_torch_base_alloc"))

_PLUGIN_LOSES = ("torch.cuda.memory_stats/memory_allocated/memory_summary, cudnn.benchmark "
                 "(cacheInfo), torch.cuda.MemPool, torch.compile(mode='reduce-overhead'), "
                 "memory history and snapshots, torch.OutOfMemoryError (a RuntimeError "
                 "comes instead) and torch.multiprocessing sharing of CUDA tensors")

# The torch releases the native backend is compiled and self-tested against
# (scripts/torch-native-check): oldest and newest. A newer torch is tried,
# and a failure says that it is newer than the newest tested.
TESTED_TORCH = ((2, 9), (2, 15))


def _torch_release(version):
    """(major, minor) of a torch version string ("2.14.1+cu130" -> (2, 14))."""
    m = re.match(r"\s*(\d+)\.(\d+)", str(version))
    if m is None:
        raise ValueError("not a torch version: %r" % (version,))
    return int(m.group(1)), int(m.group(2))


def native_cxx_std(version):
    """The C++ standard the native backend is compiled with against torch
    `version`: "c++20" from 2.14 (its headers need it), else "c++17"."""
    return "c++20" if _torch_release(version) >= (2, 14) else "c++17"


class NativeBuildError(RuntimeError):
    """The native backend could not be had; `part` says which step failed:
    "compile" (torch.utils.cpp_extension), "load" (the compiled library)
    or "install" (PyTorch refused the allocator)."""

    def __init__(self, part, detail):
        RuntimeError.__init__(self, detail)
        self.part = part
        self.detail = detail


def _first_error(text):
    """The line of a compiler's output (or any message) that says what
    went wrong: the first with "error", else the first non-empty one."""
    lines = [l.strip() for l in str(text).splitlines() if l.strip()]
    for l in lines:
        if "error" in l.lower() and not l.lower().startswith("error building extension"):
            return l[:400]
    return lines[0][:400] if lines else ""


def _native_failure(part, detail, version):
    """One line: which torch, whether it is outside the tested releases,
    which step failed and its first error."""
    try:
        release = _torch_release(version)
    except ValueError:
        release = None
    where = ""
    if release is not None and release > TESTED_TORCH[1]:
        where = (" (newer than %d.%d, the newest release rmmc is tested with)"
                 % TESTED_TORCH[1])
    elif release is not None and release < TESTED_TORCH[0]:
        where = (" (older than %d.%d, the oldest release rmmc is tested with)"
                 % TESTED_TORCH[0])
    return ("rmmc.torch: the native backend failed to %s against torch %s%s: %s"
            % (part, version, where, _first_error(detail) or "no message"))


_native_lib = None  # the loaded backend (ctypes.CDLL)
_backend = None     # "native" or "plugin" once use() succeeded


def _current_device():
    import torch
    return torch.cuda.current_device()


class NativeBackend:
    """What use() returns for the native backend: `path` (the compiled
    library), `torch_version` (the torch it was compiled against)."""

    def __init__(self, dll, path):
        self._dll = dll
        self.path = path
        self.torch_version = dll.rmmc_torch_native_torch_version().decode()

    def pool_resource(self, pool_id, device=None):
        """The rmmc stack of a private pool (a MemPool's .id, a graph's
        pool) as an rmmc.Resource, or None if the pool has no memory."""
        from . import Resource, _args
        dev = _current_device() if device is None else _args.device(device)
        h = self._dll.rmmc_torch_native_pool_resource(dev, _args.uint64(pool_id[0], "pool id"),
                                                      _args.uint64(pool_id[1], "pool id"))
        if not h:
            return None
        r = Resource._adopt(h, "<private pool %s>" % (tuple(pool_id),))
        lib().rmmc_resource_release(h)
        return r

    def block_resource(self, ptr):
        """The rmmc stack that handed out block `ptr` (a tensor's
        untyped_storage().data_ptr()) as an rmmc.Resource, or None if the
        backend did not hand it out."""
        from . import Resource, _args
        h = self._dll.rmmc_torch_native_block_resource(_args.pointer(ptr, "ptr"))
        if not h:
            return None
        r = Resource._adopt(h, "<stack of block 0x%x>" % ptr)
        lib().rmmc_resource_release(h)
        return r

    def shareable_config(self, config):
        """`config` (RMMC_ALLOC_CONF's form) with ipc=true on every cuda
        layer under a pool that does not say ipc, and stream_heaps=1 on
        every pool layer that does not say stream_heaps: what use() runs
        under PyTorch, so torch.multiprocessing can share pages of an
        expandable pool (cuda(ipc=false) opts out) and a stream's small
        blocks share spans whichever thread allocates, as PyTorch's small
        pool per stream does (pool(stream_heaps=0): a heap per thread)."""
        n = self._dll.rmmc_torch_native_shareable_config(config.encode(), None, 0)
        buf = ctypes.create_string_buffer(n + 1)
        self._dll.rmmc_torch_native_shareable_config(config.encode(), buf, n + 1)
        return buf.value.decode()

    def pool_count(self, device=None):
        """Private pools alive on the device."""
        import torch
        from . import _args
        dev = torch.cuda.current_device() if device is None else _args.device(device)
        return self._dll.rmmc_torch_native_pool_count(dev)

    def pools_describe(self, device=None):
        """One line on the device's private pools: each one's id, users and
        blocks out, then the routings and the frees waiting for captures."""
        import torch
        from . import _args
        dev = torch.cuda.current_device() if device is None else _args.device(device)
        n = self._dll.rmmc_torch_native_pools_describe(dev, None, 0)
        if n < 0:
            raise ValueError("rmmc.torch: no device %d" % dev)
        buf = ctypes.create_string_buffer(n + 1)
        self._dll.rmmc_torch_native_pools_describe(dev, buf, n + 1)
        return buf.value.decode()

    def bytes_out(self, device=None):
        """Bytes handed to PyTorch on the device (each block rounded up to
        512 as PyTorch rounds it, which is what rmmc hands out)."""
        import torch
        from . import _args
        dev = torch.cuda.current_device() if device is None else _args.device(device)
        return self._dll.rmmc_torch_native_bytes_out(dev)

    def __repr__(self):
        return "<rmmc native PyTorch backend for torch %s: %s>" % (self.torch_version, self.path)


def _include_dir():
    """Where rmmc's public headers are: $RMMC_INCLUDE, the package's copy,
    the checkout this package is the python/ folder of (meson test runs
    it from there, with the build directory anywhere), or the checkout a
    development library (RMMC_LIB) was built in."""
    env = os.environ.get("RMMC_INCLUDE")
    candidates = [env] if env else []
    here = os.path.dirname(os.path.abspath(__file__))
    candidates.append(os.path.join(here, "include"))
    checkout = os.path.dirname(os.path.dirname(here))
    if os.path.basename(os.path.dirname(here)) == "python":
        candidates.append(os.path.join(checkout, "include"))
    d = os.path.dirname(library_path())
    for _ in range(4):
        candidates.append(os.path.join(d, "include"))
        d = os.path.dirname(d)
    for c in candidates:
        if c and os.path.exists(os.path.join(c, "rmmc", "resource.h")):
            return c
    raise FileNotFoundError("rmmc's headers were not found (looked in %s); set RMMC_INCLUDE"
                            % ", ".join(c for c in candidates if c))


def build_native(verbose=False):
    """Compiles (or finds in the cache) the native backend for the installed
    torch and loads it. Returns the NativeBackend. Raises NativeBuildError
    (its part: "compile" or "load") on failure."""
    global _native_lib
    if _native_lib is not None:
        return _native_lib
    import torch
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_torch_native.cpp")
    libpath = library_path()
    lib()  # librmmc first, so the backend binds to the same copy
    # The backend has no device code, but cpp_extension asks for
    # architectures when it cannot see a GPU: any value serves (restored).
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch is None and not torch.cuda.is_available():
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0"
    try:
        path = _compile(torch, src, libpath, verbose)
    except Exception as e:  # the compiler's output is in the message
        raise NativeBuildError("compile", "%s: %s" % (type(e).__name__, e)) from e
    finally:
        if arch is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
    try:
        _native_lib = NativeBackend(_bind(ctypes.CDLL(path)), path)
    except (OSError, AttributeError) as e:  # a library that cannot load, or lacks an entry point
        raise NativeBuildError("load", "%s: %s" % (path, e)) from e
    return _native_lib


def _compile(torch, src, libpath, verbose):
    """torch.utils.cpp_extension.load of the backend, named after the torch
    version (each version compiles once, cached); returns the library."""
    import torch.utils.cpp_extension as ext
    tag = "".join(c if c.isalnum() else "_" for c in torch.__version__)
    name = "rmmc_torch_native_" + tag
    build_dir = os.environ.get("RMMC_TORCH_BUILD_DIR")
    if build_dir:
        build_dir = os.path.join(build_dir, name)
        os.makedirs(build_dir, exist_ok=True)
    return ext.load(name=name, sources=[src], extra_include_paths=[_include_dir()],
                    # the standard this release's headers need (as
                    # scripts/torch-native-check compiles it)
                    extra_cflags=["-O2", "-Wall", "-std=" + native_cxx_std(torch.__version__)],
                    # A compiler that links libstdc++ statically (the GPU
                    # machine's /opt/gcc) puts a second copy of it in the
                    # backend; exported, its symbols bind to the process's
                    # libstdc++ and mix the two copies' locales (a crash in
                    # the first ostream<<). Kept local, each copy is whole.
                    extra_ldflags=[libpath, "-Wl,-rpath," + os.path.dirname(libpath),
                                   "-Wl,--exclude-libs,ALL"],
                    with_cuda=True, is_python_module=False, build_directory=build_dir,
                    verbose=verbose)


def _bind(dll):
    """The backend's entry points, typed (_lib.SIGNATURES["torch_native"])."""
    return declare(dll, "torch_native")


def _install_native(native):
    buf = ctypes.create_string_buffer(1024)
    if native._dll.rmmc_torch_native_install(buf, len(buf)) != 0:
        raise NativeBuildError("install", buf.value.decode(errors="replace"))
    return native


def _prepare_shareable(native, spec, device):
    """prepare(spec, device) with the native backend's shareable pages: the
    spec given (or the process default) becomes its shareable form
    (NativeBackend.shareable_config); a stack built now whose device
    cannot share pages is built from the spec as given instead, and the
    backend does the same for stacks it builds later. A Resource is
    installed as it is."""
    from . import NotSupportedError, config_status, set_default
    if spec is not None and not isinstance(spec, str):
        prepare(spec, device)
        return
    if spec is None:
        prepare(None, device)  # a broken RMMC_ALLOC_CONF raises here
        status, config, _ = config_status()
        if status != "SUCCESS":
            return  # the fallback's plain cuda: nothing to share
    else:
        config = spec
    shared = native.shareable_config(config)
    if device is not None:
        try:
            set_default(shared, device)
        except NotSupportedError:
            set_default(config, device)
        return
    if shared != config:
        set_default(shared)
        native._dll.rmmc_torch_native_set_configs(shared.encode(), config.encode())
    elif spec is not None:
        set_default(spec)


def _install_plugin():
    import torch
    alloc = torch.cuda.memory.CUDAPluggableAllocator(lib().path, "rmmc_torch_alloc",
                                                      "rmmc_torch_free")
    lib().rmmc_torch_raise_on_failure(1)
    hooks = alloc.allocator()
    for setter, fn in _HOOKS:
        if hasattr(hooks, setter):  # older PyTorch versions lack some
            getattr(hooks, setter)(address(fn))
    torch.cuda.memory.change_current_allocator(alloc)
    return alloc


# PYTORCH_CUDA_ALLOC_CONF's keys that have an rmmc meaning (the rest are
# named in one warning): the stack's pool options, or its base.
_CONF_BOOL = {"True": "true", "true": "true", "False": "false", "false": "false"}


def pytorch_conf_spec(conf):
    """(spec or None, applied, ignored) for a PYTORCH_CUDA_ALLOC_CONF value
    ("expandable_segments:True,max_split_size_mb:128"): the rmmc stack its
    keys with an rmmc meaning describe (backend:cudaMallocAsync is
    cuda_async; backend:native, expandable_segments and
    garbage_collection_threshold are pool > cuda and its expandable and
    gc_threshold options), the items applied, and the items with no rmmc
    meaning (max_split_size_mb, roundup_power2_divisions, the pinned
    allocator's keys, ...) or a value rmmc cannot read, each "key:value"."""
    items = [i.strip() for i in (conf or "").split(",") if i.strip()]
    applied, ignored, opts = [], [], []
    base = None
    for item in items:
        key, _, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if key == "backend" and value in ("cudaMallocAsync", "native"):
            base = value
            applied.append(item)
        elif key == "expandable_segments" and value in _CONF_BOOL:
            opts.append("expandable=" + _CONF_BOOL[value])
            applied.append(item)
        elif key == "garbage_collection_threshold":
            try:
                x = float(value)
            except ValueError:
                ignored.append(item)
                continue
            if not 0.0 < x < 1.0:
                ignored.append(item)
                continue
            opts.append("gc_threshold=%s" % value)
            applied.append(item)
        else:
            ignored.append(item)
    if base == "cudaMallocAsync":
        # PyTorch's async backend has no pool options: expandable and gc go.
        moved = [i for i in applied if not i.startswith("backend")]
        applied = [i for i in applied if i.startswith("backend")]
        return "cuda_async", applied, ignored + moved
    if base is None and not opts:
        return None, applied, ignored
    return ("pool(%s) > cuda" % ", ".join(opts) if opts else "pool > cuda"), applied, ignored


def _apply_pytorch_conf(spec):
    """The spec use() installs, given PYTORCH_CUDA_ALLOC_CONF: an explicit
    spec (or RMMC_ALLOC_CONF, or rmmc.set_default) wins, and then no key
    applies; otherwise the keys with an rmmc meaning make the stack. One
    warning names what is not applied."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").strip()
    if not conf:
        return spec
    from . import config_status
    translated, applied, ignored = pytorch_conf_spec(conf)
    explicit = spec is not None or os.environ.get("RMMC_ALLOC_CONF", "").strip() or \
        config_status()[1] not in ("", "cuda")
    if explicit:
        ignored, applied, translated = applied + ignored, [], None
    if ignored:
        why = ("the rmmc stack comes from %s" % ("the spec given" if spec is not None else
                                                "RMMC_ALLOC_CONF / rmmc.set_default")
               if explicit else "they have no rmmc meaning")
        warnings.warn("rmmc.torch: PYTORCH_CUDA_ALLOC_CONF's %s %s not applied (%s)%s"
                      % (", ".join(ignored), "is" if len(ignored) == 1 else "are", why,
                         "; %s %s: %s" % (", ".join(applied), "is" if len(applied) == 1
                                          else "are", translated) if applied else ""),
                      RuntimeWarning, stacklevel=3)
    return translated if translated is not None else spec


def use(spec=None, device=None, fraction=None, backend=None):
    """Makes rmmc PyTorch's CUDA allocator. `spec` (optional) becomes the
    default stack (rmmc.set_default(spec, device)); without one,
    RMMC_ALLOC_CONF or a default set earlier is used, and a broken
    RMMC_ALLOC_CONF raises ParseError here. `fraction` caps the bytes
    PyTorch may hold through rmmc per device
    (torch.cuda.set_per_process_memory_fraction). `backend`: "native"
    (PyTorch's whole allocator interface; raise if it cannot be built),
    "plugin" (CUDAPluggableAllocator), or None / "auto" (native, else the
    plug-in with a warning); RMMC_TORCH_BACKEND sets the default. Returns
    the NativeBackend or the CUDAPluggableAllocator. Raises RuntimeError if
    PyTorch has initialized CUDA already. PYTORCH_CUDA_ALLOC_CONF is read
    where it has an rmmc meaning (pytorch_conf_spec: the stack, when no
    spec, RMMC_ALLOC_CONF or default was given) and what it cannot apply is
    named in one warning."""
    global _backend
    choice = (backend or os.environ.get("RMMC_TORCH_BACKEND") or "auto").strip().lower()
    if choice not in ("auto", "native", "plugin"):
        raise ValueError("rmmc.torch.use: backend must be 'native', 'plugin' or 'auto', not %r"
                         % choice)
    import torch
    if _backend == "native" and choice != "plugin" and _native_lib is not None:
        prepare(spec, device)  # installed already (the autoload, then the script)
        return _native_lib
    if torch.cuda.is_initialized():
        raise RuntimeError("rmmc.torch.use() must run before PyTorch initializes CUDA (it did "
                           "already: call use() first thing, before any tensor goes to the GPU)")
    spec = _apply_pytorch_conf(spec)
    result = failure = None
    if choice != "plugin":
        try:
            native = build_native(verbose=os.environ.get("RMMC_TORCH_VERBOSE", "") == "1")
            _prepare_shareable(native, spec, device)
            result = _install_native(native)
            _backend = "native"
        except Exception as e:  # a compiler, headers or torch's build tools missing
            if isinstance(e, NativeBuildError):
                failure = _native_failure(e.part, e.detail, torch.__version__)
            elif isinstance(e, (ImportError, OSError)):  # cpp_extension, or rmmc's headers
                failure = _native_failure("compile", "%s: %s" % (type(e).__name__, e),
                                          torch.__version__)
            else:
                raise  # the spec's own error (ParseError, ...): the plug-in would fail too
            if choice == "native":
                raise RuntimeError(failure) from e
    if result is None:
        if failure is not None:
            # One line: the torch, the step that failed and why, what is lost.
            warnings.warn("%s; using the plug-in (CUDAPluggableAllocator) instead, with which %s "
                          "do not work (backend='native' raises instead)"
                          % (failure, _PLUGIN_LOSES), RuntimeWarning, stacklevel=2)
            prepare(spec, device)
        else:
            prepare(spec, device)
        result = _install_plugin()
        _backend = "plugin"
    if fraction is not None:
        torch.cuda.set_per_process_memory_fraction(fraction)
    return result


def backend():
    """"native", "plugin", or None before use()."""
    return _backend


def _stream(stream):
    from . import _args
    if stream is not None:
        return _args.stream(stream)
    import torch
    return torch.cuda.current_stream().cuda_stream


def _need_native(what):
    if _backend != "native" or _native_lib is None:
        raise RuntimeError(
            "rmmc.torch.%s: private pools (torch.cuda.MemPool, graph pools) are rmmc stacks "
            "only with the native backend (rmmc.torch.use(..., backend='native')); the backend "
            "in use is %s" % (what, "the plug-in, whose MemPools PyTorch refuses"
                              if _backend == "plugin" else "none (rmmc.torch.use() has not run)"))
    return _native_lib


def _pool_id(pool, what):
    """(int, int) from a torch.cuda.MemPool, its .id or a graph pool handle."""
    pid = getattr(pool, "id", pool)
    if (not isinstance(pid, (tuple, list)) or len(pid) != 2
            or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in pid)):
        raise TypeError("rmmc.torch.%s: pool must be a torch.cuda.MemPool, its .id or a graph "
                        "pool handle (a pair of ints), not %r" % (what, pool))
    pid = (int(pid[0]), int(pid[1]))
    if pid == (0, 0) or not (0 <= pid[0] < 1 << 64 and 0 <= pid[1] < 1 << 64):
        raise ValueError("rmmc.torch.%s: %r names no private pool (pool=None means the default "
                         "stack)" % (what, pid))
    return pid


def _pool_stack(pool, device, what):
    """The rmmc.Resource of a private pool of the native backend."""
    pid = _pool_id(pool, what)
    native = _need_native(what)
    r = native.pool_resource(pid, device)
    if r is None:
        raise ValueError(
            "rmmc.torch.%s: rmmc's native backend has no private pool %r on device %s (made "
            "before rmmc.torch.use(), on another device, with an allocator of its own, or "
            "released already)" % (what, pid, "(current)" if device is None else device))
    return r


_NOT_EXPANDABLE_HINT = (" (a MemPool sleeps when its stack's pool is expandable: make it under "
                        "`with rmmc.torch.pool_spec(\"pool > cuda\"):`, or with "
                        "rmmc.torch.mem_pool(\"pool > cuda\"))")


def pause(mode="backup", device=None, stream=None, pool=None):
    """Sleep mode for the rmmc stack PyTorch allocates from on `device`
    (the registry's; rmmc.Resource.pause), or with `pool` (a
    torch.cuda.MemPool, its .id or a graph pool handle; the native backend)
    for that private pool's stack alone: every page of its pool goes back
    to the driver (torch.cuda.mem_get_info shows it free) and every tensor
    keeps its data_ptr. mode "backup" keeps the tensors' contents in pinned
    host memory, "discard" drops them. Synchronizes the device; the copies
    run on `stream` (default: the current stream). While paused, allocating
    a tensor from it raises torch.OutOfMemoryError ("the pool is paused");
    other pools keep working, and each pauses and resumes on its own.
    Tensors in other rmmc.Resource stacks pause with their own
    Resource.pause(). A MemPool needs an expandable pool (NotSupportedError
    for chunks, saying so); ValueError for a pool the backend does not
    know, RuntimeError without the native backend."""
    from . import PAUSE_MODES, InvalidArgumentError, NotSupportedError, get_default
    if mode not in PAUSE_MODES:
        raise InvalidArgumentError(-1, "pause: mode must be 'backup' or 'discard', not %r"
                                   % (mode,), "rmmc.torch.pause")
    if pool is None:
        with get_default(device) as r:
            r.pause(mode, _stream(stream))
        return
    with _pool_stack(pool, device, "pause") as r:
        try:
            r.pause(mode, _stream(stream))
        except NotSupportedError as e:
            raise NotSupportedError(e.status, e.message + _NOT_EXPANDABLE_HINT,
                                    "rmmc.torch.pause(pool=%r)" % (_pool_id(pool, "pause"),)) \
                from None


def resume(device=None, stream=None, pool=None):
    """Wakes what pause() put to sleep (the default stack, or `pool`'s):
    the same addresses, the backup's contents in place for work on
    `stream` (default: the current stream). OutOfMemoryError, still
    paused, when the device lacks the memory (another process holds it)."""
    from . import get_default
    if pool is None:
        with get_default(device) as r:
            r.resume(_stream(stream))
        return
    with _pool_stack(pool, device, "resume") as r:
        r.resume(_stream(stream))


def sleep_state(device=None, pool=None):
    """rmmc.Resource.sleep_state() of the stack PyTorch allocates from, or
    of `pool`'s stack (native backend): paused, mode, held (bytes mapped),
    unmapped, backed_up, host_bytes, pauses, resumes, can_sleep."""
    from . import get_default
    if pool is None:
        with get_default(device) as r:
            return r.sleep_state()
    with _pool_stack(pool, device, "sleep_state") as r:
        return r.sleep_state()


def pool_resource(pool, device=None):
    """The rmmc stack of a private pool (a torch.cuda.MemPool, its .id, a
    graph pool handle) as an rmmc.Resource (figures(), layers(),
    sleep_state(); the native backend). ValueError for a pool the backend
    does not know."""
    return _pool_stack(pool, device, "pool_resource")


_pool_specs = threading.local()  # this thread's pool_spec() blocks, innermost last


@contextlib.contextmanager
def pool_spec(spec):
    """Inside the block, the private pools this thread makes
    (torch.cuda.MemPool(), torch.cuda.graph's pool) get an rmmc stack built
    from `spec` instead of the device's default spec. Sleep mode needs an
    expandable pool ("pool > cuda", the default pool kind); its pages are
    shareable with another process unless it says cuda(ipc=false), and its
    pool layer takes a private pool's defaults where it says nothing
    (small_chunk=2MiB, min_growth=2MiB, page=1TiB: the README's "PyTorch's
    own tests"). The spec is checked here (ParseError) and built when the
    pool is made. Native backend only (RuntimeError otherwise)."""
    from . import _args, validate
    native = _need_native("pool_spec")
    if not isinstance(spec, str):
        raise TypeError("rmmc.torch.pool_spec: spec must be a str, not %s" % type(spec).__name__)
    validate(spec)
    stack = getattr(_pool_specs, "stack", None)
    if stack is None:
        stack = _pool_specs.stack = []
    stack.append(spec)
    native._dll.rmmc_torch_native_set_pool_spec(_args.text(spec))
    try:
        yield spec
    finally:
        stack.pop()
        native._dll.rmmc_torch_native_set_pool_spec(_args.text(stack[-1]) if stack else None)


def mem_pool(spec=None, **kwargs):
    """torch.cuda.MemPool(**kwargs) whose rmmc stack is built from `spec`
    (default: the device's spec): rmmc.torch.mem_pool("pool > cuda") makes
    a pool that can pause and resume on its own."""
    import torch
    native = _need_native("mem_pool")
    if spec is None:
        return torch.cuda.MemPool(**kwargs)
    with pool_spec(spec):
        pool = torch.cuda.MemPool(**kwargs)
    # PyTorch names the pool to the allocator in MemPool's constructor, so
    # its stack is built inside the block; say so if a version does not.
    if kwargs.get("allocator") is None:
        r = native.pool_resource(pool.id)
        if r is None:
            raise RuntimeError("rmmc.torch.mem_pool: torch.cuda.MemPool() did not create its "
                               "pool in rmmc (PyTorch %s); make the pool, then allocate in it "
                               "first inside `with rmmc.torch.pool_spec(spec):`"
                               % torch.__version__)
        r.close()
    return pool


_STATS_KEYS = ("allocations", "allocation_failures", "deallocations", "deallocation_failures",
               "unknown_frees", "recorded_streams", "live_blocks", "bytes_in_use",
               "peak_bytes", "limit")


def stats(device=-1):
    """What rmmc handed PyTorch since use(), per device (-1: all summed):
    allocations, allocation_failures, deallocations, deallocation_failures,
    unknown_frees, recorded_streams, live_blocks, bytes_in_use (as PyTorch
    asked), peak_bytes, limit, and current_bytes (= bytes_in_use), from
    whichever backend is installed. PyTorch's resets do not clear them
    (torch.cuda.memory_stats has the resettable view)."""
    if _backend != "native" or _native_lib is None:
        return plugin_stats(device)
    import torch
    from . import _args
    device = _args.device(device, allow_all=True)
    devices = range(torch.cuda.device_count()) if device == -1 else [device]
    out = dict.fromkeys(_STATS_KEYS, 0)
    v = (ctypes.c_longlong * len(_STATS_KEYS))()
    for d in devices:
        if _native_lib._dll.rmmc_torch_native_stats(d, v, len(v)) != len(v):
            raise ValueError("rmmc.torch.stats: no device %d" % d)
        for k, x in zip(_STATS_KEYS, v):
            if k == "peak_bytes" and device == -1:
                out[k] = max(out[k], x)  # the busiest device's peak: peaks do not add
            else:
                out[k] += x
    out["current_bytes"] = out["bytes_in_use"]
    return out


def last_error():
    """rmmc's message for the last allocation refused through PyTorch, on
    any thread ("" if none): the part after "rmmc: " in the
    OutOfMemoryError the native backend raises, or the plug-in's message."""
    if _backend != "native" or _native_lib is None:
        return plugin_last_error()
    dll = _native_lib._dll
    n = dll.rmmc_torch_native_last_error(None, 0)
    buf = ctypes.create_string_buffer(n + 1)
    dll.rmmc_torch_native_last_error(buf, n + 1)
    return buf.value.decode(errors="replace")


def _autoload():
    """PyTorch's torch.backends entry point (runs at the end of `import
    torch`): installs rmmc when RMMC_TORCH_AUTOLOAD=1, from RMMC_ALLOC_CONF.
    A failure warns; it never breaks `import torch`."""
    if os.environ.get("RMMC_TORCH_AUTOLOAD", "").strip().lower() not in ("1", "true", "yes", "on"):
        return
    try:
        use()
    except Exception as e:
        warnings.warn("rmmc.torch autoload (RMMC_TORCH_AUTOLOAD=1) failed: %s" % e,
                      RuntimeWarning)


_LAUNCHER_USAGE = ("python -m rmmc.torch [--spec SPEC] [--backend {auto,native,plugin}] "
                   "(SCRIPT | -m MODULE) [ARGS...]")


def _launcher_args(argv):
    """Splits the launcher's command line as `python -m` does: its own
    options (--spec, --backend, -h) come first; the first other word is the
    script, or -m names the module; everything after them belongs to the
    script or module, untouched (its own -q, -k, --spec...). Returns
    (options, module, script, rest)."""
    own = ("--spec", "--backend")
    opts, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "-m" or (a.startswith("-m") and not a.startswith("--")):
            module = a[2:] if len(a) > 2 else (argv[i + 1] if i + 1 < len(argv) else None)
            rest = argv[i + 1:] if len(a) > 2 else argv[i + 2:]
            return opts, module, None, rest
        if a in own:
            opts += argv[i:i + 2]
            i += 2
        elif a == "--":
            return opts, None, argv[i + 1] if i + 1 < len(argv) else None, argv[i + 2:]
        elif a.startswith("-"):
            opts.append(a)  # --spec=..., -h, or one argparse refuses
            i += 1
        else:
            return opts, None, a, argv[i + 1:]
    return opts, None, None, []


def _main(argv=None, install=None):
    """python -m rmmc.torch [--spec SPEC] [--backend B] (SCRIPT | -m MODULE) [ARGS...]
    `install`: what installs rmmc (rmmc.torch.use; tests pass another)."""
    import argparse
    import runpy
    parser = argparse.ArgumentParser(
        prog="python -m rmmc.torch", usage=_LAUNCHER_USAGE,
        description="Run a PyTorch script or module with rmmc as its CUDA allocator, with no "
                    "code change (processes it spawns get rmmc too). Everything after the "
                    "script, or after -m MODULE, is passed to it untouched, as with python -m.")
    parser.add_argument("--spec", help="the stack, e.g. 'pool > cuda' (default: RMMC_ALLOC_CONF)")
    parser.add_argument("--backend", choices=("auto", "native", "plugin"), default=None)
    opts, module, script, rest = _launcher_args(sys.argv[1:] if argv is None else list(argv))
    a = parser.parse_args(opts)
    if module is None and script is None:
        parser.error("a script or -m MODULE is needed")
    if a.spec:
        os.environ["RMMC_ALLOC_CONF"] = a.spec
    if a.backend:
        os.environ["RMMC_TORCH_BACKEND"] = a.backend
    os.environ["RMMC_TORCH_AUTOLOAD"] = "1"  # spawned children (torch.multiprocessing)
    if install is None:
        import rmmc.torch as this  # the package's module, not __main__
        install = this.use
    install(a.spec)
    if module is not None:
        sys.argv = [module] + rest
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    else:
        sys.argv = [script] + rest
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
        runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _main()
