# SPDX-License-Identifier: Apache-2.0
"""rmmc's figures from every rank (or worker) of a distributed job, as one table.

Each process of a torchrun job (or each Dask worker) has its own rmmc stack
on its own device. rank_figures() reads this process's figures as a plain
dict; gather_figures() brings every rank's dict to rank 0 over the job's
torch.distributed process group (any backend: NCCL, or gloo on the CPU);
format_table() lays a list of them out, one row per rank;
distributed_summary() does all three:

    import rmmc.dist
    ...                                   # after training, on every rank
    text = rmmc.dist.distributed_summary(extra={"step_ms": median_ms})
    if text is not None:                  # rank 0
        print(text)

The figures of one rank (all bytes are ints):
    rank, world, host, pid, device     where it ran
    stack                              the layers' names, outermost first
    live, peak_live                    bytes handed out now / at most (the
                                       outermost layer's in_use; the peak of
                                       a statistics layer if the stack has
                                       one, else the outermost layer's peak:
                                       a pool's counts the spans it lent to
                                       stream heaps, so put statistics on top
                                       for the exact figure)
    reserved, peak_reserved            bytes the stack holds from the device
                                       now / at most (the largest "reserved"
                                       and "reserved_peak" of any layer)
    plugin_peak, plugin_live           the PyTorch/CuPy plug-ins' figures
                                       for the device, when they allocated
    layers                             [(name, figures)] of every layer
plus whatever `extra` adds (losses, step times).

Without an initialized process group gather_figures() returns this process's
row alone, so the same code runs in a single-process job.
"""
import os
import socket

from . import Resource, get_default, plugin_stats

__all__ = ["stack_summary", "rank_figures", "gather_figures", "format_table",
           "distributed_summary", "human_bytes", "COLUMNS"]

# The columns format_table() prints by default: (key, heading).
COLUMNS = (("rank", "rank"), ("host", "host"), ("device", "dev"), ("stack", "stack"),
           ("live", "live"), ("peak_live", "peak live"), ("reserved", "reserved"),
           ("peak_reserved", "peak reserved"))

_BYTE_KEYS = {"live", "peak_live", "reserved", "peak_reserved", "plugin_live", "plugin_peak"}


def stack_summary(layers):
    """The summary figures of a stack from its layers ([(name, figures)],
    outermost first, as Resource.layers() gives): stack, live, peak_live,
    reserved, peak_reserved (see the module's text). A figure no layer
    reports is None. Pure: no rmmc call."""
    if not layers:
        return {"stack": "", "live": None, "peak_live": None, "reserved": None,
                "peak_reserved": None}
    names = [name for name, _ in layers]
    top = layers[0][1]
    live = top.get("in_use")
    # A statistics layer counts exactly what was handed out; a pool's own
    # "peak" is its committed peak (spans lent to stream heaps included).
    stats = [f for name, f in layers if name == "statistics" and "peak" in f]
    peak_live = stats[0]["peak"] if stats else top.get("peak")
    if peak_live is None:  # an outermost layer that keeps no peak: the highest below
        peaks = [f["peak"] for _, f in layers if "peak" in f]
        peak_live = max(peaks) if peaks else None
    reserved = [f["reserved"] for _, f in layers if "reserved" in f]
    peak_reserved = [f["reserved_peak"] for _, f in layers if "reserved_peak" in f]
    out = {"stack": " > ".join(names), "live": None if live is None else int(live),
           "peak_live": None if peak_live is None else int(peak_live),
           "reserved": int(max(reserved)) if reserved else None}
    if peak_reserved:
        out["peak_reserved"] = int(max(peak_reserved))
    else:  # a stack without a pool (cuda, host): what it holds is what it handed out
        out["peak_reserved"] = out["reserved"] if out["reserved"] is not None else out["peak_live"]
    return out


