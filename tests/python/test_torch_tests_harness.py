# SPDX-License-Identifier: Apache-2.0
"""The machinery of tests/python/gpu/torch_tests.py (PyTorch's own tests as
the bar) without a GPU or torch: which tests it selects and runs alone,
how it reads pytest's junit results (every outcome), what it counts as a
differential, and a real run of pytest in its own processes and in one
over a small test file (a pass, a failure, an expected failure, a skip and
a test that kills its process)."""
import os
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))
import torch_tests as tt  # noqa: E402


def test_selects_the_allocator_tests_of_test_cuda():
    want = ["test_cuda.py::TestCuda::test_memory_stats",
            "test_cuda.py::TestCuda::test_graph_two_successive",
            "test_cuda.py::TestCuda::test_record_stream_on_shifted_view",
            "test_cuda.py::TestCuda::test_events",
            "test_cuda.py::TestCuda::test_out_of_memory_retry",
            "test_cuda.py::TestCuda::test_get_per_process_memory_fraction",
            "test_cuda.py::TestCuda::test_caching_allocator_record_stream_oom",
            "test_cuda.py::TestMemPool::test_mempool_id",
            "test_cuda.py::TestBlockStateAbsorption::test_simple"]
    not_wanted = ["test_cuda.py::TestCuda::test_pinned_memory_with_cudaregister",
                  "test_cuda.py::TestCuda::test_host_memory_stats",
                  "test_cuda.py::TestCuda::test_cudart_register",
                  "test_cuda.py::TestCuda::test_sum_fp16",
                  "test_cuda.py::TestCuda::test_device_memory_used",
                  "test_cuda.py::TestCudaAutocast::test_autocast_banned",
                  "test_cuda.py::TestGDS::test_gds_read_write_tensors"]
    assert [n for n in want + not_wanted if tt.selected(n, tt.CLASSES)] == want
    assert tt.base_name("f.py::TestCuda::test_x_with_amp[1]") == "TestCuda::test_x_with_amp"
    assert tt.key_of("f.py::TestMemPool::test_y") == "TestMemPool::test_y"


def test_static_info_finds_serial_and_device_wide_tests(tmp_path):
    f = tmp_path / "test_x.py"
    f.write_text(textwrap.dedent('''
        import unittest
        def serialTest():
            return lambda fn: fn
        class TestCuda(unittest.TestCase):
            @serialTest()
            def test_a(self):
                free, total = torch.cuda.mem_get_info()
            def test_b(self):
                n = torch.cuda.get_device_properties(0).total_memory
            def test_c(self):
                pass
            def helper(self):
                torch.cuda.mem_get_info()
    '''))
    info = tt.static_info(str(f))
    assert info == {"TestCuda::test_a": {"serial": True, "device_wide": True},
                    "TestCuda::test_b": {"serial": False, "device_wide": True},
                    "TestCuda::test_c": {"serial": False, "device_wide": False}}


JUNIT = '''<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="6">
<testcase classname="test_cuda.TestCuda" name="test_pass" time="0.1"/>
<testcase classname="test_cuda.TestCuda" name="test_fail" time="0.1">
  <failure message="AssertionError: Scalars are not equal!">Expected 2 but got 4</failure></testcase>
<testcase classname="test_cuda.TestCuda" name="test_error" time="0.1">
  <error message="error in setup">RuntimeError</error></testcase>
<testcase classname="test_cuda.TestMemPool" name="test_skip" time="0">
  <skipped type="pytest.skip" message="CUDA >= 11.0 required">skip</skipped></testcase>
<testcase classname="test_cuda.TestMemPool" name="test_xfail" time="0">
  <skipped type="pytest.xfail" message="expected failure"/></testcase>
<testcase classname="test_cuda.TestBlockStateAbsorption" name="test_xpass" time="0">
  <failure message="Unexpected success"/></testcase>
</testsuite></testsuites>
'''


