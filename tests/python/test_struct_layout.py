# SPDX-License-Identifier: Apache-2.0
"""Every ctypes struct the package declares (rmmc._lib) against
its C header: a small C program compiled here prints sizeof and, for each
field, offsetof and size, and they must equal ctypes'. The constants copied
from the headers are checked the same way. A struct added in Python
without a row here fails the test. Needs a C compiler and the CUDA runtime
headers (the toolkit, or NVIDIA's runtime wheel); skips without them (the
wheel's check runs where the compilers are hidden), fails without them
under RMMC_REQUIRE_LAYOUT=1."""
import ctypes
import glob
import os
import shutil
import subprocess
import sys

import pytest

from rmmc import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ctypes struct -> C type.
STRUCTS = {
    _lib.Field: "rmmc_field_t",
    _lib.Statistics: "rmmc_statistics_t",
    _lib.PluginStats: "rmmc_plugin_stats_t",
    _lib.MemoryHooks: "rmmc_memory_hooks_t",
    _lib.IpcInfo: "rmmc_ipc_info_t",
    _lib.IpcStats: "rmmc_ipc_stats_t",
    _lib.SleepState: "rmmc_pool_sleep_state_t",
    _lib.Buffer: "rmmc_buffer_t",
    _lib.TrackedAllocation: "rmmc_tracked_allocation_t",
    _lib.ResourceOps: "rmmc_resource_ops_t",
    _lib.ResourceBase: "rmmc_resource_t",
}
# Python value -> C expression.
CONSTANTS = {
    "IPC_HANDLE_BYTES": (_lib.IPC_HANDLE_BYTES, "RMMC_IPC_HANDLE_BYTES"),
    "sizeof(IpcHandle)": (ctypes.sizeof(_lib.IpcHandle), "sizeof(rmmc_ipc_handle_t)"),
    "IPC_MAX_FDS": (_lib.IPC_MAX_FDS, "RMMC_IPC_MAX_FDS"),
    "FIELD_BYTES": (_lib.FIELD_BYTES, "RMMC_FIELD_BYTES"),
    "FIELD_COUNT": (_lib.FIELD_COUNT, "RMMC_FIELD_COUNT"),
    "FIELD_TEXT": (_lib.FIELD_TEXT, "RMMC_FIELD_TEXT"),
}
HEADERS = ["resource.h", "statistics_adaptor.h", "plugins.h", "ipc.h", "buffer.h",
           "tracking_adaptor.h", "status.h", "pool_resource.h", "resource_ops.h"]


def cuda_include():
    cands = [os.path.join(os.environ[v], "include") for v in ("CUDA_PATH", "CUDA_HOME")
             if os.environ.get(v)]
    cands += ["/usr/local/cuda/include"]
    cands += [os.path.join(p, "nvidia", "cu13", "include") for p in sys.path if p]
    for c in cands:
        # NVIDIA's runtime wheel ships cuda_runtime_api.h without the crt/
        # headers it includes: such a folder cannot compile the program.
        if all(os.path.exists(os.path.join(c, h))
               for h in ("cuda_runtime_api.h", os.path.join("crt", "host_defines.h"))):
            return c
    return None


def require(ok, reason):
    if ok:
        return
    if os.environ.get("RMMC_REQUIRE_LAYOUT") == "1":
        pytest.fail("RMMC_REQUIRE_LAYOUT=1 but " + reason, pytrace=False)
    pytest.skip(reason)


def program():
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    lines += ['#include "rmmc/%s"' % h for h in HEADERS]
    lines += ["int main(void) {"]
    for cls, ctype in STRUCTS.items():
        lines.append('  printf("%s %%zu\\n", sizeof(%s));' % (ctype, ctype))
        for name, _ in cls._fields_:
            lines.append('  printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));'
                         % (ctype, name, ctype, name, ctype, name))
    for key, (_, expr) in CONSTANTS.items():
        lines.append('  printf("%s %%zu\\n", (size_t)(%s));' % (key, expr))
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_every_struct_is_listed():
    declared = {obj for mod in (_lib,) for obj in vars(mod).values()
                if isinstance(obj, type) and issubclass(obj, ctypes.Structure)
                and obj.__module__ == mod.__name__}
    assert declared == set(STRUCTS), "add the new struct to STRUCTS: %s" % (
        declared ^ set(STRUCTS))


def test_ctypes_structs_match_the_c_headers(tmp_path):
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    require(cc and subprocess.run([cc, "--version"], capture_output=True).returncode == 0,
            "no C compiler")
    inc = cuda_include()
    require(inc, "no CUDA runtime headers")
    require(glob.glob(os.path.join(ROOT, "include", "rmmc", "*.h")), "no rmmc headers")
    src = tmp_path / "layout.c"
    src.write_text(program())
    exe = tmp_path / "layout"
    subprocess.run([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), "-I", inc, str(src),
                    "-o", str(exe)], check=True)
    out = dict(line.split(" ", 1) for line in subprocess.run(
        [str(exe)], check=True, capture_output=True, text=True).stdout.splitlines())
    wrong = []
    for cls, ctype in STRUCTS.items():
        if int(out[ctype]) != ctypes.sizeof(cls):
            wrong.append("sizeof(%s) is %s in C, %d in ctypes (%s)"
                         % (ctype, out[ctype], ctypes.sizeof(cls), cls.__name__))
        for name, _ in cls._fields_:
            off, size = map(int, out["%s.%s" % (ctype, name)].split())
            f = getattr(cls, name)
            if (off, size) != (f.offset, f.size):
                wrong.append("%s.%s: offset %d size %d in C, offset %d size %d in ctypes"
                             % (ctype, name, off, size, f.offset, f.size))
    for key, (value, expr) in CONSTANTS.items():
        if int(out[key]) != value:
            wrong.append("%s is %s in C (%s), %d in Python" % (key, out[key], expr, value))
    assert not wrong, "\n".join(wrong)
