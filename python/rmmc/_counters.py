# SPDX-License-Identifier: Apache-2.0
"""The counters of a statistics layer as RMM names them
(rmm.statistics.Statistics), read, pushed and popped on a layer's handle.
Below both rmmc.mr (StatisticsResourceAdaptor) and rmmc.stats, which
re-exports Statistics."""
import ctypes
from dataclasses import dataclass

from ._lib import Statistics as _Struct, check, lib

FIGURES = ("current_bytes", "current_count", "peak_bytes", "peak_count", "total_bytes",
           "total_count")


@dataclass
class Statistics:
    """One scope's counters (RMM's rmm.statistics.Statistics)."""
    current_bytes: int
    current_count: int
    peak_bytes: int
    peak_count: int
    total_bytes: int
    total_count: int

    def as_dict(self):
        return {k: getattr(self, k) for k in FIGURES}


def _from_struct(s):
    return Statistics(*(int(getattr(s, k)) for k in FIGURES))


def _struct():
    s = _Struct()
    s.size = ctypes.sizeof(s)
    return s


def _read(handle):
    s = _struct()
    check(lib().rmmc_statistics_adaptor_get(handle, ctypes.byref(s)), "get_statistics")
    return _from_struct(s)


def _push(handle):
    before = _read(handle)
    check(lib().rmmc_statistics_adaptor_push(handle), "push_statistics")
    return before


def _pop(handle):
    s = _struct()
    check(lib().rmmc_statistics_adaptor_pop(handle, ctypes.byref(s)), "pop_statistics")
    return _from_struct(s)
