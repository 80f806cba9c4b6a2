# SPDX-License-Identifier: Apache-2.0
"""PyTorch through rmmc.torch.use(): a training step with its results
checked, the hooks (empty_cache, memory fraction, record_stream), out of
memory raised (RuntimeError) with rmmc's message, and use() refusing to
run after PyTorch initialized CUDA, and the registry's stack replaced while
threads allocate (issue 25, F8). Each case runs in a fresh interpreter
(an allocator can be swapped only before CUDA starts). Skipped without
PyTorch or a GPU (scripts/gpu-python runs them on the GPU machine)."""
from conftest import run_python, skip_unless

try:
    import torch
except ImportError:
    torch = None
skip_unless(torch is not None, "PyTorch is not installed")
skip_unless(torch.cuda.is_available(), "no CUDA device for PyTorch")

TRAIN = r'''
import torch, rmmc, rmmc.torch
rmmc.torch.use("statistics > pool > cuda")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.Flatten(), torch.nn.Linear(16 * 32 * 32, 10)).cuda()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
x = torch.randn(64, 3, 32, 32, device="cuda")
y = torch.randint(0, 10, (64,), device="cuda")
losses = []
for step in range(30):
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
torch.cuda.synchronize()
# The first step's loss as the CPU computes it from the same weights and data.
torch.manual_seed(0)
ref = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(),
                          torch.nn.Flatten(), torch.nn.Linear(16 * 32 * 32, 10))
first = torch.nn.functional.cross_entropy(ref(x.cpu()), y.cpu()).item()
s = rmmc.torch.stats(0)
layers = rmmc.stack_figures(0)
print("losses", losses[0], losses[-1], "cpu", first)
assert all(l == l for l in losses), losses                # finite
assert abs(losses[0] - first) < 1e-2 * max(1.0, abs(first)), (losses[0], first)  # TF32 convs
assert losses[-1] < 0.5 * losses[0], losses               # it learned
assert s["allocations"] > 0 and s["peak_bytes"] > 0 and s["allocation_failures"] == 0, s
assert [n for n, _ in layers] == ["statistics", "pool", "cuda"], layers
assert layers[0][1]["in_use"] == s["bytes_in_use"] > 0, (layers, s)
# empty_cache goes to rmmc; record_stream on another stream.
side = torch.cuda.Stream()
t = torch.empty(1 << 20, device="cuda")
with torch.cuda.stream(side):
    t.mul_(2)
t.record_stream(side)
del t, model, opt, x, y
torch.cuda.synchronize()
before = rmmc.stack_figures(0)[1][1]["reserved"]
torch.cuda.empty_cache()
after = rmmc.stack_figures(0)[1][1]["reserved"]
assert rmmc.torch.stats(0)["recorded_streams"] >= 1
assert after <= before and rmmc.torch.stats(0)["deallocation_failures"] == 0, (before, after)
print("empty_cache: pool reserved", before, "->", after)
print("ok")
'''


def test_training_step_through_rmmc():
    r = run_python(TRAIN)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr


