# SPDX-License-Identifier: Apache-2.0
"""PYTORCH_CUDA_ALLOC_CONF where rmmc is PyTorch's allocator
(rmmc.torch.pytorch_conf_spec and the warning use() gives): the keys with
an rmmc meaning make the stack, the others are named in one warning, and
an explicit spec wins with every key named. Needs neither PyTorch nor a GPU
(the translation and the warning are checked without installing)."""
import warnings

import pytest

import rmmc
import rmmc.torch as rt
from rmmc._lib import lib


def test_keys_with_an_rmmc_meaning_make_the_stack():
    f = rt.pytorch_conf_spec
    assert f("expandable_segments:True") == ("pool(expandable=true) > cuda",
                                             ["expandable_segments:True"], [])
    assert f("expandable_segments:False, garbage_collection_threshold:0.6") == (
        "pool(expandable=false, gc_threshold=0.6) > cuda",
        ["expandable_segments:False", "garbage_collection_threshold:0.6"], [])
    assert f("backend:native,max_split_size_mb:128") == (
        "pool > cuda", ["backend:native"], ["max_split_size_mb:128"])
    assert f("backend:cudaMallocAsync,expandable_segments:True") == (
        "cuda_async", ["backend:cudaMallocAsync"], ["expandable_segments:True"])
    assert f("max_split_size_mb:128,roundup_power2_divisions:4") == (
        None, [], ["max_split_size_mb:128", "roundup_power2_divisions:4"])
    assert f("garbage_collection_threshold:1.5") == (None, [], ["garbage_collection_threshold:1.5"])
    assert f("expandable_segments:maybe") == (None, [], ["expandable_segments:maybe"])
    assert f("") == (None, [], [])
    for conf in ("expandable_segments:True,garbage_collection_threshold:0.8", "backend:native"):
        rmmc.validate(f(conf)[0])


@pytest.fixture
def env(monkeypatch):
    monkeypatch.delenv("RMMC_ALLOC_CONF", raising=False)
    lib().rmmc_set_default_spec(b"cuda")
    yield monkeypatch
    lib().rmmc_set_default_spec(b"cuda")


def test_use_applies_them_and_warns_once_about_the_rest(env):
    env.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:128")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert rt._apply_pytorch_conf(None) == "pool(expandable=true) > cuda"
    assert len(w) == 1, [str(x.message) for x in w]
    msg = str(w[0].message)
    assert "max_split_size_mb:128 is not applied (they have no rmmc meaning)" in msg, msg
    assert "expandable_segments:True is: pool(expandable=true) > cuda" in msg, msg


def test_an_explicit_spec_wins_and_every_key_is_named(env):
    env.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with pytest.warns(RuntimeWarning, match=r"expandable_segments:True is not applied "
                      r"\(the rmmc stack comes from the spec given\)"):
        assert rt._apply_pytorch_conf("pool > host") == "pool > host"
    env.setenv("RMMC_ALLOC_CONF", "pool > cuda")
    with pytest.warns(RuntimeWarning, match="comes from RMMC_ALLOC_CONF"):
        assert rt._apply_pytorch_conf(None) is None
    env.delenv("PYTORCH_CUDA_ALLOC_CONF")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rt._apply_pytorch_conf(None) is None  # nothing set: nothing said
