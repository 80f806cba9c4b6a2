# SPDX-License-Identifier: Apache-2.0
"""One reference to a C resource, shared by threads (DESIGN.md contract 15).

A Python object that holds a stack holds one rmmc reference on it, and the
C calls it makes must not outlive that reference. Ref makes the two safe
together: a call takes the handle with ``with ref as h:``; close() drops
the reference once (a second close, or one on another thread, does
nothing), and when calls are still under way on other threads the last of
them drops it as it finishes. A call after close() raises the closed
error. The lock guards only the counters, never a C call.
"""
import threading

from ._lib import InvalidArgumentError, lib


class Ref:
    __slots__ = ("_h", "_users", "_closing", "_lock", "_what")

    def __init__(self, handle, what):
        self._h = handle
        self._users = 0
        self._closing = False
        self._lock = threading.Lock()
        self._what = what

    @property
    def closed(self):
        return self._h is None or self._closing

    def peek(self):
        """The handle without taking it (None once closed): for repr and
        identity checks, never for a C call."""
        return None if self._closing else self._h

    def __enter__(self):
        with self._lock:
            if self._h is None or self._closing:
                raise InvalidArgumentError(-1, "this %s is closed" % self._what)
            self._users += 1
            return self._h

    def __exit__(self, *exc):
        with self._lock:
            self._users -= 1
            h = self._h if self._closing and self._users == 0 else None
            if h is not None:
                self._h = None
        if h is not None:
            lib().rmmc_resource_release(h)
        return False

    def close(self):
        """Drops the reference (now, or when the calls under way finish).
        True for the call that closed it."""
        with self._lock:
            if self._h is None or self._closing:
                return False
            self._closing = True
            h = self._h if self._users == 0 else None
            if h is not None:
                self._h = None
        if h is not None:
            lib().rmmc_resource_release(h)
        return True
