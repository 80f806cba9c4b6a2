# SPDX-License-Identifier: Apache-2.0
"""rmm.statistics by its RMM name: ``import rmmc.statistics`` (or ``import
rmmc as rmm; rmm.statistics.enable_statistics()``). The same module as
rmmc.stats (Statistics, enable_statistics, get_statistics,
push_statistics, pop_statistics, statistics, ProfilerRecords, profiler,
default_profiler_records). rmmc.statistics also stays callable as before:
``with rmmc.statistics() as s:`` is rmmc.stats.statistics()."""
import sys
import types

from .stats import (ProfilerContext, ProfilerRecords, Statistics, default_profiler_records,  # noqa: F401
                    enable_statistics, get_statistics, pop_statistics, profiler, push_statistics,
                    statistics)
from .stats import __all__  # noqa: F401


class _CallableModule(types.ModuleType):
    """The module, callable as the context manager it replaces on the
    package (rmmc.statistics(device=None))."""

    def __call__(self, *args, **kwargs):
        return statistics(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
