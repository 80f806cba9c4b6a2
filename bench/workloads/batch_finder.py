#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The largest batch that fits: batch-size finders under PyTorch's allocator,
its expandable segments and rmmc, side by side.

A framework that looks for the largest batch runs a training step at a
batch size, and on out of memory frees what it can (gc.collect() and
torch.cuda.empty_cache()) and tries again at 0.9x. What an allocator
decides there is the batch the user gets, and how long each failed round
costs. Finders (models from their configs, random weights and tokens, no
downloads):

  hf-gpt2      Hugging Face Trainer, auto_find_batch_size=True, GPT-2 124M,
               sequence 1024, bf16, AdamW
  hf-llama     the same Trainer on a 16-layer Llama (hidden 1024), seq 1024
  acc-decoder  accelerate's find_executable_batch_size around a 12-layer
               decoder's training step (GPT-2 blocks, sequence 512, AdamW,
               bf16 autocast), the loop a hand-written script has

Each (finder, allocator) runs in its own process, since the allocator is
chosen before CUDA starts; rounds alternate the order. Per run: the batch
found, the out-of-memory rounds, the finder's wall time (from the call to
the end of the first successful step), the mean cost of a failed round,
the steady-state step time per sample (median over the timed steps of the
batch found), and peak reserved / allocated (torch.cuda's figures: rmmc's
native backend keeps them).

    python3 bench/workloads/batch_finder.py --finders hf-gpt2 --rounds 1
    python3 bench/workloads/batch_finder.py --modes native,rmmc --spec "pool > cuda"

Modes: native (PyTorch's caching allocator), expandable
(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) and rmmc
(rmmc.torch.use(SPEC), the native backend; the package from PYTHONPATH).
Writes the table to stdout and the runs as JSON to --json (default
$OUT/batch_finder.json when OUT is set). Exit status: 0 when every run
finished, 1 otherwise, 2 for bad arguments.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

RESULT_TAG = "BATCH_FINDER_RESULT "
FINDERS = ("hf-gpt2", "hf-llama", "acc-decoder")
MODES = ("native", "expandable", "rmmc")


# ---- the worker: one finder under one allocator ----

def _install_allocator(args):
    if args.worker_mode == "expandable":
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif args.worker_mode == "rmmc":
        import rmmc.torch
        rmmc.torch.use(args.spec, backend="native")


class _Tokens:
    """Random token ids (seeded per index), as many samples as asked."""

    def __init__(self, n, seq, vocab, seed):
        self.n, self.seq, self.vocab, self.seed = n, seq, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        g = torch.Generator().manual_seed(self.seed * 1000003 + i)
        ids = torch.randint(0, self.vocab, (self.seq,), generator=g)
        return {"input_ids": ids, "labels": ids.clone()}


def _model(name, torch):
    import transformers as tf
    if name == "hf-gpt2":
        cfg = tf.GPT2Config(n_positions=1024, n_embd=768, n_layer=12, n_head=12)
        return tf.GPT2LMHeadModel(cfg), 1024, cfg.vocab_size
    if name == "hf-llama":
        cfg = tf.LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=16,
                             num_attention_heads=16, num_key_value_heads=16, vocab_size=32000,
                             max_position_embeddings=1024)
        return tf.LlamaForCausalLM(cfg), 1024, cfg.vocab_size
    cfg = tf.GPT2Config(n_positions=512, n_embd=768, n_layer=12, n_head=12)
    return tf.GPT2LMHeadModel(cfg), 512, cfg.vocab_size


_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free")
_POOL_COUNTS = ("grows", "shrinks", "page_maps", "page_unmaps", "budget_trims", "refusal_trims",
                "device_syncs", "stream_syncs", "event_syncs", "event_waits", "adoptions")


def _step_done(torch, rec):
    """A step's end: its time and the allocator's counters then, so the
    steady state's retries and device calls show."""
    a = rec["attempts"][-1]
    a["steps"].append(time.perf_counter())
    stats = torch.cuda.memory_stats()
    a.setdefault("counters", []).append([stats.get(k, 0) for k in _COUNTERS])
    if rec["mode"] == "rmmc":  # the pool's own counts: what each step's growth cost
        import rmmc
        layers = rmmc.stack_figures()
        pool = next((f for name, f in layers if name in ("pool", "arena")), {})
        a.setdefault("pool", []).append({k: pool.get(k) for k in _POOL_COUNTS if k in pool})