def test_reads_every_outcome_of_a_junit_report(tmp_path):
    p = tmp_path / "j.xml"
    p.write_text(JUNIT)
    got = {k: v[0] for k, v in tt.parse_junit(str(p)).items()}
    assert got == {"TestCuda::test_pass": "passed", "TestCuda::test_fail": "failed",
                   "TestCuda::test_error": "error", "TestMemPool::test_skip": "skipped",
                   "TestMemPool::test_xfail": "xfailed",
                   "TestBlockStateAbsorption::test_xpass": "xpassed"}
    assert "Expected 2 but got 4" in tt.parse_junit(str(p))["TestCuda::test_fail"][1]
    assert tt.parse_junit(str(tmp_path / "none.xml")) == {}


def test_the_differential_counts_what_passes_natively_only():
    native = {"A::p": ("passed", ""), "A::x": ("xfailed", ""), "A::f": ("failed", ""),
              "A::s": ("skipped", ""), "A::gone": ("passed", "")}
    rmmc = {"A::p": ("failed", "boom"), "A::x": ("xfailed", ""), "A::f": ("passed", ""),
            "A::s": ("failed", "")}
    assert sorted(tt.differential(native, rmmc)) == ["A::gone", "A::p"]
    assert tt.differential(native, native) == []
    assert tt.counts(native) == {"passed": 2, "xfailed": 1, "skipped": 1, "failed": 1}


SAMPLE = '''
import os, unittest

class TestCuda(unittest.TestCase):
    def test_memory_a_ok(self):
        self.assertEqual(1 + 1, 2)

    def test_memory_b_bad(self):
        self.assertEqual(2, 4)

    @unittest.expectedFailure
    def test_memory_c_known(self):
        self.assertEqual(2, 4)

    @unittest.skip("needs something")
    def test_memory_d_skipped(self):
        pass

    def test_memory_e_dies(self):
        os._exit(3)

    def test_memory_f_last(self):
        pass
'''


def test_runs_pytest_in_one_process_and_per_test(tmp_path):
    f = tmp_path / "test_sample.py"
    f.write_text(SAMPLE)
    ids = tt.collect(str(f), str(tmp_path), 120)
    names = ["a_ok", "b_bad", "c_known", "d_skipped", "e_dies", "f_last"]
    assert ids == ["test_sample.py::TestCuda::test_memory_" + n for n in names]
    # In one process every outcome is read, and the test that kills the
    # process takes the rest with it (read from pytest -v's lines: the
    # junit report is never written).
    one, _, rc, _ = tt.run_pytest("torch", "", str(f), ids, 120, str(tmp_path))
    assert rc == 3
    assert [one["TestCuda::test_memory_" + n][0] for n in names] == [
        "passed", "failed", "xfailed", "skipped", "crashed", "missing"]
    assert "exit status 3" in one["TestCuda::test_memory_e_dies"][1]
    # Alone, the last one runs; the one that dies is reported as crashed.
    each = {}
    for n in ids[4:]:
        got, seconds, _, _ = tt.run_pytest("torch", "", str(f), [n], 120, str(tmp_path))
        each.update(got)
        assert seconds >= 0
    assert {k: v[0] for k, v in each.items()} == {"TestCuda::test_memory_e_dies": "crashed",
                                                  "TestCuda::test_memory_f_last": "passed"}
    assert tt.parse_verbose(
        "test_sample.py::TestCuda::test_memory_b_bad FAILED [ 33%]\nnoise") == {
        "TestCuda::test_memory_b_bad": ("failed", "")}


def test_without_a_test_file_it_says_how_to_get_one(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["torch_tests.py", "--test-file", str(tmp_path / "no.py")])
    assert tt.main() == 2
    assert "--fetch" in capsys.readouterr().err


REPORT = '''self = <test_cuda.TestMemPool testMethod=test_mempool_ctx_multithread>

    def test_mempool_ctx_multithread(self):
>       self.assertEqual(len(segments[0]), 2, "Expected to have 2 segments allocated")
E       AssertionError: Scalars are not equal!
E       
E       Expected 2 but got 3.
E       Absolute difference: 1
E       Expected to have 2 segments allocated
E       
E       To execute this test, run the following from the base repo dir:
E           python test_cuda.py TestMemPool.test_mempool_ctx_multithread
E       
E       This message can be suppressed by setting PYTORCH_PRINT_REPRO_ON_FAILURE=0

test_cuda.py:3669: AssertionError'''


