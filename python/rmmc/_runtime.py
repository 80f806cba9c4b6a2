# SPDX-License-Identifier: Apache-2.0
"""Loading librmmc with its CUDA runtime.

librmmc needs libcudart.so.<major>. The binary wheel depends on NVIDIA's
runtime wheel (nvidia-cuda-runtime, which installs nvidia/cu13/lib beside
rmmc in site-packages) and librmmc's RUNPATH names that folder, else the
loader's usual search finds a system runtime. Where the two packages are
in different site folders (rmmc in the user site, say) the RUNPATH misses:
then the runtime is looked up on sys.path and loaded first, and where it
is nowhere the error says in one sentence what to install.
"""
import ctypes
import os
import re
import sys


def find_cudart(soname="libcudart.so.13"):
    """The path of `soname` inside NVIDIA's runtime wheel on sys.path, or None."""
    major = soname.rsplit(".", 1)[-1]
    for entry in sys.path:
        path = os.path.join(entry or os.curdir, "nvidia", "cu" + major, "lib", soname)
        if os.path.exists(path):
            return os.path.abspath(path)
    return None


def load(path):
    """ctypes.CDLL(path), finding the CUDA runtime it needs if the loader
    does not."""
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        m = re.search(r"(libcudart\.so\.\d+)", str(e))
        if m is None:
            raise
        soname = m.group(1)
        cudart = find_cudart(soname)
        if cudart is None:
            raise OSError("%s needs the CUDA runtime %s, which is neither installed nor in "
                          "NVIDIA's runtime wheel: pip install nvidia-cuda-runtime (rmmc's "
                          "wheel depends on it), or install the CUDA toolkit" % (path, soname)
                          ) from e
        ctypes.CDLL(cudart, mode=ctypes.RTLD_GLOBAL)
        return ctypes.CDLL(path)
