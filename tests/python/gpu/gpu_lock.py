# SPDX-License-Identifier: Apache-2.0
"""One GPU for many test processes: a lock that lets the tests which read
the device's own memory figures run alone (tests/python/gpu/torch_tests.py).

A test such as test_repeat_graph_capture_cublas_workspace_memory compares
cudaMemGetInfo before and after its work, and test_out_of_memory_retry
needs half of the device free: another process creating a CUDA context
(~0.5 GiB) or allocating meanwhile makes them fail for nothing. So every
test process on the GPU takes this lock:

  shared     from its CUDA initialization (torch.cuda._lazy_init: creating
             the context happens while importing test_cuda.py) to the end
             of the test it is in, then for each later test (between tests
             a process's memory stands still: nothing to lock);
  exclusive  for a test named in TORCH_TESTS_EXCLUSIVE ("Class::test,..."),
             from its setup to its teardown: no other process is inside a
             test, or initializing CUDA, meanwhile.

The lock file is TORCH_TESTS_LOCK (unset: no locking at all, the plugin
does nothing). A second file (".gate") keeps a waiting exclusive taker from
being starved: while it waits, no process takes the lock shared anew. A
process asking for the exclusive lock lets go of its shared one first (two
such processes cannot wait on each other). A wait longer than
TORCH_TESTS_LOCK_TIMEOUT seconds (default 300) gives up and runs unlocked,
saying so on stderr: a lock must never hang a run.

Loaded as a pytest plugin (`-p gpu_lock`); torch_native_suite.py's case
processes hold it shared for their whole life (hold_shared()).
"""
import fcntl
import os
import re
import sys
import time

_NONE, _SHARED, _EXCLUSIVE = 0, 1, 2


class GpuLock:
    def __init__(self, path, timeout=None):
        self.path = path
        self.timeout = float(os.environ.get("TORCH_TESTS_LOCK_TIMEOUT", "300")
                             if timeout is None else timeout)
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.gate = os.open(path + ".gate", os.O_RDWR | os.O_CREAT, 0o644)
        self.state = _NONE
        self.waited = 0.0  # seconds spent waiting, for the report

    def _take(self, fd, how):
        """flock(fd, how) within the timeout; False if it gave up."""
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, how | fcntl.LOCK_NB)
                self.waited += time.monotonic() - t0
                return True
            except BlockingIOError:
                if time.monotonic() - t0 > self.timeout:
                    self.waited += time.monotonic() - t0
                    print("gpu_lock: gave up waiting %.0f s for %s; running unlocked"
                          % (self.timeout, self.path), file=sys.stderr, flush=True)
                    return False
                time.sleep(0.02)

    def shared(self):
        if self.state != _NONE:
            return
        if self._take(self.gate, fcntl.LOCK_SH):
            self._take(self.fd, fcntl.LOCK_SH)
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.state = _SHARED

    def exclusive(self):
        if self.state == _EXCLUSIVE:
            return
        fcntl.flock(self.fd, fcntl.LOCK_UN)  # never wait while holding it shared
        if self._take(self.gate, fcntl.LOCK_EX):
            self._take(self.fd, fcntl.LOCK_EX)
        self.state = _EXCLUSIVE

    def release(self):
        if self.state == _NONE:
            return
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        if self.state == _EXCLUSIVE:
            fcntl.flock(self.gate, fcntl.LOCK_UN)
        self.state = _NONE


LOCK = None
EXCLUSIVE = set()


def _lock():
    global LOCK
    path = os.environ.get("TORCH_TESTS_LOCK")
    if LOCK is None and path:
        LOCK = GpuLock(path)
    return LOCK


def base_key(nodeid):
    """Class::test of a node id, parameters dropped."""
    parts = nodeid.split("::")
    name = re.sub(r"\[.*\]$", "", parts[-1])
    return "%s::%s" % (parts[-2] if len(parts) > 2 else "", name)


def _wrap_lazy_init():
    """Takes the lock shared when the process first initializes CUDA."""
    try:
        import torch.cuda
    except ImportError:
        return
    if getattr(torch.cuda._lazy_init, "_gpu_lock", False):
        return
    inner = torch.cuda._lazy_init

    def lazy_init():
        if not torch.cuda.is_initialized() and LOCK is not None:
            LOCK.shared()
        return inner()

    lazy_init._gpu_lock = True
    torch.cuda._lazy_init = lazy_init


def hold_shared():
    """For a process that is on the GPU as a whole (a case of
    torch_native_suite.py): the lock, shared, until it exits."""
    if _lock() is not None:
        LOCK.shared()


# ---- the pytest plugin ----

def pytest_configure(config):  # noqa: ARG001 (pytest's hook signature)
    if _lock() is None:
        return
    EXCLUSIVE.update(n.strip() for n in os.environ.get("TORCH_TESTS_EXCLUSIVE", "").split(",")
                     if n.strip())
    _wrap_lazy_init()


def _protocol(item):
    if LOCK is None:
        return
    if base_key(item.nodeid) in EXCLUSIVE:
        LOCK.exclusive()
    else:
        LOCK.shared()


try:
    import pytest

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):  # noqa: ARG001
        _protocol(item)
        try:
            yield
        finally:
            if LOCK is not None:
                LOCK.release()
except ImportError:  # no pytest: hold_shared() alone
    pass


def pytest_report_header(config):  # noqa: ARG001
    if LOCK is None:
        return None
    return "gpu_lock: %s, exclusive for %s" % (LOCK.path, ", ".join(sorted(EXCLUSIVE)) or "none")
