# SPDX-License-Identifier: Apache-2.0
"""rmmc on Dask workers: one stack per worker from one spec.

    from dask.distributed import Client
    import rmmc.dask

    cluster = rmmc.dask.gpu_cluster()            # a worker per GPU (plain dask.distributed)
    client = Client(cluster)
    rmmc.dask.install(client, "statistics > pool(initial=1GiB) > cuda")
    ...                                          # CuPy (and PyTorch) on the workers use rmmc
    print(rmmc.dask.figures_table(client))       # every worker's figures, one call

RmmcPlugin is a distributed.WorkerPlugin: on each worker (at registration,
and on every worker that joins later) it builds the stack on the worker's
device, makes it the registry's resource there (what rmmc_allocate, the CuPy
and PyTorch plug-ins allocate from), and routes CuPy through it
(rmmc.cupy.use) when CuPy is installed, and PyTorch (rmmc.torch.use) when
asked to and PyTorch has not started CUDA in that worker yet.

dask-cuda's per-worker RMM options, with dask-cuda's meaning, have spec
equivalents (spec_from_options; dask_cuda.plugins.RMMSetup builds the same
stack out of RMM's objects):
    rmm_pool_size          pool(initial=...)
    rmm_maximum_pool_size  pool(maximum_size=...); ignored without a pool (as dask-cuda)
    rmm_managed_memory     managed as the base instead of cuda
    rmm_async              cuda_async(...) instead of pool > cuda, with
                           limiting(limit=rmm_maximum_pool_size) over it
    rmm_release_threshold  cuda_async(release_threshold=...) (needs rmm_async)
    rmm_log_directory      logging(path=<dir>/rmm_log_<worker>.dev<device>.txt) on top,
                           RMM's CSV (with a pool, managed memory or rmm_async, as dask-cuda)
    rmm_track_allocations  tracking on top
    rmm_allocator_external_lib_list  "cupy", "torch" (a list or "torch,cupy"):
                           route those frameworks (and only those) through rmmc
Sizes read as dask-cuda reads them: an int is bytes, a float in (0, 1] a
fraction of the device's TOTAL memory, a str goes through dask's
parse_bytes ("5000M" = 5e9 bytes, "1GB" = 1e9, "1GiB" = 2**30); 0 and None
are unset; each aligned down to 256 bytes. A worker whose name is in
`per_worker` gets that spec instead (a different device size, or a cap:
"limiting(limit=2GiB) > pool > cuda").
"""
import os
import re

from . import Resource, set_default
from . import dist as _dist

__all__ = ["spec_from_options", "RmmcPlugin", "install", "worker_figures", "collect_figures",
           "figures_table", "gpu_cluster"]

PLUGIN_NAME = "rmmc"

# The stack each worker process installed: worker_figures() reads it.
_WORKER: dict = {}
# Frameworks this process routed through rmmc (PyTorch's allocator cannot
# be installed twice).
_ROUTED: set = set()


def _quote(text):
    if '"' in text:
        raise ValueError("a path with a double quote cannot go into a spec: %r" % text)
    return '"%s"' % text


def worker_log_path(directory, worker_name, device=0):
    """dask-cuda's log file for a worker: <directory>/rmm_log_<name>.dev<device>.txt
    (the worker name's last '/' part, as dask_cuda.utils.get_rmm_log_file_name
    names it, with RMM's LoggingResourceAdaptor's device suffix)."""
    name = worker_name.split("/")[-1] if isinstance(worker_name, str) else worker_name
    return os.path.join(directory, "rmm_log_%s.dev%d.txt" % (name, device))


EXTERNAL_LIBS = ("torch", "cupy")


