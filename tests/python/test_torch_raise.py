# SPDX-License-Identifier: Apache-2.0
"""rmmc_torch_raise_on_failure() without PyTorch or a GPU: a failed
rmmc_torch_alloc throws a C++ std::runtime_error carrying rmmc's message
when libstdc++ is in the process and raising is on, and returns NULL
otherwise. Uncaught (ctypes is C), the throw ends the process through
std::terminate, which prints the exception's type and message: that is
what these cases read."""
from conftest import run_python

CALL = r'''
import ctypes, os
from rmmc._lib import lib
case = os.environ["RAISE_CASE"].split(",")
if "cxx" in case:
    ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
if "on" in case:
    lib().rmmc_torch_raise_on_failure(1)
# Newer runtimes of NVIDIA's wheel (13.5.37: libcudart.so.13 needs libstdc++; 13.0.96 not) put
# libstdc++ in every process that loads rmmc: then raising is possible.
print("libstdc++ loaded:", "libstdc++" in open("/proc/self/maps").read(), flush=True)
p = lib().rmmc_torch_alloc(256, 100000, None)  # no such device: the allocation fails
print("returned", p)
'''


def test_throws_with_the_message_when_on():
    r = run_python(CALL, {"RAISE_CASE": "cxx,on"})
    assert r.returncode != 0, r.stdout
    assert "returned" not in r.stdout, r.stdout
    assert "std::runtime_error" in r.stderr, r.stderr
    assert "rmmc_torch_alloc: device 100000 is out of range" in r.stderr, r.stderr


def test_returns_null_when_off_or_without_libstdcxx():
    for args in ("cxx", "on"):
        r = run_python(CALL, {"RAISE_CASE": args})
        if args == "on" and "libstdc++ loaded: True" in r.stdout:
            # The CUDA runtime brought libstdc++: raising is on and works.
            assert r.returncode != 0 and "std::runtime_error" in r.stderr, (r.stdout, r.stderr)
            continue
        assert r.returncode == 0, r.stderr
        assert "returned None" in r.stdout, (args, r.stdout)
