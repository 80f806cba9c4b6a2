# SPDX-License-Identifier: Apache-2.0
"""RMM's debug-logger calls (rmm.pylibrmm.logger, exported as rmm.*): the
level of the messages the RMM-compatible layer logs, on Python's "rmmc"
logger (the logging module; RMM's go to its own file, rmm_log.txt). The
library itself never prints unless asked; what the layer logs is what RMM
logs at those levels: TrackingResourceAdaptor.log_outstanding_allocations
(debug) and an ArenaMemoryResource's dump on failure (error).

    rmmc.set_logging_level(rmmc.level_enum.debug)
    logging.basicConfig()      # or any handler on logging.getLogger("rmmc")
"""
from __future__ import annotations

import logging
from enum import IntEnum

__all__ = ["level_enum", "should_log", "set_logging_level", "get_logging_level",
           "flush_logger", "set_flush_level", "get_flush_level"]


class level_enum(IntEnum):  # noqa: N801 (RMM's name)
    """RMM's (rapids_logger's) levels, most verbose first."""
    trace = 0
    debug = 1
    info = 2
    warn = 3
    error = 4
    critical = 5
    off = 6
    n_levels = 7


_PY = {level_enum.trace: 5, level_enum.debug: logging.DEBUG, level_enum.info: logging.INFO,
       level_enum.warn: logging.WARNING, level_enum.error: logging.ERROR,
       level_enum.critical: logging.CRITICAL, level_enum.off: logging.CRITICAL + 10}
_state = {"level": level_enum.info, "flush": level_enum.warn}
_logger = logging.getLogger("rmmc")


def _check(level):
    if not isinstance(level, level_enum):
        raise TypeError("level must be an instance of the level_enum enum")


def should_log(level: level_enum) -> bool:
    """True when a message at `level` would be logged (TypeError for a
    level that is not a level_enum)."""
    _check(level)
    return level != level_enum.off and level >= _state["level"]


def set_logging_level(level: level_enum) -> None:
    """The least severe level logged (also the "rmmc" logger's level)."""
    _check(level)
    _state["level"] = level
    _logger.setLevel(_PY.get(level, logging.CRITICAL + 10))


def get_logging_level() -> level_enum:
    return _state["level"]


def flush_logger() -> None:
    """Flushes the "rmmc" logger's handlers."""
    for h in _logger.handlers:
        h.flush()


def set_flush_level(level: level_enum) -> None:
    """Messages at `level` or above are flushed at once."""
    _check(level)
    _state["flush"] = level


def get_flush_level() -> level_enum:
    return _state["flush"]