def external_libs(value):
    """rmm_allocator_external_lib_list as dask-cuda reads it: None, a
    comma-separated str or a list of "torch" / "cupy"."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",")]
    elif not isinstance(value, list):
        raise ValueError("rmm_allocator_external_lib_list must be either a comma-separated "
                         "string or a list of strings. Examples: 'torch,cupy' or "
                         "['torch', 'cupy']")
    for lib_name in value:
        if lib_name not in EXTERNAL_LIBS:
            raise ValueError("The library '%s' is not supported for RMM integration. Supported "
                             "libraries are: %s." % (lib_name, ", ".join(EXTERNAL_LIBS)))
    return list(value)


def _total_memory(base, device):
    """The TOTAL memory that fractions are of: the device's, or the host's
    for a host base."""
    if base == "host":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    from .mr import available_device_memory
    return available_device_memory(device)[1]


def spec_from_options(rmm_pool_size=None, rmm_maximum_pool_size=None, rmm_managed_memory=False,
                      rmm_async=False, rmm_release_threshold=None, rmm_log_directory=None,
                      rmm_track_allocations=False, rmm_allocator_external_lib_list=None,
                      base=None, worker_name=None, device=None, total_memory=None, warn=True):
    """The stack spec of dask-cuda's RMM options, with their meaning (see
    the module's text). `base` replaces the base resource ("host" runs the
    same stack without a GPU); `worker_name` and `device` name the log file;
    `total_memory` is what fractions are of (default: the device's total,
    asked for only when a fraction is given). Raises ValueError where
    dask-cuda does (rmm_managed_memory with rmm_async, rmm_release_threshold
    without it, an external library it does not know, a size dask cannot
    parse) and warns as it does (FutureWarning: rmm_pool_size with
    rmm_async; `warn=False` keeps it quiet, for the workers)."""
    import warnings
    from ._sizes import device_bytes
    if rmm_async is True and rmm_managed_memory is True:
        raise ValueError("`rmm_managed_memory` is incompatible with the `rmm_async`.")
    if rmm_async is False and rmm_release_threshold is not None:
        raise ValueError("`rmm_release_threshold` requires `rmm_async`.")
    external_libs(rmm_allocator_external_lib_list)
    if warn and rmm_async and rmm_pool_size is not None:
        warnings.warn("'rmm_pool_size' is not needed when 'rmm_async' is enabled and will raise "
                      "an exception in the future. Remove the 'rmm_pool_size' argument when "
                      "creating this cluster to silence this warning.", FutureWarning,
                      stacklevel=2)
    dev = 0 if device is None else device

    def total():
        return total_memory if total_memory is not None else _total_memory(base, device)

    def size(value):
        return device_bytes(value, total, alignment=256)

    initial = size(rmm_pool_size)
    layers = []
    logged = False
    if rmm_async:
        opts = []
        if initial is not None:
            opts.append("initial=%d" % initial)
        threshold = size(rmm_release_threshold)
        if threshold is not None:
            opts.append("release_threshold=%d" % threshold)
        limit = size(rmm_maximum_pool_size)
        if limit is not None:
            layers.append("limiting(limit=%d)" % limit)
        layers.append(base or ("cuda_async(%s)" % ", ".join(opts) if opts else "cuda_async"))
        logged = True
    elif initial is not None or rmm_managed_memory:
        if initial is not None:
            opts = ["initial=%d" % initial]
            maximum = size(rmm_maximum_pool_size)
            if maximum is not None:
                opts.append("maximum_size=%d" % maximum)
            layers.append("pool(%s)" % ", ".join(opts))
        layers.append(base or ("managed" if rmm_managed_memory else "cuda"))
        logged = True
    else:
        layers.append(base or "cuda")  # dask-cuda leaves RMM alone: the maximum is ignored
    if rmm_log_directory is not None and logged:
        name = worker_name if worker_name is not None else "scheduler"
        layers.insert(0, "logging(path=%s)" % _quote(os.path.abspath(
            worker_log_path(rmm_log_directory, name, dev))))
    if rmm_track_allocations:
        layers.insert(0, "tracking")
    return " > ".join(layers)


def _torch_started():
    import sys
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_initialized()


try:
    from distributed.diagnostics.plugin import WorkerPlugin as _WorkerPlugin
except ImportError:  # rmmc.dask without Dask: spec_from_options still works
    _WorkerPlugin = object


class RmmcPlugin(_WorkerPlugin):
    """Gives every worker its own rmmc stack (see the module's text).

    `spec`: the stack, or None to build it from dask-cuda's options
    (`options`: rmm_pool_size=..., ...). `per_worker`: {worker name: spec}
    for workers that need another. `cupy`/`torch`: route that framework
    through rmmc on the worker (True: always, failing the setup if it
    cannot; "auto": when it is installed, and for PyTorch when it has not
    started CUDA on the worker; False: never). `device`: the device each
    worker's stack serves (None: the worker's current device, 0 for a worker
    that sees one GPU through CUDA_VISIBLE_DEVICES). `rmm`: make the stack
    RMM's current resource on the worker too (rmmc.rmm.use), so cuDF and
    everything that allocates through RMM uses it: "auto" when RMM is
    installed (a failure to set it up warns), True always (and raise),
    False never."""

    name = PLUGIN_NAME

    def __init__(self, spec=None, per_worker=None, cupy="auto", torch="auto", device=None,
                 rmm="auto", **options):
        if spec is not None and options:
            raise ValueError("give a spec or dask-cuda's options, not both (%s)"
                             % ", ".join(sorted(options)))
        if spec is None:
            # Refuse bad options here, not on every worker (fractions of a
            # stand-in total: the worker resolves them on its own device).
            spec_from_options(total_memory=1 << 40, **options)
        libs = external_libs(options.get("rmm_allocator_external_lib_list"))
        if libs is not None:  # dask-cuda routes the listed frameworks, and only those
            cupy, torch = "cupy" in libs, "torch" in libs
        self.spec = spec
        self.options = options
        self.per_worker = dict(per_worker or {})
        self.cupy = cupy
        self.torch = torch
        self.rmm = rmm
        self.device = device

    def worker_spec(self, worker_name):
        """The spec the worker named `worker_name` gets."""
        for key in (worker_name, str(worker_name)):
            if key in self.per_worker:
                return self.per_worker[key]
        if self.spec is not None:
            return self.spec
        return spec_from_options(worker_name=worker_name, device=self.device, warn=False,
                                 **self.options)

    def setup(self, worker):
        name = getattr(worker, "name", None)
        spec = self.worker_spec(name)
        if self.options.get("rmm_log_directory"):
            os.makedirs(self.options["rmm_log_directory"], exist_ok=True)
        stack = Resource(spec, self.device)
        try:
            set_default(stack, self.device)
            routed = []
            if self.rmm:
                try:
                    from . import rmm as rrmm
                    rrmm.use(stack, self.device)
                    routed.append("rmm")
                except Exception as e:
                    if self.rmm is True:
                        raise
                    if not isinstance(e, ImportError):
                        import warnings
                        warnings.warn("rmmc.dask: the worker's stack could not be made RMM's "
                                      "resource (%s: %s)" % (type(e).__name__, e),
                                      RuntimeWarning)
            if self.cupy:
                try:
                    from . import cupy as rcupy
                    rcupy.use()
                    routed.append("cupy")
                except ImportError:
                    if self.cupy is True:
                        raise
            if self.torch and "torch" in _ROUTED:
                # Routed by an earlier plugin in this worker: PyTorch's
                # allocator is rmmc's already and cannot be swapped again;
                # it allocates from the registry, which now holds `stack`.
                routed.append("torch")
            elif self.torch:
                if self.torch is True or not _torch_started():
                    try:
                        from . import torch as rtorch
                        rtorch.use()
                        routed.append("torch")
                        _ROUTED.add("torch")
                    except ImportError:
                        if self.torch is True:
                            raise
        except BaseException:
            stack.close()
            raise
        old = _WORKER.pop("stack", None)
        if old is not None:
            old.close()
        _WORKER.update(stack=stack, spec=spec, name=name, routed=routed)

    def teardown(self, worker):
        stack = _WORKER.pop("stack", None)
        _WORKER.clear()
        if stack is not None:
            stack.close()  # the registry keeps its own reference while it serves


def install(client, spec=None, **kwargs):
    """Registers RmmcPlugin(spec, **kwargs) with the client's cluster: every
    worker, now and later, gets its stack. Returns the plugin. A worker
    whose setup fails (a spec that does not parse, a device it cannot use)
    raises here with that worker's error."""
    plugin = RmmcPlugin(spec, **kwargs)
    if hasattr(client, "register_plugin"):
        client.register_plugin(plugin)
    else:  # dask.distributed before 2023.9
        client.register_worker_plugin(plugin)
    return plugin


