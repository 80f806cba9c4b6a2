# SPDX-License-Identifier: Apache-2.0
"""pytest plugin (`-p torch_tests_shim`) for running a test_cuda.py of a
newer PyTorch release than the installed one (tests/python/gpu/torch_tests.py).

A newer test file imports a few names from torch.testing._internal that
an older torch does not define yet. Before the file is collected, each name
the installed torch lacks is given the value it has in the newer release,
computed the same way. Nothing the installed torch defines is touched, so
with a test file of the installed release the plugin does nothing. The
names (each checked against torch 2.11.0's torch.testing._internal):

  common_utils.TEST_CUDAMALLOCASYNC  newer releases moved it from
      test_cuda.py into common_utils: true when PyTorch's allocator
      backend is cudaMallocAsync (false under rmmc and under PyTorch's
      native allocator, whose tests then run).

Tests of features newer than the installed torch (a Python API it lacks)
still fail, under native PyTorch as under rmmc: the differential only
counts tests that pass natively.
"""

SHIMMED = []  # the names this process had to define: torch_tests.py prints them


def _define(module, name, value_fn):
    if not hasattr(module, name):
        setattr(module, name, value_fn())
        SHIMMED.append("%s.%s" % (module.__name__, name))


def apply():
    try:
        import torch
        import torch.testing._internal.common_utils as common_utils
    except ImportError:  # no torch: a test file that needs none (the harness's own tests)
        return

    def cuda_malloc_async():
        # get_allocator_backend names the installed allocator without
        # starting CUDA (rmmc's native backend answers "rmmc").
        return bool(torch.cuda.is_available() and
                    torch.cuda.memory.get_allocator_backend() == "cudaMallocAsync")

    _define(common_utils, "TEST_CUDAMALLOCASYNC", cuda_malloc_async)


def pytest_configure(config):  # noqa: ARG001 (pytest's hook signature)
    apply()


def pytest_report_header(config):  # noqa: ARG001
    return "torch_tests_shim: %s" % (", ".join(SHIMMED) if SHIMMED else "nothing needed")