def test_a_failure_is_summed_up_by_its_assertion_and_place():
    why = tt.failure_summary(REPORT).splitlines()
    assert why == ["AssertionError: Scalars are not equal!", "Expected 2 but got 3.",
                   "Absolute difference: 1", "Expected to have 2 segments allocated",
                   "test_cuda.py:3669: AssertionError"]
    # No E lines (a crash, a skip): the first lines of what there is.
    assert tt.failure_summary("no result (exit status -11): boom\nmore\n") == \
        "no result (exit status -11): boom\nmore"
    long = "\n".join("E   line %d" % i for i in range(30))
    assert tt.failure_summary(long).splitlines()[-1] == "... (23 more lines)"
    assert tt.failure_summary("") == ""


def test_tests_can_be_chosen_by_name():
    ids = ["f.py::TestCuda::test_memory_stats", "f.py::TestCuda::test_streams",
           "f.py::TestMemPool::test_mempool_id", "f.py::TestMemPool::test_streams"]
    assert tt.choose(ids, None, "") == (ids, [])
    assert tt.choose(ids, None, "test_streams") == ([ids[1], ids[3]], [])
    assert tt.choose(ids, None, "TestMemPool::test_streams, test_memory_stats") == (
        [ids[0], ids[3]], [])
    assert tt.choose(ids, "Pool", "test_memory_stats,test_nope") == ([], ["test_memory_stats",
                                                                         "test_nope"])


def test_the_gpu_lock_keeps_exclusive_tests_alone(tmp_path):
    import threading
    import time
    import gpu_lock
    path = str(tmp_path / "gpu.lock")
    a, b, c = (gpu_lock.GpuLock(path, timeout=30) for _ in range(3))
    a.shared()
    c.shared()  # shared with each other
    c.release()
    got = []
    t = threading.Thread(target=lambda: (b.exclusive(), got.append("b"), time.sleep(0.3),
                                         b.release()))
    t.start()
    time.sleep(0.3)
    assert got == []  # a is inside a test: b waits
    a.release()
    while not got:
        time.sleep(0.01)
    # b holds it: a newcomer waits for b (the gate), however many share
    t0 = time.monotonic()
    c.shared()
    assert time.monotonic() - t0 > 0.1
    t.join()
    c.release()
    # An exclusive taker holding it shared lets go first: two cannot deadlock.
    a.shared()
    b.shared()
    done = []
    ta = threading.Thread(target=lambda: (a.exclusive(), done.append("a"), a.release()))
    tb = threading.Thread(target=lambda: (b.exclusive(), done.append("b"), b.release()))
    ta.start()
    tb.start()
    ta.join(10)
    tb.join(10)
    assert sorted(done) == ["a", "b"]
    # A wait past the timeout gives up and runs unlocked, never hangs.
    d = gpu_lock.GpuLock(path, timeout=0.2)
    a.exclusive()
    t0 = time.monotonic()
    d.shared()
    assert 0.2 <= time.monotonic() - t0 < 5
    a.release()
    d.release()


def test_pytest_processes_take_the_lock(tmp_path, monkeypatch):
    f = tmp_path / "test_lock.py"
    f.write_text(SAMPLE)
    monkeypatch.setattr(tt, "LOCK_ENV", {"TORCH_TESTS_LOCK": str(tmp_path / "gpu.lock"),
                                         "TORCH_TESTS_EXCLUSIVE": "TestCuda::test_memory_a_ok"})
    got, _, _, tail = tt.run_pytest("torch", "", str(f), ["test_lock.py::TestCuda::test_memory_a_ok"],
                                    120, str(tmp_path))
    assert got == {"TestCuda::test_memory_a_ok": ("passed", "")}
    assert "gpu_lock: %s, exclusive for TestCuda::test_memory_a_ok" % (tmp_path / "gpu.lock") \
        in tail