def _rank_and_world():
    try:
        import torch.distributed as td
        if td.is_available() and td.is_initialized():
            return td.get_rank(), td.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def rank_figures(resource=None, device=None, extra=None, rank=None):
    """This process's figures as a dict (see the module's text). `resource`:
    the stack to read (a Resource); None reads the registry's stack of
    `device` (None: the current device), which the PyTorch and CuPy
    plug-ins allocate from. `extra` (a dict) is merged in last. `rank`
    defaults to the process group's rank, else $RANK, else 0."""
    r, world = _rank_and_world()
    if rank is not None:
        r = rank
    if resource is None:
        with get_default(device) as res:
            layers, dev = res.layers(), res.device
    elif isinstance(resource, Resource):
        layers, dev = resource.layers(), resource.device
    else:
        raise TypeError("resource must be an rmmc.Resource or None, not %s"
                        % type(resource).__name__)
    out = {"rank": r, "world": world, "host": socket.gethostname(), "pid": os.getpid(),
           "device": dev}
    out.update(stack_summary(layers))
    plug = plugin_stats(dev if dev >= 0 else -1)
    if plug["allocations"]:
        out["plugin_live"] = plug["bytes_in_use"]
        out["plugin_peak"] = plug["peak_bytes"]
    out["layers"] = [(name, dict(f)) for name, f in layers]
    if extra:
        out.update(extra)
    return out


def gather_figures(figures=None, group=None, dst=0):
    """Brings every rank's `figures` (a dict; None: rank_figures()) to rank
    `dst` over torch.distributed (gather_object, so any backend works: with
    NCCL the current device must be set, as it is in a training job).
    Returns the list ordered by rank on `dst` and None on the other ranks;
    without an initialized process group, [figures]. Every rank of the group
    must call it (it is a collective)."""
    if figures is None:
        figures = rank_figures()
    try:
        import torch.distributed as td
    except ImportError:
        return [figures]
    if not (td.is_available() and td.is_initialized()):
        return [figures]
    world = td.get_world_size(group)
    me = td.get_rank(group) if group is not None else td.get_rank()
    out = [None] * world if me == dst else None
    td.gather_object(figures, out, dst=dst, group=group)
    return out


def human_bytes(n):
    """`n` bytes as "1.50 GiB" ("-" for None)."""
    if n is None:
        return "-"
    n = int(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return "%d B" % n if unit == "B" else "%.2f %s" % (n, unit)
        n /= 1024.0
    return "%.2f TiB" % n  # not reached


def _cell(key, value):
    if value is None:
        return "-"
    if key in _BYTE_KEYS or key.endswith("_bytes"):
        return human_bytes(value)
    if isinstance(value, float):
        return "%.3f" % value
    if isinstance(value, (list, tuple)):
        return "%d values" % len(value)
    return str(value)


def format_table(rows, columns=None):
    """One line per row (dict) under a heading, sorted by rank, then a total
    line for the byte columns when there are several rows. `columns`:
    [(key, heading)] (default COLUMNS, plus every plain key `extra` added
    that all rows share). Pure: works on dicts gathered any way."""
    rows = sorted((r for r in rows if r is not None), key=lambda r: r.get("rank", 0))
    if columns is None:
        columns = list(COLUMNS)
        known = {k for k, _ in columns} | {"world", "pid", "layers"}
        if rows:
            shared = [k for k in rows[0] if k not in known and all(k in r for r in rows[1:])
                      and not isinstance(rows[0][k], (dict, list, tuple))]
            columns += [(k, k) for k in shared]
    table = [[h for _, h in columns]]
    for r in rows:
        table.append([_cell(k, r.get(k)) for k, _ in columns])
    if len(rows) > 1:
        total = []
        for i, (k, _) in enumerate(columns):
            vals = [r.get(k) for r in rows]
            if k in _BYTE_KEYS and all(isinstance(v, int) for v in vals):
                total.append(human_bytes(sum(vals)))
            else:
                total.append("all %d" % len(rows) if i == 0 else "")
        table.append(total)
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if j else c.ljust(w) for j, (c, w) in enumerate(zip(line, widths)))
             .rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if len(rows) > 1:
        lines.insert(len(lines) - 1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def distributed_summary(resource=None, device=None, extra=None, group=None, dst=0):
    """rank_figures() on every rank, gathered to `dst` and laid out by
    format_table(): the text on rank `dst`, None on the others. A
    collective: every rank calls it."""
    rows = gather_figures(rank_figures(resource, device, extra), group=group, dst=dst)
    return None if rows is None else format_table(rows)
