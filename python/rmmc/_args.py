# SPDX-License-Identifier: Apache-2.0
"""Checking arguments before they reach a C signature.

ctypes converts a Python int to size_t, int or a pointer by keeping the low
bits: allocate(2**64 + 4096) asked for 4096 bytes and allocate(2**70) for
0, and a str with a NUL reached C cut short (issue 25, F11). Every value
the package hands to librmmc goes through one of these first. They raise
what Python's own functions raise for such values: TypeError for the wrong
type (bool and float included: a size is a whole number), ValueError for a
negative size or a NUL in a string (rmmc's InvalidArgumentError, a
ValueError), OverflowError for a number too large for the C type.
"""
import ctypes
import operator

from ._lib import InvalidArgumentError

SIZE_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_size_t))) - 1
POINTER_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_void_p))) - 1
INT_MAX = (1 << (8 * ctypes.sizeof(ctypes.c_int) - 1)) - 1


def _invalid(message):
    return InvalidArgumentError(-1, message)


def integer(value, what):
    """`value` as an int (anything with __index__, numpy's integers too;
    not bool or float)."""
    if isinstance(value, bool):
        raise TypeError("%s must be an int, not bool" % what)
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError("%s must be an int, not %s" % (what, type(value).__name__)) from None


def size(value, what="size"):
    """A size_t: an int from 0 to SIZE_MAX."""
    v = integer(value, what)
    if v < 0:
        raise _invalid("%s must be >= 0, not %d" % (what, v))
    if v > SIZE_MAX:
        raise OverflowError("%s %d is larger than a size_t holds (%d)" % (what, v, SIZE_MAX))
    return v


def pointer(value, what="pointer"):
    """An address (int, or None for NULL): None, or an int from 0 to the
    largest address; 0 becomes None."""
    if value is None:
        return None
    v = integer(value, what)
    if v < 0:
        raise _invalid("%s must be an address >= 0, not %d" % (what, v))
    if v > POINTER_MAX:
        raise OverflowError("%s 0x%x is larger than an address (0x%x)" % (what, v, POINTER_MAX))
    return v or None


def stream(value, what="stream"):
    """A cudaStream_t: None or 0 (the legacy default stream), an int
    handle, or a stream object: rmmc.Stream, RMM's, anything with the CUDA
    stream protocol (__cuda_stream__), PyTorch's (.cuda_stream), CuPy's
    (.ptr), Numba's (.handle)."""
    if value is not None and not isinstance(value, int):
        from ._stream import stream_handle
        value = stream_handle(value)
    return pointer(value, what)


def c_int(value, what, lowest=0):
    """A C int from `lowest` to INT_MAX."""
    v = integer(value, what)
    if v < lowest:
        raise _invalid("%s must be >= %d, not %d" % (what, lowest, v))
    if v > INT_MAX:
        raise OverflowError("%s %d is larger than a C int holds (%d)" % (what, v, INT_MAX))
    return v


def device(value, what="device", allow_all=False):
    """A device number (>= 0; -1 too where it means every device)."""
    return c_int(value, what, -1 if allow_all else 0)


def fd(value, what="file descriptor"):
    """A file descriptor: an int >= 0, or an object with fileno()."""
    if not isinstance(value, int) and hasattr(value, "fileno"):
        value = value.fileno()
    return c_int(value, what)


def text(value, what="spec"):
    """A str for a `const char *`: UTF-8, without NUL (C would stop there)."""
    if not isinstance(value, str):
        raise TypeError("%s must be a str, not %s" % (what, type(value).__name__))
    if "\0" in value:
        raise _invalid("%s contains a NUL character at index %d: C would read only %r"
                         % (what, value.index("\0"), value[:value.index("\0")]))
    return value.encode()
