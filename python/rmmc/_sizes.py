# SPDX-License-Identifier: Apache-2.0
"""Sizes as RMM and Dask read them (rmmc's specs have their own rule:
binary units only, "1GB" refused, a percentage of free memory).

- rmm_parse_bytes: RMM's rmm.pylibrmm.helper.parse_bytes (what
  rmm.reinitialize and the rmm.mr constructors take): an int as it is; a
  str is a number with an optional case-insensitive unit b, kb..pb
  (powers of 1000), kib..pib (powers of 1024): "1GB" = 10**9, "1GiB" =
  2**30; anything else is a ValueError.
- dask_parse_bytes: dask.utils.parse_bytes (what dask-cuda's options
  take): numbers as int(x); "5000M" = 5 * 10**9, "1GB" = 10**9, "1GiB" =
  2**30, "kB", "k", "Mi", ...; a unit alone means one of it.
- device_bytes: dask-cuda's parse_device_bytes: a float in (0, 1] (or a
  str that reads as one, but not int 1 or "1") is that fraction of the
  device's TOTAL memory; None, 0, 0.0 and what parses to 0 are None; the
  rest through dask_parse_bytes; all aligned down to `alignment`.
tests/python/test_sizes.py holds dask_parse_bytes against Dask's own.
"""
from __future__ import annotations

import re
from typing import Callable, Optional, Union

__all__ = ["rmm_parse_bytes", "dask_parse_bytes", "device_bytes"]

_RMM_UNITS = {"b": 1, "": 1, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4,
              "pb": 1000 ** 5, "kib": 1024, "mib": 1024 ** 2, "gib": 1024 ** 3,
              "tib": 1024 ** 4, "pib": 1024 ** 5}
_RMM_PATTERN = re.compile(r"^([0-9]+(?:\.[0-9]*)?)[\t ]*((?i:(?:[kmgtp]i?)?b))?$")


def rmm_parse_bytes(s: Union[int, str]) -> int:
    """RMM's parse_bytes (see the module's text)."""
    if isinstance(s, int):
        return s
    if not isinstance(s, str):
        raise TypeError("a size is an int or a str, not %s" % type(s).__name__)
    m = _RMM_PATTERN.match(s)
    if m is None:
        raise ValueError("Could not parse %s as a byte specification" % s)
    try:
        return int(float(m.group(1)) * _RMM_UNITS[(m.group(2) or "").lower()])
    except OverflowError:
        raise ValueError("Could not parse %s as a byte specification" % s) from None


def _dask_units():
    sizes = {"kB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12, "PB": 10 ** 15,
             "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30, "TiB": 2 ** 40, "PiB": 2 ** 50,
             "B": 1, "": 1}
    sizes = {k.lower(): v for k, v in sizes.items()}
    sizes.update({k[0]: v for k, v in sizes.items() if k and "i" not in k})
    sizes.update({k[:-1]: v for k, v in sizes.items() if k and "i" in k})
    return sizes


_DASK_UNITS = _dask_units()


def dask_parse_bytes(s: Union[int, float, str]) -> int:
    """dask.utils.parse_bytes (see the module's text)."""
    if isinstance(s, (int, float)):
        return int(s)
    s = s.replace(" ", "")
    if not any(c.isdigit() for c in s):
        s = "1" + s
    i = len(s) - 1
    while i >= 0 and s[i].isalpha():
        i -= 1
    prefix, suffix = s[:i + 1], s[i + 1:]
    try:
        n = float(prefix)
    except ValueError as e:
        raise ValueError("Could not interpret '%s' as a number" % prefix) from e
    try:
        multiplier = _DASK_UNITS[suffix.lower()]
    except KeyError as e:
        raise ValueError("Could not interpret '%s' as a byte unit" % suffix) from e
    return int(n * multiplier)


def _fraction(v) -> Optional[float]:
    """v as a fraction in (0, 1], or None (int 1 and "1" are bytes)."""
    if not isinstance(v, float) and (v == 1 or v == "1"):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if 0.0 < f <= 1.0 else None


def device_bytes(value, total: Callable[[], int], alignment: int = 1) -> Optional[int]:
    """dask-cuda's parse_device_bytes; `total()` gives the device's total
    memory, asked for only when `value` is a fraction."""
    f = _fraction(value)
    if f is not None:
        return int(total() * f) // alignment * alignment
    if value is None or value == 0.0:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError("a size is an int (bytes), a float (a fraction of the device's total "
                        "memory) or a str such as '5GB', not %r" % (value,))
    if not isinstance(value, float) and dask_parse_bytes(value) == 0:
        return None
    n = dask_parse_bytes(value) if isinstance(value, str) else int(value)
    if n < 0:
        raise ValueError("a size must be >= 0, not %r" % (value,))
    return n // alignment * alignment
