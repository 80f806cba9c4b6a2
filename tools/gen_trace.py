#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Generate synthetic allocation logs in RMM's CSV format for rmmc-replay.

Usage:
    gen_trace.py SHAPE [--events N] [--seed S] [--threads T] [--streams K]
                 [--time-format us|rmm] [-o OUT]

SHAPE is the workload:
    random       sizes log-uniform from --min-size to --max-size (256 B to
                 64 MiB), random lifetimes, about --live allocations live at
                 once (the default for timing runs)
    batches      CNN-style training: persistent weights, then per iteration a
                 random batch size (--batch-min..--batch-max) scales every
                 activation; the forward pass allocates, the backward pass frees
                 in reverse while allocating gradients
    transformer  decoder-style steps whose sequence length grows from
                 --seq-min to --seq-max: activations scale with the length,
                 attention scores with its square, and the KV cache is
                 reallocated larger at every step (the shape that fragments)

The log goes to OUT (".csv", ".csv.gz" compresses; "-" or nothing: stdout)
with the header Thread,Time,Action,Pointer,Size,Stream. Time is integer
microseconds (--time-format us, as rmmc writes) or RMM's HH:MM:SS.ffffff
(--time-format rmm). With --threads T the work is spread over T threads (each
iteration, or each random event, on a thread of its own) and frees may come
from another thread than the allocation; with --streams K each thread uses
one of K streams (0x0 and then made-up handles). Pointers are made up,
aligned to 512 bytes, and reused after a free as a real allocator would. The
output is the same for the same arguments.

Examples:
    gen_trace.py random --events 1000000 -o random_1m.csv.gz
    gen_trace.py batches --events 200000 --threads 2 -o cnn.csv
    gen_trace.py transformer --seq-max 8192 -o llm.csv.gz
