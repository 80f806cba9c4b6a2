# SPDX-License-Identifier: Apache-2.0
"""Sleep mode through Python (Resource.pause/resume/sleep_state) on host
stacks: no GPU needed. The PyTorch side (rmmc.torch.pause) runs on the GPU
machine: bench/workloads/torch_sleep.py."""
import ctypes

import pytest

import rmmc


def test_pause_backup_and_resume_keep_addresses_and_data():
    held = {}
    with rmmc.Resource("statistics > pool(expandable=true, page=2MiB) > host") as r:
        r.set_memory_hooks(lambda p, n: held.__setitem__(p, n), lambda p, n: held.pop(p))
        blocks = [(r.allocate(n), n) for n in (3 << 20, 4096, 9 << 20)]
        for i, (p, n) in enumerate(blocks):
            ctypes.memset(p, 0x40 + i, n)
        reserved = r.layers()[1][1]["reserved"]
        assert sum(held.values()) == reserved > 0
        r.pause("backup")
        s = r.sleep_state()
        assert s["paused"] and s["mode"] == "backup" and s["can_sleep"]
        assert s["unmapped"] == reserved and s["held"] == 0 and held == {}
        assert s["backed_up"] >= sum(n for _, n in blocks)
        with pytest.raises(rmmc.OutOfMemoryError, match="paused"):
            r.allocate(1000)
        with pytest.raises(rmmc.InvalidArgumentError, match="paused already"):
            r.pause("discard")
        r.resume()
        assert sum(held.values()) == reserved
        for i, (p, n) in enumerate(blocks):
            assert ctypes.string_at(p, n) == bytes([0x40 + i]) * n
        s = r.sleep_state()
        assert not s["paused"] and s["mode"] is None and s["pauses"] == s["resumes"] == 1
        for p, n in blocks:
            r.deallocate(p, n)
        r.set_memory_hooks(None, None)


def test_pause_discard_and_refusals():
    with rmmc.Resource("pool(expandable=true) > host") as r:
        p = r.allocate(1 << 20)
        r.pause("discard")
        assert r.sleep_state()["backed_up"] == 0
        assert r.figures()["reserved"] == 0 and r.figures()["sleep"] == "discard"
        r.deallocate(p, 1 << 20)  # frees are accepted while paused
        r.resume()
        with pytest.raises(rmmc.InvalidArgumentError, match="not paused"):
            r.resume()
        with pytest.raises(rmmc.InvalidArgumentError, match="backup"):
            r.pause("later")
    with rmmc.Resource("pool(expandable=false) > host") as r:
        with pytest.raises(rmmc.NotSupportedError, match="chunks"):
            r.pause()
        assert not r.sleep_state()["can_sleep"]
    with rmmc.Resource("host") as r:
        with pytest.raises(rmmc.InvalidArgumentError, match="no pool layer"):
            r.pause()