def test_out_of_memory_raises_with_rmmcs_message(backend="auto"):
    r = run_python(r'''
import torch, rmmc, rmmc.torch
rmmc.torch.use("limiting(limit=64MiB) > pool > cuda", backend=BACKEND)
print("backend", rmmc.torch.backend())
a = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
try:
    torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    print("no error")
except RuntimeError as e:  # torch.OutOfMemoryError is one too
    print("raised:", type(e).__name__, str(e).splitlines()[0])
    print("oom:", rmmc.torch.last_error().splitlines()[0])
    print("failures", rmmc.torch.stats(0)["allocation_failures"])
'''.replace("BACKEND", repr(backend)) + r'''
a.fill_(7)  # min and max keep uint8 (a.sum() would make an int64 copy: 128 MiB, past the limit)
print("first block intact:", a.data_ptr() != 0, int(a.min().item()) == int(a.max().item()) == 7)
''')
    assert r.returncode == 0, r.stderr
    # A failed allocation raises: never a tensor at address 0 (PyTorch does
    # not check the plug-in's NULL; the plug-in throws). The native backend
    # (the default) raises torch.OutOfMemoryError with PyTorch's first
    # sentence; rmmc.torch.last_error() gives rmmc's part either way.
    assert "no error" not in r.stdout, r.stdout
    if "backend native" in r.stdout:
        assert "raised: OutOfMemoryError CUDA out of memory. Tried to allocate 128.00 MiB" \
            in r.stdout, r.stdout
    else:
        assert "raised: RuntimeError out of memory: limiting resource could not allocate" \
            in r.stdout, r.stdout
    assert "oom: out of memory: limiting resource could not allocate" in r.stdout, r.stdout
    assert "failures 1" in r.stdout, r.stdout
    assert "first block intact: True True" in r.stdout, r.stdout


def test_out_of_memory_through_the_plugin():
    """The same refusal through the plug-in (backend="plugin")."""
    test_out_of_memory_raises_with_rmmcs_message(backend="plugin")


def test_use_after_cuda_init_raises():
    r = run_python(r'''
import torch, rmmc.torch
torch.zeros(1, device="cuda")
try:
    rmmc.torch.use("pool > cuda")
    print("no error")
except RuntimeError as e:
    print("refused:", e)
''')
    assert "refused: rmmc.torch.use() must run before PyTorch initializes CUDA" in r.stdout, \
        r.stdout + r.stderr


def test_broken_alloc_conf_raises_at_use():
    r = run_python(r'''
import rmmc, rmmc.torch
try:
    rmmc.torch.use()
    print("no error")
except rmmc.ParseError as e:
    print("ParseError:", e.message.splitlines()[0])
''', {"RMMC_ALLOC_CONF": "expandable_segments:True", "RMMC_ALLOC_CONF_FALLBACK": None})
    assert "ParseError: RMMC_ALLOC_CONF is not a valid stack spec" in r.stdout, r.stdout + r.stderr


def test_stack_replaced_while_threads_allocate():
    """Issue 25, F8: the registry's stack replaced (and the old one's
    reference dropped) every few milliseconds while four threads allocate
    tensors through the plug-in: the process died with SIGSEGV when the
    plug-in retained the borrowed pointer after a set had freed it."""
    r = run_python(r'''
import threading, time, torch, rmmc, rmmc.torch
# The plug-in reads the registry's stack on every call (what F8 is about);
# the native backend takes the stack once, at the device's first use.
rmmc.torch.use("statistics > pool > cuda", backend="plugin")
stop, errors = threading.Event(), []
def work(i):
    s = torch.cuda.Stream()
    n = 0
    try:
        with torch.cuda.stream(s):
            while not stop.is_set():
                t = torch.full((1024 * (1 + n % 64),), float(i), device="cuda")
                if n % 50 == 0:
                    s.synchronize()
                    if not bool((t == float(i)).all()):
                        errors.append("thread %d: wrong data" % i)
                del t
                n += 1
    except Exception as e:
        errors.append("thread %d: %r" % (i, e))
threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
t0, sets = time.time(), 0
while time.time() - t0 < 5:
    spec = "statistics > binning > pool > cuda" if sets % 2 else "statistics > pool > cuda"
    res = rmmc.Resource(spec, device=0)
    rmmc.set_default(res)   # the registry holds it; the previous one goes once its blocks do
    res.close()
    sets += 1
stop.set()
for t in threads:
    t.join()
torch.cuda.synchronize()
s = rmmc.torch.stats(0)
print("sets", sets, "allocations", s["allocations"], "errors", errors[:3])
assert sets > 10 and s["allocations"] > 1000, (sets, s)
assert not errors and s["allocation_failures"] == 0 and s["deallocation_failures"] == 0, (errors, s)
print("ok")
''')
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stdout + r.stderr
