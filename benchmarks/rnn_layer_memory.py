"""What one bd layer's training step holds in memory: MXNet's oneDNN RNN against PyTorch's, on a CPU.

    .venvs/mxnet-cpu/bin/python benchmarks/rnn_layer_memory.py mxnet [--steps 100,200,400]
    .venvs/pytorch-cpu/bin/python benchmarks/rnn_layer_memory.py pytorch

One bidirectional ReLU RNN layer of the full model (1760 inputs and units: Gluon's ``rnn.RNN`` hybridized with
``static_alloc`` as in the MXNet notebook, or ``torch.nn.RNN``), the sum of its output as the loss, forward and
backward on 8 utterances, in a fresh process per length T: the growth of the peak resident memory over the
imported library from building the layer and a training step of 8 time steps (what does not depend on T), then
over that from two training steps of T time steps.  Measured on the 2-core CPU machine (MXNet 1.9.1, torch
2.13.0+cpu): MXNet +0.56 GB for the layer and the short step at T = 200 and 400, then +0.22 / +0.27 GB (T = 200)
and +0.49 / +0.58 GB (T = 400); PyTorch +0.15 / +0.17 GB, then +0.10 / +0.11 GB and +0.15 / +2.27 GB (its
second 400-step step: glibc's heap, cf. torch_profiler_memory.py).  The layer's weights are 0.05 GB: MXNet's
oneDNN RNN holds about 11 times that whatever the length, PyTorch's 3 times; over seven bd layers, 3.9 GB
against 1.1 GB.
"""
import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runner import validate  # noqa: E402  (standard library only)

HIDDEN, BATCH = 1760, 8


def mxnet_steps():
    import mxnet as mx
    from mxnet import autograd
    from mxnet.gluon import rnn
    layer = rnn.RNN(HIDDEN, activation="relu", bidirectional=True, input_size=HIDDEN)
    layer.initialize(ctx=mx.cpu())
    layer.hybridize(static_alloc=True)

    def step(t):
        x = mx.nd.random.normal(shape=(t, BATCH, HIDDEN))           # (T, N, C): Gluon's TNC layout
        with autograd.record():
            loss = layer(x).sum()
        loss.backward()
        mx.nd.waitall()
    return step


def pytorch_steps():
    import torch
    layer = torch.nn.RNN(HIDDEN, HIDDEN, nonlinearity="relu", bidirectional=True)

    def step(t):
        layer(torch.randn(t, BATCH, HIDDEN))[0].sum().backward()
    return step


def peak_gb():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def main(argv=None):
    ap = validate.OneLineParser(prog="rnn_layer_memory.py", description=__doc__.splitlines()[0])
    ap.add_argument("framework", choices=["mxnet", "pytorch"])
    ap.add_argument("--steps", type=validate.positive_int_list, default=[100, 200, 400],
                    help="comma-separated T, each once (default 100,200,400)")
    ap.add_argument("--child", type=validate.positive_int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        __import__("mxnet" if args.framework == "mxnet" else "torch")   # the library's own memory: before start
        start = peak_gb()
        step = (mxnet_steps if args.framework == "mxnet" else pytorch_steps)()
        step(8)                                            # a tiny step: what does not depend on T
        built = peak_gb()
        step(args.child)
        first = peak_gb() - built
        step(args.child)
        print("  T = %3d: +%.2f GB for the layer and a 8-step step; then peak +%.2f GB in the first T-step step, "
              "+%.2f GB after the second" % (args.child, built - start, first, peak_gb() - built))
        sys.stdout.flush()
        return 0
    print("%s: one bidirectional %d-unit ReLU RNN layer, %d utterances; peak resident memory over a tiny step's"
          % (args.framework, HIDDEN, BATCH))
    sys.stdout.flush()
    for t in args.steps:                                  # a fresh process per T: no heap left from another
        subprocess.run([sys.executable, os.path.abspath(__file__), args.framework, "--child", str(t)], check=True,
                       stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