"""

import argparse
import gzip
import math
import random
import sys

KiB = 1024
MiB = 1024 * KiB


class Log:
    """Writes events and keeps the pointers consistent."""

    def __init__(self, out, threads, streams, time_format, rng):
        self.out = out
        self.threads = threads
        self.rng = rng
        self.time_us = 1_700_000_000_000_000
        self.time_format = time_format
        self.stream_ids = [0] + [0x7F0000001000 + 0x100 * i for i in range(1, streams)]
        self.free_by_size = {}
        self.bump = 0x7E0000000000
        self.live = {}  # pointer -> size
        self.events = 0
        out.write("Thread,Time,Action,Pointer,Size,Stream\n")

    def _time(self):
        self.time_us += self.rng.randint(1, 40)
        if self.time_format == "us":
            return str(self.time_us)
        secs, us = divmod(self.time_us, 1_000_000)
        return "%02d:%02d:%02d.%06d" % (secs // 3600 % 24, secs // 60 % 60, secs % 60, us)

    def _stream(self, thread):
        return self.stream_ids[thread % len(self.stream_ids)]

    def alloc(self, size, thread=0):
        rounded = (size + 511) // 512 * 512
        spare = self.free_by_size.get(rounded)
        if spare:
            ptr = spare.pop()
        else:
            ptr = self.bump
            self.bump += rounded
        self.live[ptr] = size
        self.out.write("%d,%s,allocate,0x%x,%d,0x%x\n"
                       % (thread, self._time(), ptr, size, self._stream(thread)))
        self.events += 1
        return ptr

    def free(self, ptr, thread=0):
        size = self.live.pop(ptr)
        self.free_by_size.setdefault((size + 511) // 512 * 512, []).append(ptr)
        self.out.write("%d,%s,free,0x%x,%d,0x%x\n"
                       % (thread, self._time(), ptr, size, self._stream(thread)))
        self.events += 1


def gen_random(log, args, rng):
    lo, hi = math.log2(args.min_size), math.log2(args.max_size)
    live = []
    while log.events < args.events:
        thread = rng.randrange(args.threads)
        if live and (len(live) >= 2 * args.live or rng.random() < len(live) / (2.0 * args.live)):
            i = rng.randrange(len(live))
            live[i], live[-1] = live[-1], live[i]
            log.free(live.pop(), thread)
        else:
            size = int(2 ** rng.uniform(lo, hi))
            live.append(log.alloc(size, thread))
    for ptr in live:
        log.free(ptr, 0)


def gen_batches(log, args, rng):
    layers = [(64, 112 * 112), (128, 56 * 56), (256, 28 * 28), (512, 14 * 14), (512, 7 * 7)]
    weights = [log.alloc(c * c * 9 * 4) for c, _ in layers for _ in range(4)]
    iteration = 0
    while log.events < args.events:
        thread = iteration % args.threads
        batch = rng.randint(args.batch_min, args.batch_max)
        acts = []
        for c, hw in layers:
            for _ in range(4):
                acts.append(log.alloc(batch * c * hw * 2, thread))  # fp16 activations
                acts.append(log.alloc(rng.choice([256, 512, 4096]), thread))  # small temporaries
                log.free(acts.pop(), thread)
        grads = []
        for ptr in reversed(acts):
            size = log.live[ptr]
            g = log.alloc(size, thread)
            log.free(ptr, thread)
            if grads:
                log.free(grads.pop(), thread)
            grads.append(g)
        for g in grads:
            log.free(g, thread)
        iteration += 1
    for w in weights:
        log.free(w)


def gen_transformer(log, args, rng):
    d, heads, nlayers, batch = 1024, 16, 8, 4
    weights = [log.alloc(d * d * 4 * 2) for _ in range(nlayers)]
    caches = [None] * nlayers
    seq = args.seq_min
    step = 0
    while log.events < args.events:
        thread = step % args.threads
        for layer in range(nlayers):
            cache_size = 2 * batch * seq * d * 2
            new_cache = log.alloc(cache_size, thread)
            if caches[layer] is not None:
                log.free(caches[layer], thread)
            caches[layer] = new_cache
            qkv = log.alloc(3 * batch * seq * d * 2, thread)
            scores = log.alloc(batch * heads * seq * seq * 2, thread)
            out = log.alloc(batch * seq * d * 2, thread)
            log.free(scores, thread)
            log.free(qkv, thread)
            log.free(out, thread)
        seq = seq + rng.randint(1, max(1, seq // 8)) if seq < args.seq_max else args.seq_min
        step += 1
    for c in caches:
        if c is not None:
            log.free(c)
    for w in weights:
        log.free(w)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("shape", choices=["random", "batches", "transformer"])
    p.add_argument("--events", type=int, default=100000, help="at least this many events")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--live", type=int, default=1000, help="random: allocations live at once")
    p.add_argument("--min-size", type=int, default=256, help="random: smallest size")
    p.add_argument("--max-size", type=int, default=64 * MiB, help="random: largest size")
    p.add_argument("--batch-min", type=int, default=32)
    p.add_argument("--batch-max", type=int, default=128)
    p.add_argument("--seq-min", type=int, default=128)
    p.add_argument("--seq-max", type=int, default=4096)
    p.add_argument("--time-format", choices=["us", "rmm"], default="us")
    p.add_argument("-o", "--output", default="-")
    args = p.parse_args(argv)
    if args.threads < 1 or args.streams < 1 or args.events < 0:
        p.error("--threads and --streams must be at least 1, --events not negative")
    if not 1 <= args.min_size <= args.max_size:
        p.error("sizes: 1 <= --min-size <= --max-size")
    rng = random.Random(args.seed)
    if args.output == "-":
        out = sys.stdout
    elif args.output.endswith(".gz"):
        out = gzip.open(args.output, "wt", compresslevel=6)
    else:
        out = open(args.output, "w")
    try:
        log = Log(out, args.threads, args.streams, args.time_format, rng)
        {"random": gen_random, "batches": gen_batches, "transformer": gen_transformer}[
            args.shape](log, args, rng)
    finally:
        if out is not sys.stdout:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