def worker_figures(dask_worker=None):
    """This worker's figures (rmmc.dist.rank_figures of its stack) plus the
    worker's name, spec and the frameworks routed. Runs on a worker
    (client.run(rmmc.dask.worker_figures)); raises RuntimeError where the
    plugin has not set a stack up."""
    stack = _WORKER.get("stack")
    if stack is None:
        raise RuntimeError("rmmc.dask: this worker has no rmmc stack (install the plugin first: "
                           "rmmc.dask.install(client, spec))")
    name = _WORKER.get("name")
    if dask_worker is not None:
        name = getattr(dask_worker, "name", name)
    return _dist.rank_figures(stack, rank=name if name is not None else 0,
                              extra={"worker": str(name), "spec": _WORKER["spec"],
                                     "routed": ",".join(_WORKER["routed"]) or "-",
                                     "visible": os.environ.get("CUDA_VISIBLE_DEVICES", "")})


def collect_figures(client, workers=None):
    """Every worker's figures in one call: {worker address: figures}."""
    return client.run(worker_figures, workers=workers)


WORKER_COLUMNS = (("worker", "worker"), ("visible", "gpu"), ("stack", "stack"),
                  ("routed", "routed"), ("live", "live"), ("peak_live", "peak live"),
                  ("reserved", "reserved"), ("peak_reserved", "peak reserved"))


