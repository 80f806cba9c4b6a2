#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""PyTorch trains a small model with every CUDA allocation going through rmmc.

The stack comes from RMMC_ALLOC_CONF (set here from --spec before the first
CUDA use; the default is a pool with statistics on top), and rmmc.torch.use()
makes rmmc PyTorch's CUDA allocator (the native backend where it builds,
else the plug-in; RMMC_TORCH_BACKEND=plugin asks for the plug-in). The
script prints the loss of each step and, at the end, what rmmc handed
PyTorch and every layer's figures of the device's stack.

    python3 examples/torch_train.py            # the installed package (pip install .)
    RMMC_LIB=build/librmmc.so PYTHONPATH=python python3 examples/torch_train.py
    RMMC_ALLOC_CONF="cuda_async" python3 examples/torch_train.py
    python3 examples/torch_train.py --spec "statistics > pool > cuda" --fraction 0.5

Exit status: 0 when the loss fell and the figures add up, 1 when they do
not, 2 for a spec that does not parse, 3 when torch is missing, 4 without
a GPU.
"""

import argparse
import sys

import rmmc
import rmmc.torch

DEFAULT_SPEC = "statistics > pool > cuda"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", help="stack spec (default: $RMMC_ALLOC_CONF or %r)" % DEFAULT_SPEC)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--fraction", type=float,
                    help="torch.cuda.set_per_process_memory_fraction (rmmc caps what it hands out)")
    args = ap.parse_args()

    try:  # RMMC_ALLOC_CONF, read by rmmc at the first default it builds
        spec = rmmc.set_alloc_conf(args.spec, DEFAULT_SPEC)
    except rmmc.ParseError as e:
        print("error: RMMC_ALLOC_CONF: %s" % e.message, file=sys.stderr)
        return 2
    try:
        import torch
    except ImportError as e:
        print("error: PyTorch is not installed (%s)" % e, file=sys.stderr)
        return 3

    if not torch.cuda.is_available():  # counts devices; starts no allocator
        print("error: no CUDA device", file=sys.stderr)
        return 4
    rmmc.torch.use(fraction=args.fraction)  # before the first tensor on the GPU
    dev = torch.device("cuda")
    torch.manual_seed(0)

    # Synthetic regression: y = sin(W x) summed, learned by an MLP.
    n_in, n_hidden = 256, 1024
    w_true = torch.randn(n_in, 16, device=dev)
    model = torch.nn.Sequential(
        torch.nn.Linear(n_in, n_hidden), torch.nn.ReLU(),
        torch.nn.Linear(n_hidden, n_hidden), torch.nn.ReLU(),
        torch.nn.Linear(n_hidden, 1)).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for step in range(args.steps):
        x = torch.randn(args.batch, n_in, device=dev)
        y = torch.sin(x @ w_true).sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print("step %3d  loss %.5f" % (step, losses[-1]))
    torch.cuda.synchronize()

    device = torch.cuda.current_device()
    status, chosen, message = rmmc.config_status()
    stats = rmmc.torch.stats(device)
    print("\nRMMC_ALLOC_CONF=%r -> %s (%s)%s" % (spec, chosen, status,
                                                 ": " + message if message else ""))
    print("what rmmc handed PyTorch (device %d, %s backend):" % (device, rmmc.torch.backend()))
    for k, v in stats.items():
        print("  %-22s %s" % (k, "%.1f MiB" % (v / 2**20) if "bytes" in k or k == "limit" else v))
    print(rmmc.memory_summary(device))

    del model, opt, x, y, loss
    torch.cuda.empty_cache()  # the stack gives back what it caches
    print("after empty_cache:")
    print(rmmc.memory_summary(device))

    ok = True
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    if not last < first:
        print("FAIL: the loss did not fall (%.4f -> %.4f)" % (first, last)); ok = False
    if stats["allocations"] == 0:
        print("FAIL: PyTorch allocated nothing through rmmc"); ok = False
    if stats["unknown_frees"] or stats["deallocation_failures"]:
        print("FAIL: unknown frees or failed deallocations: %s" % stats); ok = False
    if status != "SUCCESS":
        print("FAIL: the stack asked for is not the one in use (%s)" % status); ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
