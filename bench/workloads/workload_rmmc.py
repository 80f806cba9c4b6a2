# SPDX-License-Identifier: Apache-2.0
"""The rmmc package as the workloads load it: the installed package, or
this checkout's python/ when none is installed, over the librmmc.so a
workload's --lib names (set as RMMC_LIB, so the processes a workload
starts load the same library). The workloads compare PyTorch's allocator
with rmmc's plug-in unless RMMC_TORCH_BACKEND=native asks for the native
backend (scripts/gpu-torch times both)."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILDS = ("build-gpu", "build", "build-release")


def load(lib=None):
    """The rmmc module, over `lib` (a path or None: $RMMC_LIB, else the
    package's own library, else a build directory of this checkout)."""
    if lib:
        os.environ["RMMC_LIB"] = os.path.abspath(lib)
    try:
        import rmmc
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "python"))
        import rmmc
    if not lib and not os.environ.get("RMMC_LIB"):
        try:
            rmmc.library_path()
        except OSError:  # a checkout's package: no library inside it
            for b in BUILDS:
                path = os.path.join(ROOT, b, "librmmc.so")
                if os.path.exists(path):
                    os.environ["RMMC_LIB"] = path
                    break
    return rmmc


def open_checked(lib, spec):
    """(rmmc, None) once the library loads and `spec` parses, else
    (None, what stopped it): for a driver to fail before spending GPU time."""
    try:
        rmmc = load(lib)
        rmmc.version()  # loads the library
    except (ImportError, OSError) as e:
        return None, str(e)
    try:
        rmmc.validate(spec)
    except rmmc.ParseError as e:
        return None, ("spec %r does not parse:\n%s\nresources this librmmc knows:\n%s"
                      % (spec, e.message, rmmc.stack_help()))
    return rmmc, None


def use_torch(lib=None):
    """rmmc as PyTorch's CUDA allocator (before the first CUDA allocation),
    the stack from RMMC_ALLOC_CONF: the plug-in, or the native backend
    when RMMC_TORCH_BACKEND=native. Returns the rmmc module."""
    rmmc = load(lib)
    import rmmc.torch
    rmmc.torch.use(backend=os.environ.get("RMMC_TORCH_BACKEND", "").strip() or "plugin")
    return rmmc


# The figures of a stack's layers that are a reservation: the largest over
# the stack is its peak reservation.
RESERVED_KEYS = ("reserved", "peak_reserved", "reserved_peak")


def worker_load(mode, lib, spec):
    """For a worker process: the rmmc module over `lib` with
    RMMC_ALLOC_CONF set to `spec` (before PyTorch loads) when mode is
    "rmmc"; None for the other modes (PyTorch's own allocator)."""
    if mode != "rmmc":
        return None
    os.environ["RMMC_ALLOC_CONF"] = spec
    return load(lib)


def layers_json(layers):
    """rmmc.stack_figures()'s [(layer, figures)] as JSON rows, the
    figures as ints but for their text ones."""
    return [{"layer": n, "figures": {k: (v if isinstance(v, str) else int(v))
                                     for k, v in figs.items()}}
            for n, figs in layers]


def plugin_summary(rm, spec, stats, figures):
    """An rmmc worker's figures for its summary: the spec, what
    RMMC_ALLOC_CONF configured, the plug-in's peak (`stats`:
    rm.torch.stats()) and the largest RESERVED_KEYS figure over `figures`
    (each layer's figures dict). Returns (dict, problem): problem is why
    the run does not count (the spec unused, nothing allocated), else None."""
    status, chosen, message = rm.config_status()
    reserved = [v for figs in figures for k, v in figs.items()
                if k in RESERVED_KEYS and not isinstance(v, str)]
    out = {
        "spec": spec,
        "config_status": status,
        "config_spec": chosen,
        "config_message": message,
        "peak_allocated_bytes": stats["peak_bytes"],
        "peak_reserved_bytes": max(reserved) if reserved else None,
    }
    problem = None
    if status != "SUCCESS":
        problem = "RMMC_ALLOC_CONF was not used: %s" % message
    elif stats["allocations"] == 0:
        problem = "PyTorch allocated nothing through rmmc"
    return out, problem
