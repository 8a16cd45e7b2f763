"""The recurrence's latency on the device in hand: the figures the latency-aware roofline needs.

    python benchmarks/rnn_latency.py [--out rnn_latency.json]                 # a GPU: about 30 s
    .venvs/pytorch-cpu/bin/python benchmarks/rnn_latency.py --smoke --out x.json   # a CPU, tiny sizes

At each precision (``fp32``: TF32 off; ``tf32``; ``bf16``) and at DS2's sizes (batch N = 32, hidden H = 1760,
T/4 = 375 steps: a 15-s utterance), four measurements, each the median of ``--repeats`` after a warm-up:

- ``t_step_s``: one dependent recurrent step.  A chain of ``h = relu(x_t + h @ U)`` over the steps (``addmm``,
  then ``relu``), with (N, H) states and an (H, H) ``U``; on a GPU captured once in a CUDA graph
  (``torch.cuda.CUDAGraph``, after a warm-up on a side stream) and replayed, so no launch gap separates
  the steps; on a CPU timed plainly.  ``t_step_s`` = the chain's time / steps.  ``t_step_eager_s`` is the
  same chain launched op by op (what a framework loop pays).
- ``rnn_fwd_s``, ``rnn_fwd_bwd_s``: one bd layer as ``torch.nn.RNN(H, H, nonlinearity="relu",
  bidirectional=True)`` (cuDNN on a GPU) over the steps, forward (training mode, with autograd) and
  forward + backward; ``rnn_uni_fwd_s``: the same layer in one direction.  ``directions_overlap`` is
  true where the bidirectional forward takes less than 1.5 x the unidirectional one (about 1 x: the
  two directions run side by side; about 2 x: one after the other).
- ``gemm_flops_per_s``: dense products of the model's shapes: ``input`` ((T/4 N) x 2400 . 2400 x H: bd1's
  input product over every step at once), ``hidden`` ((T/4 N) x H . H x H: bd2..7's) and ``recurrent``
  (N x H . H x H: one step).
- ``rnn_dtype``: the dtype the RNN ran in, read from its output.  Under ``bf16`` the RNN's weights and
  input are cast to bfloat16 explicitly (no autocast: PyTorch's autocast kernel for ``_cudnn_rnn`` casts
  to float16 whatever dtype it was given); where that raises, ``rnn_error`` holds the error's first line
  and the RNN figures are float16's, labelled ``fp16``.  ``rnn_backend`` is ``cudnn`` where the profiler
  saw ``aten::_cudnn_rnn``, else ``native``.  On CUDA, ``autocast_rnn_dtype`` is the output dtype of the
  fp32 layer run under ``torch.autocast("cuda", dtype=torch.bfloat16)``.

It writes one JSON object (``--out``, default stdout): the device, the versions, the sizes and
``precisions`` -> {the figures above}.  It needs PyTorch and the standard library only (its options are checked
by ``runner/validate.py``, which needs nothing more).  ``common/roofline.py``
turns the figures into the latency-aware bound (docs/benchmark.md, "The latency-aware roofline").
"""
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runner import validate  # noqa: E402  (standard library only)

torch = None     # imported by main() once the options are checked: a refusal costs no import of PyTorch

FULL = {"batch": 32, "hidden": 1760, "input": 2400, "steps": 375, "repeats": 5, "min_time_s": 0.1}
SMOKE = {"batch": 4, "hidden": 32, "input": 48, "steps": 12, "repeats": 3, "min_time_s": 0.002}
PRECISIONS = ("fp32", "tf32", "bf16")
#: bidirectional forward / unidirectional forward below this: the two directions overlap
OVERLAP_RATIO = 1.5


def set_precision(precision):
    """TF32 on or off for matmuls and cuDNN (the legacy flags only); the dtype of the operands."""
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return torch.bfloat16 if precision == "bf16" else torch.float32