def _run_trainer(args, torch, rec):
    import transformers as tf
    model, seq, vocab = _model(args.worker_finder, torch)
    data = _Tokens(10 ** 7, seq, vocab, args.seed)

    class Clock(tf.TrainerCallback):
        def on_train_begin(self, a, state, control, **kw):
            rec["attempts"].append({"start": time.perf_counter(), "steps": []})

        def on_step_end(self, a, state, control, **kw):
            torch.cuda.synchronize()
            _step_done(torch, rec)

    targs = tf.TrainingArguments(
        output_dir=os.path.join(args.tmp, "trainer"), per_device_train_batch_size=args.start,
        auto_find_batch_size=True, max_steps=args.steps, bf16=True, learning_rate=1e-4,
        logging_strategy="no", save_strategy="no", report_to=[], disable_tqdm=True,
        dataloader_num_workers=0, seed=args.seed)
    trainer = tf.Trainer(model=model, args=targs, train_dataset=data, callbacks=[Clock()])
    rec["t0"] = time.perf_counter()
    trainer.train()
    rec["batch"] = int(trainer._train_batch_size)


def _run_accelerate(args, torch, rec):
    from accelerate.utils import find_executable_batch_size
    model, seq, vocab = _model(args.worker_finder, torch)
    model = model.cuda()
    model.train()
    gen = torch.Generator(device="cuda").manual_seed(args.seed)

    @find_executable_batch_size(starting_batch_size=args.start)
    def train(batch_size):
        rec["attempts"].append({"start": time.perf_counter(), "steps": [], "batch": batch_size})
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for _ in range(args.steps):
            ids = torch.randint(0, vocab, (batch_size, seq), device="cuda", generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            _step_done(torch, rec)
        return batch_size

    rec["t0"] = time.perf_counter()
    rec["batch"] = int(train())


def worker(args):
    _install_allocator(args)
    import torch
    if not torch.cuda.is_available():
        print("batch_finder: no CUDA device visible to PyTorch", file=sys.stderr)
        return 4
    torch.manual_seed(args.seed)
    rec = {"finder": args.worker_finder, "mode": args.worker_mode, "attempts": []}
    # Where a failed round's time goes: the finders' cleanup calls these two
    # through their modules, so timing wrappers see every call.
    import gc
    spent = {"empty_cache": 0.0, "gc": 0.0}

    def timed(name, fn):
        def call(*a, **kw):
            t = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] += time.perf_counter() - t
        return call
    torch.cuda.empty_cache = timed("empty_cache", torch.cuda.empty_cache)
    gc.collect = timed("gc", gc.collect)
    if args.worker_finder.startswith("hf-"):
        _run_trainer(args, torch, rec)
    else:
        _run_accelerate(args, torch, rec)
    done = rec["attempts"][-1]
    steps = done["steps"]
    failed = rec["attempts"][:-1]
    # A failed round ends where the next begins (the finder's cleanup included).
    fail_s = [b["start"] - a["start"] for a, b in zip(rec["attempts"], rec["attempts"][1:])]
    gaps = [b - a for a, b in zip(steps, steps[1:])][args.warmup:]
    # Counter changes over the timed steps (from the end of the last untimed one).
    cnt = done.get("counters") or []
    steady = ({k: cnt[-1][i] - cnt[args.warmup][i] for i, k in enumerate(_COUNTERS)}
              if len(cnt) > args.warmup + 1 else {})
    pc = done.get("pool") or []
    pool_steady = ({k: pc[-1][k] - pc[args.warmup].get(k, 0) for k in pc[-1]}
                   if len(pc) > args.warmup + 1 else None)
    out = {
        "finder": rec["finder"], "mode": rec["mode"], "batch": rec["batch"],
        "oom_rounds": len(failed),
        "finder_s": (steps[0] if steps else done["start"]) - rec["t0"],
        "failed_round_s": statistics.mean(fail_s) if fail_s else 0.0,
        "step_ms": 1e3 * statistics.median(gaps) if gaps else None,
        "ms_per_sample": 1e3 * statistics.median(gaps) / rec["batch"] if gaps else None,
        "empty_cache_s": spent["empty_cache"], "gc_s": spent["gc"],
        "ooms": torch.cuda.memory_stats().get("num_ooms"),
        "alloc_retries": torch.cuda.memory_stats().get("num_alloc_retries"),
        "steady_retries": steady.get("num_alloc_retries"),
        "steady_pool": pool_steady,
        "steady_device_allocs": steady.get("num_device_alloc"),
        "steady_device_frees": steady.get("num_device_free"),
        "max_reserved_mib": torch.cuda.max_memory_reserved() / 2 ** 20,
        "max_allocated_mib": torch.cuda.max_memory_allocated() / 2 ** 20,
        "torch": torch.__version__,
    }
    print(RESULT_TAG + json.dumps(out), flush=True)
    return 0


