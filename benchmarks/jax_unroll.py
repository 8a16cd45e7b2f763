"""Which ``unroll`` k makes Flax's recurrence fastest: one bd layer's training step, timed per k.

    .venvs/jax-cpu/bin/python benchmarks/jax_unroll.py [--unroll 1,2,4,8,16,32] [--layers 1] [--steps 200]

The ``jax+unroll`` variant runs every recurrence as ``nnx.RNN(nnx.SimpleCell, unroll=k)``; the full model's step
on the 8-s batch spends 84-98 % of its time in the seven bidirectional layers (the profile, results.md), and one
full-width ``run_all.py`` run per k takes 15 minutes on 2 cores.  This times the part that k changes, alone: one
bidirectional ReLU layer of the full model (1760 units, ``nnx.Bidirectional`` of two ``nnx.RNN`` summed, as in the
notebook), 200 time steps (the 8-s batch after the convolutions) of 8 utterances, forward and backward under
``nnx.jit``, each k in a fresh process.  It prints, per k, the compile time (with the first step) and the median
of the timed steps, wall clock and the process's CPU time.  The JAX notebook's section 4 gives the measured
table and takes its ``BEST_UNROLL`` from it.  ``--layers 7`` stacks the model's seven layers in one program
(no BatchNorm or clipping between them): there k = 2 is slower than k = 1 (10.49 and 11.92 s against 10.02 and
9.96, two runs), with two layers still faster (2.61 s against 2.85), as the whole model is slower with k = 2.
"""
import argparse
import operator
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runner.validate import OneLineParser, positive_int  # noqa: E402  (standard library only)


def time_layer(k, hidden, steps, batch, repeats, layers=1):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    rngs = nnx.Rngs(0)

    def direction():
        return nnx.RNN(nnx.SimpleCell(hidden, hidden, activation_fn=nnx.relu, rngs=rngs), unroll=k)

    bidirectional = [nnx.Bidirectional(direction(), direction(), merge_fn=operator.add) for _ in range(layers)]
    layer = bidirectional[0] if layers == 1 else nnx.Sequential(*bidirectional)
    x = jax.random.normal(jax.random.key(1), (batch, steps, hidden), jnp.float32)

    @nnx.jit
    def step(layer, x):
        def loss(layer):
            return jnp.sum(jnp.clip(layer(x), 0.0, 20.0))
        return nnx.value_and_grad(loss)(layer)

    def run():
        value, grads = step(layer, x)
        jax.block_until_ready(grads)
        return float(value)

    start = time.perf_counter()
    first = run()                                         # compile + first step
    compile_s = time.perf_counter() - start
    wall, cpu = [], []
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - w)
        cpu.append(time.process_time() - c)
    print("unroll %3d  compile+first %6.1f s  step %6.2f s (min %.2f, CPU %.2f s)  loss %.6g" % (
        k, compile_s, statistics.median(wall), min(wall), statistics.median(cpu), first))
    sys.stdout.flush()


def main(argv=None):
    ap = OneLineParser(prog="jax_unroll.py", description=__doc__.splitlines()[0])
    ap.add_argument("--unroll", default="1,2,4,8,16,32", help="comma-separated k (default 1,2,4,8,16,32)")
    ap.add_argument("--hidden", type=positive_int, default=1760)
    ap.add_argument("--steps", type=positive_int, default=200, help="time steps (default 200: the 8-s batch)")
    ap.add_argument("--batch", type=positive_int, default=8)
    ap.add_argument("--repeats", type=positive_int, default=5)
    ap.add_argument("--layers", type=positive_int, default=1,
                    help="bidirectional layers stacked (default 1; the model has 7)")
    ap.add_argument("--child", type=positive_int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return time_layer(args.child, args.hidden, args.steps, args.batch, args.repeats, args.layers)
    try:
        ks = [int(k) for k in args.unroll.split(",")]
    except ValueError:
        ap.error("--unroll takes comma-separated positive integers, got %r" % args.unroll)
    if any(k < 1 for k in ks):
        ap.error("--unroll takes positive integers, got %r" % args.unroll)
    print("%d bidirectional layer(s), %d units, %d steps x %d utterances, forward + backward, %d timed steps per k"
          % (args.layers, args.hidden, args.steps, args.batch, args.repeats))
    sys.stdout.flush()
    for k in ks:                                          # a fresh process per k: its own compile cache and heap
        cmd = [sys.executable, os.path.abspath(__file__), "--child", str(k), "--hidden", str(args.hidden),
               "--steps", str(args.steps), "--batch", str(args.batch), "--repeats", str(args.repeats),
               "--layers", str(args.layers)]
        if subprocess.call(cmd) != 0:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
