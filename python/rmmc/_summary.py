# SPDX-License-Identifier: Apache-2.0
"""The short reports: memory_summary() (a table per layer, as
torch.cuda.memory_summary() lays out its figures), memory_summary_line()
(one line, as CUDA.jl's memory_status()), and what `python -m rmmc` prints
(rmmc/__main__.py). rmmc.memory_status() stays the long report: every
figure of every layer."""
from __future__ import annotations

import ctypes
from typing import Dict, List, Optional, Tuple

__all__ = ["memory_summary", "memory_summary_line", "device_names"]

# The figures a row shows, per column: the first key a layer reports wins
# ("in_use" is bytes held by callers; "peak" only where it is the peak of
# those: the pool's and arena's "peak" counts spans lent to stream heaps).
_PEAK_IS_LIVE = ("statistics", "fixed_size")


def _fmt(n: Optional[int]) -> str:
    if n is None:
        return "-"
    from ._lib import lib
    buf = ctypes.create_string_buffer(32)
    return lib().rmmc_format_bytes(int(n), buf, len(buf)).decode()


def _row(name: str, f: Dict) -> Tuple[str, Optional[int], Optional[int], Optional[int],
                                      Optional[int], Optional[int], Optional[int], Optional[int]]:
    current = f.get("in_use")
    peak = f.get("peak") if name in _PEAK_IS_LIVE else None
    reserved = f.get("reserved")
    allocated = f.get("total")           # bytes ever handed out (statistics)
    count = f.get("allocations")
    deallocs = f.get("deallocations")
    freed = allocated - current if allocated is not None and current is not None else None
    return name, current, peak, reserved, allocated, freed, count, deallocs


def _stack_layers(device: Optional[int]) -> List[Tuple[str, Dict]]:
    from . import stack_figures
    return stack_figures(device)


def memory_summary(device: Optional[int] = None) -> str:
    """A table of the device's stack (the registry's; built from the default
    spec on first use), a row per layer, outermost first: current (bytes
    held by callers), peak (of those, where the layer knows it: statistics,
    fixed_size), reserved (taken from the layer's upstream), allocated and
    freed (bytes handed out and given back over the stack's life, from a
    statistics layer) and the allocation and free counts. "-": the layer
    does not keep that figure. Then the device's free and total memory."""
    from . import _device
    dev = _device(device)
    rows = [_row(n, f) for n, f in _stack_layers(dev)]
    head = ("layer", "current", "peak", "reserved", "allocated", "freed", "allocs", "frees")
    cells = [head] + [(r[0],) + tuple(_fmt(v) for v in r[1:6]) +
                      tuple("-" if v is None else str(v) for v in r[6:]) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(head))]
    title = "rmmc memory summary, device %d" % dev
    line = "  ".join(h.ljust(widths[0]) if i == 0 else h.rjust(widths[i])
                     for i, h in enumerate(head))
    out = [title, "=" * max(len(title), len(line)), line, "-" * len(line)]
    for c in cells[1:]:
        out.append("  ".join(v.ljust(widths[0]) if i == 0 else v.rjust(widths[i])
                             for i, v in enumerate(c)))
    free_total = _free_total(dev)
    if free_total is not None:
        out.append("-" * len(line))
        out.append("device %d: %s free of %s" % (dev, _fmt(free_total[0]), _fmt(free_total[1])))
    return "\n".join(out) + "\n"


def _free_total(dev: int) -> Optional[Tuple[int, int]]:
    from .mr import available_device_memory
    try:
        return available_device_memory(dev)
    except Exception:  # no GPU: a host stack
        return None


def memory_summary_line(device: Optional[int] = None) -> str:
    """One line: the stack's bytes held by callers, its reserved bytes
    (and peak where a layer knows it), the device's used share, the stack."""
    from . import _device
    dev = _device(device)
    layers = _stack_layers(dev)
    current = next((f["in_use"] for _, f in layers if "in_use" in f), None)
    reserved = next((f["reserved"] for _, f in layers if "reserved" in f), None)
    peak = next((f["peak"] for n, f in layers if n in _PEAK_IS_LIVE and "peak" in f), None)
    parts = ["%s in use" % _fmt(current or 0)]
    if peak is not None:
        parts.append("%s peak" % _fmt(peak))
    if reserved is not None:
        parts.append("%s reserved" % _fmt(reserved))
    text = "device %d: %s" % (dev, ", ".join(parts))
    ft = _free_total(dev)
    if ft is not None and ft[1]:
        used = ft[1] - ft[0]
        text += "; device memory %.2f%% used (%s of %s)" % (100.0 * used / ft[1], _fmt(used),
                                                          _fmt(ft[1]))
    return text + " [%s]" % " > ".join(n for n, _ in layers)


def device_names() -> List[str]:
    """Each visible device's name (the driver's cuDeviceGetName), [] without
    a driver or GPU."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return []
    if cu.cuInit(0) != 0:
        return []
    n = ctypes.c_int()
    if cu.cuDeviceGetCount(ctypes.byref(n)) != 0:
        return []
    names = []
    for i in range(n.value):
        d = ctypes.c_int()
        buf = ctypes.create_string_buffer(256)
        if cu.cuDeviceGet(ctypes.byref(d), i) != 0 or cu.cuDeviceGetName(buf, 256, d) != 0:
            names.append("?")
        else:
            names.append(buf.value.decode(errors="replace"))
    return names