# ---- the driver ----

def run_one(args, finder, mode):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker-finder", finder,
           "--worker-mode", mode, "--spec", args.spec, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--seed", str(args.seed), "--tmp", args.tmp,
           "--start", str(args.start_for[finder])]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=args.timeout)
        text, rc = p.stdout, p.returncode
    except subprocess.TimeoutExpired as e:
        text, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) \
            else (e.stdout or ""), "timeout"
    for line in text.splitlines():
        if line.startswith(RESULT_TAG):
            r = json.loads(line[len(RESULT_TAG):])
            r["process_s"] = time.perf_counter() - t0
            return r
    return {"finder": finder, "mode": mode, "error": "exit %s" % rc,
            "tail": text.splitlines()[-25:]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--finders", default=",".join(FINDERS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--spec", default="pool > cuda", help="rmmc's stack (mode rmmc)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--steps", type=int, default=8, help="steps of each attempt")
    ap.add_argument("--warmup", type=int, default=2, help="steps of the batch found not timed")
    ap.add_argument("--start", default="hf-gpt2=256,hf-llama=256,acc-decoder=1024",
                    help="starting batch per finder (finder=N,...) or one number for all")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--tmp", default=os.environ.get("TMPDIR", "/tmp"))
    ap.add_argument("--json")
    ap.add_argument("--worker-finder", help=argparse.SUPPRESS)
    ap.add_argument("--worker-mode", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker_finder:
        args.start = int(args.start)
        return worker(args)
    finders = [f for f in args.finders.split(",") if f]
    modes = [m for m in args.modes.split(",") if m]
    bad = [f for f in finders if f not in FINDERS] + [m for m in modes if m not in MODES]
    if bad or args.rounds < 1 or args.steps <= args.warmup:
        ap.error("unknown finder or mode %s, or rounds < 1, or steps <= warmup" % bad)
    args.start_for = {}
    for item in args.start.split(","):
        k, _, v = item.rpartition("=")
        for f in ([k] if k else FINDERS):
            args.start_for[f] = int(v)
    runs = []
    for rnd in range(args.rounds):
        for finder in finders:
            order = modes if rnd % 2 == 0 else modes[::-1]
            for mode in order:
                r = run_one(args, finder, mode)
                r["round"] = rnd
                runs.append(r)
                print("round %d %-11s %-10s %s" % (rnd, finder, mode, r.get("error") or
                      "batch %d, %d OOM rounds, finder %.1f s (empty_cache %.1f s, gc %.1f s)"
                      % (r["batch"], r["oom_rounds"], r["finder_s"], r["empty_cache_s"],
                         r["gc_s"])), flush=True)
                for line in r.get("tail", []):
                    print("   | " + line)
    med = lambda xs: statistics.median(xs) if xs else None
    table = {}
    for finder in finders:
        for mode in modes:
            rs = [r for r in runs if r["finder"] == finder and r["mode"] == mode and "error" not in r]
            table.setdefault(finder, {})[mode] = {k: med([r[k] for r in rs if r.get(k) is not None])
                                                  for k in ("batch", "oom_rounds", "finder_s",
                                                            "failed_round_s", "empty_cache_s", "ms_per_sample",
                                                            "max_reserved_mib", "steady_retries",
                                                            "steady_device_allocs")} if rs else None
    print("\nmedians of %d round(s); ratios against native in the same run" % args.rounds)
    print("%-11s %-10s %6s %4s %9s %9s %8s %10s %11s %8s %13s" % ("finder", "mode", "batch", "ooms",
          "finder_s", "fail_s", "empty_s", "ms/sample", "reserved", "batch/n", "steady rt/dev"))
    for finder, row in table.items():
        nat = row.get("native")
        for mode, t in row.items():
            if t is None:
                print("%-11s %-10s failed" % (finder, mode))
                continue
            print("%-11s %-10s %6d %4d %9.1f %9.2f %8.2f %10.3f %9.0f Mi %8s %6s/%-6s" % (
                finder, mode, t["batch"], t["oom_rounds"], t["finder_s"], t["failed_round_s"],
                t["empty_cache_s"],
                t["ms_per_sample"] or 0, t["max_reserved_mib"],
                "%.3f" % (t["batch"] / nat["batch"]) if nat else "-",
                t.get("steady_retries"), t.get("steady_device_allocs")))
    path = args.json or (os.path.join(os.environ["OUT"], "batch_finder.json")
                         if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump({"runs": runs, "medians": table}, f, indent=1)
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
