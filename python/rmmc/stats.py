# SPDX-License-Identifier: Apache-2.0
"""RMM's ``rmm.statistics`` over rmmc: statistics of the current device's
resource, a stack of counters, and a memory profiler.

    import rmmc.stats as stats
    stats.enable_statistics()            # wraps the current resource once
    with stats.profiler(name="step"):
        train_step()
    print(stats.default_profiler_records.report())

The module is rmmc.stats (``rmmc.statistics`` is the older context
manager, which rmmc.stats.statistics also is). The figures carry RMM's
names: current_bytes, current_count, peak_bytes, peak_count, total_bytes,
total_count.
"""
import ctypes
import functools
import threading
from collections import defaultdict
from dataclasses import dataclass

from . import _STATS_LOCK, _statistics_block
from ._counters import Statistics, _from_struct, _pop, _push, _read, _struct
from ._lib import check, lib
from .mr import (StatisticsResourceAdaptor, get_current_device_resource,
                 set_current_device_resource)

__all__ = ["Statistics", "enable_statistics", "get_statistics", "push_statistics",
           "pop_statistics", "statistics", "ProfilerRecords", "ProfilerContext", "profiler",
           "default_profiler_records"]

def _current_statistics():
    """The current device's resource object if its outermost layer is
    statistics (the object holds its own reference: use its handle while
    it is alive), else None."""
    mr = get_current_device_resource()
    return mr if mr.resource.name == "statistics" else None


def enable_statistics():
    """Wraps the current device's resource in a StatisticsResourceAdaptor,
    unless its outermost layer already is one. Threads that enable at once
    wrap it once (the check and the set hold statistics()'s lock)."""
    with _STATS_LOCK:
        if _current_statistics() is None:
            set_current_device_resource(StatisticsResourceAdaptor(get_current_device_resource()))


def get_statistics():
    """The current scope's Statistics, or None when statistics are not enabled."""
    mr = _current_statistics()
    return None if mr is None else mr._call(_read)


def push_statistics():
    """Opens a scope of counters; returns the Statistics before it (None
    when statistics are not enabled). The stack of counters is the
    layer's, shared by every thread (as RMM's): pop_statistics() ends the
    innermost scope, whoever pushed it. Threads that measure blocks of
    their own use statistics() or profiler, whose scopes end in any order."""
    mr = _current_statistics()
    return None if mr is None else mr._call(_push)


def pop_statistics():
    """Closes the innermost scope and returns its Statistics (None when
    statistics are not enabled)."""
    mr = _current_statistics()
    return None if mr is None else mr._call(_pop)


statistics = _statistics_block  # rmm.statistics.statistics(): a counting block


@dataclass
class MemoryRecord:
    """What the profiler saw of one name: calls, the bytes allocated in
    all of them, the highest peak of one."""
    num_calls: int = 0
    memory_total: int = 0
    memory_peak: int = 0

    def add(self, memory_total, memory_peak):
        self.num_calls += 1
        self.memory_total += memory_total
        self.memory_peak = max(self.memory_peak, memory_peak)


class ProfilerRecords:
    """Records of named code blocks (RMM's ProfilerRecords)."""
    MemoryRecord = MemoryRecord

    def __init__(self):
        self._lock = threading.Lock()
        self._records = defaultdict(MemoryRecord)

    def add(self, name, data):
        with self._lock:
            self._records[name].add(data.total_bytes, data.peak_bytes)

    @property
    def records(self):
        with self._lock:
            return dict(self._records)

    def report(self, ordered_by="memory_peak"):
        """A table of the records, largest first by `ordered_by`
        (memory_peak, memory_total or num_calls)."""
        if ordered_by not in ("memory_peak", "memory_total", "num_calls"):
            raise ValueError("ordered_by is memory_peak, memory_total or num_calls, not %r"
                             % (ordered_by,))
        rows = sorted(self.records.items(), key=lambda kv: getattr(kv[1], ordered_by),
                      reverse=True)
        lines = ["Memory Profiling", "================", "",
                 "Ordered by: %s" % ordered_by, "",
                 "%10s %16s %16s  %s" % ("ncalls", "memory_peak", "memory_total", "filename")]
        for name, r in rows:
            lines.append("%10d %16d %16d  %s" % (r.num_calls, r.memory_peak, r.memory_total,
                                                  name))
        return "\n".join(lines) + "\n"

    def __repr__(self):
        return "ProfilerRecords(%r)" % (self.records,)


default_profiler_records = ProfilerRecords()


class ProfilerContext:
    """Records the memory a function or a block allocates through the
    current device's resource (RMM's ProfilerContext): a decorator, named
    after the function when `name` is empty, or a context manager (a name
    needed). Does nothing when statistics are not enabled (as RMM). Each
    block has a scope of its own on the statistics layer (counting what the
    resource hands out, on any thread, while it runs), so blocks on many
    threads at once end in whatever order they finish."""

    def __init__(self, records, name):
        self.records = records
        self.name = name
        self._open = threading.local()  # this thread's open blocks: (layer object, scope id)

    def __call__(self, func):
        name = self.name or "%s:%s" % (getattr(func, "__module__", "?"), func.__qualname__)

        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            with ProfilerContext(self.records, name):
                return func(*args, **kwargs)
        return wrapper

    def __enter__(self):
        if not self.name:
            raise ValueError("When profiler is used as a context manager, a name must be "
                             "provided")
        mr = _current_statistics()
        opened = None
        if mr is not None:
            sid = ctypes.c_uint64()
            check(mr._call(lib().rmmc_statistics_adaptor_push_scope, ctypes.byref(sid)),
                  "profiler")
            opened = (mr, sid.value)
        stack = getattr(self._open, "stack", None)
        if stack is None:
            stack = self._open.stack = []
        stack.append(opened)
        return self

    def __exit__(self, *exc):
        opened = self._open.stack.pop()
        if opened is not None:
            mr, sid = opened
            s = _struct()
            check(mr._call(lib().rmmc_statistics_adaptor_pop_scope, sid, ctypes.byref(s)),
                  "profiler")
            self.records.add(self.name, _from_struct(s))
        return False


def profiler(*, records=default_profiler_records, name=""):
    """RMM's profiler(): a ProfilerContext writing to `records` (default
    default_profiler_records): ``@profiler()`` or ``with profiler(name="x"):``."""
    return ProfilerContext(records, name)