def figures_table(client, workers=None):
    """collect_figures() laid out by rmmc.dist.format_table, a row per worker."""
    rows = []
    for i, (_, f) in enumerate(sorted(collect_figures(client, workers).items(),
                                      key=lambda kv: str(kv[1].get("worker")))):
        f = dict(f, rank=i)
        rows.append(f)
    return _dist.format_table(rows, WORKER_COLUMNS)


def gpu_cluster(n_workers=None, devices=None, threads_per_worker=1, **kwargs):
    """A dask.distributed SpecCluster with one worker process (a Nanny) per
    GPU, each seeing only its own GPU (CUDA_VISIBLE_DEVICES), named by the
    device number ("0", "1", ...). `devices`: the device numbers (default
    0..n_workers-1, n_workers defaulting to every visible GPU). Extra
    keyword arguments go to SpecCluster (asynchronous, ...); no dask-cuda
    or RMM is needed. With devices=[...] and no GPU it starts host workers
    all the same (CI runs host stacks on them)."""
    from distributed import Nanny, Scheduler, SpecCluster
    if devices is None:
        if n_workers is None:
            from . import device_count
            n_workers = device_count()
        if n_workers < 1:
            raise ValueError("gpu_cluster: no GPU visible (give devices=[...] or n_workers)")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [d.strip() for d in visible.split(",")] if visible else None
        devices = [ids[i] if ids and i < len(ids) else str(i) for i in range(n_workers)]
    silence = kwargs.pop("silence_logs", 40)
    workers = {}
    for d in devices:
        workers[str(d)] = {"cls": Nanny, "options": {
            "nthreads": threads_per_worker, "env": {"CUDA_VISIBLE_DEVICES": str(d)},
            "memory_limit": 0, "silence_logs": silence}}
    scheduler = {"cls": Scheduler, "options": {"dashboard_address": None}}
    return SpecCluster(workers=workers, scheduler=scheduler, **kwargs)
