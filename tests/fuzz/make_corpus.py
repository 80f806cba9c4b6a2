#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the seed corpus of fuzz_stacks into tests/fuzz/corpus/: one input
per stack of the harness's table, each a short mix of every operation.
Input layout (fuzz_stacks.c): stack byte, limit byte, then 3-byte
operations (op, a, b): op%8 0-2 allocate (a: size class<<4 | extra,
b: stream<<4 | alignment power-8), 3-4 free (a: index, b&1: other stream),
5 wrong free (a: index, b%4: mode), 6 release_cached, 7 check."""
import os
import random

NSTACKS = 19
here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, 'corpus')
os.makedirs(out, exist_ok=True)
rng = random.Random(1234)
for stack in range(NSTACKS):
    limit = 0x80 if stack % 3 else 0x10  # 64 MiB, or 2 MiB (the upstream refuses)
    ops = []
    for i in range(24):
        kind = rng.choice([0, 0, 1, 3, 4, 5, 6, 7])
        a = rng.randrange(256)
        if kind in (0, 1):
            a = rng.randrange(14) << 4 | rng.randrange(16)  # no 3 MiB / 9 MiB here
        ops += [kind, a, rng.randrange(256)]
    with open(os.path.join(out, 'seed_%02d' % stack), 'wb') as f:
        f.write(bytes([stack, limit] + ops))