def make_timer(device):
    """``timer(fn)`` -> seconds of one call of ``fn``, the device synchronised (CUDA events on a GPU)."""
    if device.type == "cuda":
        def timer(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3
    else:
        def timer(fn):
            start = time.perf_counter()
            fn()
            return time.perf_counter() - start
    return timer


def median_time(timer, fn, repeats, warmup=2):
    for _ in range(warmup):
        timer(fn)
    return statistics.median(timer(fn) for _ in range(repeats))


# ---- one dependent step ----------------------------------------------------------------------------------------
def chain(x, u, h):
    """``h = relu(x_t + h @ U)`` for every t: each step needs the last one's result."""
    for t in range(x.shape[0]):
        h = torch.relu(torch.addmm(x[t], h, u))
    return h


def step_time(device, dtype, sz, timer):
    """(t_step_s, t_step_eager_s): the chain's median time / steps, replayed from a CUDA graph and launched
    op by op (the same on a CPU)."""
    n, hid, steps = sz["batch"], sz["hidden"], sz["steps"]
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = (torch.randn(steps, n, hid, generator=gen) * 0.1).to(device, dtype)
    u = (torch.randn(hid, hid, generator=gen) / hid ** 0.5).to(device, dtype)
    h0 = torch.zeros(n, hid, device=device, dtype=dtype)
    with torch.no_grad():
        eager = median_time(timer, lambda: chain(x, u, h0), sz["repeats"])
        if device.type != "cuda":
            return eager / steps, eager / steps
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                       # warm-up before capture (cuBLAS workspaces)
            for _ in range(3):
                chain(x, u, h0)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            chain(x, u, h0)
        replayed = median_time(timer, graph.replay, sz["repeats"])
    return replayed / steps, eager / steps


# ---- cuDNN's RNN layer -----------------------------------------------------------------------------------------
def rnn_backend(layer, x):
    """``cudnn`` where one forward calls ``aten::_cudnn_rnn``, else ``native``."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU]) as prof:
        layer(x)
    names = {e.key for e in prof.key_averages()}
    return "cudnn" if "aten::_cudnn_rnn" in names else "native"


def rnn_times(device, dtype, sz, timer):
    """Forward, forward + backward (bidirectional) and forward (one direction) of one layer, and what ran."""
    n, hid, steps = sz["batch"], sz["hidden"], sz["steps"]
    torch.manual_seed(0)
    out = {}
    bi = torch.nn.RNN(hid, hid, nonlinearity="relu", bidirectional=True).to(device, dtype)
    uni = torch.nn.RNN(hid, hid, nonlinearity="relu", bidirectional=False).to(device, dtype)
    x = (torch.randn(steps, n, hid) * 0.1).to(device, dtype).requires_grad_(True)
    y, _ = bi(x)                                             # raises here if the backend refuses the dtype
    grad = torch.ones_like(y)

    def fwd_bwd():
        bi(x)[0].backward(grad)

    out["rnn_dtype"] = str(y.dtype).replace("torch.", "")
    out["rnn_backend"] = rnn_backend(bi, x)
    out["rnn_fwd_s"] = median_time(timer, lambda: bi(x), sz["repeats"])
    out["rnn_fwd_bwd_s"] = median_time(timer, fwd_bwd, sz["repeats"])
    out["rnn_uni_fwd_s"] = median_time(timer, lambda: uni(x), sz["repeats"])
    ratio = out["rnn_fwd_s"] / out["rnn_uni_fwd_s"]
    out["bidirectional_over_unidirectional"] = ratio
    out["directions_overlap"] = bool(ratio < OVERLAP_RATIO)
    out["rnn_fwd_per_step_s"] = out["rnn_fwd_s"] / steps
    return out


def rnn_section(device, dtype, precision, sz, timer):
    if precision != "bf16":
        return rnn_times(device, dtype, sz, timer)
    try:
        out = rnn_times(device, torch.bfloat16, sz, timer)
        out["rnn_error"] = None
    except Exception as exc:                                 # the backend refuses bfloat16: report fp16
        first = (str(exc).strip().splitlines() or [""])[0]
        out = rnn_times(device, torch.float16, sz, timer)
        out["rnn_error"] = "%s: %s" % (type(exc).__name__, first[:300])
    if device.type == "cuda":                                # what autocast does to the fp32 layer
        layer = torch.nn.RNN(sz["hidden"], sz["hidden"], nonlinearity="relu", bidirectional=True).to(device)
        x = torch.randn(sz["steps"], sz["batch"], sz["hidden"], device=device)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            out["autocast_rnn_dtype"] = str(layer(x)[0].dtype).replace("torch.", "")
    return out


# ---- dense products --------------------------------------------------------------------------------------------
def gemm_rate(device, dtype, m, k, n, timer, min_time_s, repeats):
    """FLOP/s of an (m, k) x (k, n) product: enough products per measurement to last ``min_time_s``."""
    a = torch.randn(m, k, device=device).to(dtype)
    b = torch.randn(k, n, device=device).to(dtype)
    with torch.no_grad():
        once = max(median_time(timer, lambda: a @ b, 1, warmup=1), 1e-9)
        iterations = max(1, int(min_time_s / once))

        def run():
            for _ in range(iterations):
                a @ b
        return 2.0 * m * k * n * iterations / median_time(timer, run, repeats, warmup=0)


def gemm_section(device, dtype, sz, timer):
    rows = sz["steps"] * sz["batch"]
    shapes = {"input": (rows, sz["input"], sz["hidden"]), "hidden": (rows, sz["hidden"], sz["hidden"]),
              "recurrent": (sz["batch"], sz["hidden"], sz["hidden"])}
    rates = {name: gemm_rate(device, dtype, m, k, n, timer, sz["min_time_s"], sz["repeats"])
             for name, (m, k, n) in shapes.items()}
    return rates, {name: list(s) for name, s in shapes.items()}


# ---- the report ------------------------------------------------------------------------------------------------
def describe_device(device):
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return {"type": "cuda", "name": props.name, "capability": "%d.%d" % (props.major, props.minor),
                "memory_gib": round(props.total_memory / 2 ** 30, 1)}
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"type": "cpu", "name": name, "threads": torch.get_num_threads()}


def versions():
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": cudnn,
            "python": platform.python_version()}


def measure(device, precisions, sz):
    timer = make_timer(device)
    report = {"benchmark": "rnn_latency", "device": describe_device(device), "versions": versions(),
              "sizes": dict(sz), "precisions": {}}
    started = time.perf_counter()
    for precision in precisions:
        dtype = set_precision(precision)
        t_step, t_eager = step_time(device, dtype, sz, timer)
        entry = {"t_step_s": t_step, "t_step_eager_s": t_eager, "chain_s": t_step * sz["steps"]}
        entry.update(rnn_section(device, dtype, precision, sz, timer))
        entry["gemm_flops_per_s"], report["sizes"]["gemm_shapes"] = gemm_section(device, dtype, sz, timer)
        if device.type != "cuda" and precision == "tf32":
            entry["note"] = "TF32 is a GPU mode: on a CPU this is fp32"
        report["precisions"][precision] = entry
    set_precision("fp32")
    report["wall_s"] = time.perf_counter() - started
    return report


def parse_args(argv=None):
    """(the parser, the options), checked before PyTorch is imported (one line and exit status 2 where one is bad)."""
    ap = validate.OneLineParser(prog="rnn_latency.py", description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU test): N=4, H=32, 12 steps")
    for key, text in (("batch", "batch size N (default 32)"), ("hidden", "hidden width H (default 1760)"),
                      ("input", "bd1's input width for the input product's rate (default 2400)"),
                      ("steps", "dependent steps T/4 (default 375: a 15-s utterance)"),
                      ("repeats", "measurements per figure, the median reported (default 5)")):
        ap.add_argument("--" + key, *(["-N"] if key == "batch" else []), type=validate.positive_int, help=text)
    ap.add_argument("--precisions", type=validate.comma_list(PRECISIONS, "precision"), default=list(PRECISIONS),
                    help="comma-separated, of fp32,tf32,bf16")
    ap.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    ap.add_argument("--out", type=validate.non_empty("file"),
                    help="write the JSON here: a new file, or this benchmark's, in a folder that exists "
                         "(default: stdout)")
    args = ap.parse_args(argv)
    problem = args.out is not None and validate.result_file_error("--out", args.out,
                                                                  validate.benchmark_file("rnn_latency"))
    if problem:
        ap.error(problem)
    return ap, args


def main(argv=None):
    global torch
    ap, args = parse_args(argv)
    import torch
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: no CUDA device is visible to this PyTorch")
    sz = dict(SMOKE if args.smoke else FULL)
    sz.update({key: getattr(args, key) for key in ("batch", "hidden", "input", "steps", "repeats")
               if getattr(args, key) is not None})
    sz["smoke"] = bool(args.smoke)
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device("cuda" if use_cuda else "cpu")
    text = json.dumps(measure(device, args.precisions, sz), indent=1, sort_keys=True) + "\n"
    if args.out:                  # written whole: a stopped run leaves no half a file
        with open(args.out + ".partial", "w") as f:
            f.write(text)
        os.replace(args.out + ".partial", args.out)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
