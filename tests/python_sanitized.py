# SPDX-License-Identifier: Apache-2.0
"""Runs Python over a librmmc built with AddressSanitizer (and UBSan).

An uninstrumented interpreter cannot dlopen an ASan library: the ASan
runtime must be the first library of the process ("ASan runtime does not
come first in initial library list"). This finds the runtime the library
itself links (its DT_NEEDED entry, as the loader resolves it: ldd), puts
it in LD_PRELOAD and runs `python ARGS...` with RMMC_LIB naming the
library. Leak checking is off: the interpreter keeps its own objects to
the end, which LeakSanitizer would report; the tests check rmmc's
references themselves (test_stateful.py counts each stack's at the end).

Usage: python3 tests/python_sanitized.py LIBRMMC.so ARGS...
"""
import os
import subprocess
import sys


def runtimes(library):
    """The sanitizer runtimes `library` links, as paths."""
    out = subprocess.run(["ldd", library], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        name, _, rest = line.strip().partition(" => ")
        if ("libasan" in name or "clang_rt.asan" in name) and rest:
            found.append(rest.split(" (")[0].strip())
    return found


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    library = os.path.abspath(argv[1])
    preload = runtimes(library)
    if not preload:
        sys.exit("python_sanitized: %s links no ASan runtime (ldd shows none): build it with "
                 "-Db_sanitize=address,undefined" % library)
    env = dict(os.environ)
    env["LD_PRELOAD"] = " ".join(preload + [env["LD_PRELOAD"]] if env.get("LD_PRELOAD")
                                 else preload)
    env["RMMC_LIB"] = library
    # Appended, so they win over the caller's (scripts/test asks for leak
    # checks, which an interpreter fails at exit); huge requests are part of
    # the tests: malloc says no instead of aborting.
    asan = "abort_on_error=1:detect_leaks=0:allocator_may_return_null=1"
    env["ASAN_OPTIONS"] = env["ASAN_OPTIONS"] + ":" + asan if env.get("ASAN_OPTIONS") else asan
    env.setdefault("UBSAN_OPTIONS", "halt_on_error=1:print_stacktrace=1")
    os.execvpe(sys.executable, [sys.executable] + argv[2:], env)


if __name__ == "__main__":
    main(sys.argv)
