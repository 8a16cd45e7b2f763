"""How long XLA takes to compile the JAX notebook's training step, one program per batch shape, and what the levers
do: threads, one shape first, XLA's autotuning; and the levers on the step's speed: the loop in a CUDA graph, the
notebook's variants.

    python3 benchmarks/jax_compile.py --settings threads,dump,loaded --out jax_compile.json   # on a GPU: ~3 min
                                                      # (every setting, the default: 20-80 s each, past one call)
    .venvs/jax-cpu/bin/python benchmarks/jax_compile.py --preset smoke       # a CPU check of the script

On an H200 the JAX row's warm-up took 208 s for its 15 shapes: 16 threads compiled them in 201 s with 2,048 s of
compile time between them, where one after another they had taken 229 s (the JAX notebook, section 8).  This
script measures the compile alone, on fewer shapes, each setting in a fresh process (XLA_FLAGS are read at the
import of JAX, and nothing a setting compiled or autotuned carries into the next) with JAX's persistent cache off:

- ``serial``: one program after another;
- ``threads``: every program at once on a thread pool (the notebook's ``compile_ahead`` on a GPU);
- ``first``: the first shape alone, then the others at once (XLA keeps its autotuning results in the process: what
  the shapes share is tuned once);
- ``autotune0``: ``threads`` with ``XLA_FLAGS=--xla_gpu_autotune_level=0`` (no autotuning: the libraries'
  default kernels);
- ``cublas``: ``threads`` with ``XLA_FLAGS=--xla_gpu_enable_triton_gemm=false`` (matrix products by cuBLAS only:
  XLA still picks among cuBLAS's algorithms, but compiles and times no Triton candidates, the bulk of its
  autotuning);
- ``dump``: ``serial``, and XLA writes what it autotuned to a file (``--xla_gpu_dump_autotune_results_to``; each
  compilation writes the file whole, so they go one at a time: two writing at once could mix it);
- ``loaded``: ``threads`` in a fresh process that reads that file first (``--xla_gpu_load_autotune_results_from``):
  the warm-up a user would see if the project shipped the card's autotuning results (run after ``dump``; on a CPU,
  where XLA autotunes nothing and writes no file, it is skipped with that reason);
- ``graphs``: ``threads`` with ``XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL``: XLA records the
  scan's ``while`` loop, body and all, into one CUDA graph (CUDA's conditional graph nodes), so the GPU runs the
  recurrence's steps without the host launching each one, as ``pytorch+graphs`` replays PyTorch's step (XLA's
  default list of what goes into command buffers, as its sources read in 2025 have it, holds fusions and library
  calls but no loops; the steps against ``threads`` say whether this jaxlib's does; on a CPU the flag changes
  nothing; the JAX notebook's variant ``graphs`` sets the same flag);
- ``hoist`` and ``bidir2``: ``threads`` with the notebook's variant of that name (section 4: the input products out
  of the scans; both directions in one scan as well, and dL/dU after it), so that the steps against ``threads``
  say what each variant buys on a few shapes, before a whole row is spent on it;
- ``bidir2_graphs``: ``bidir2`` with ``graphs``'s flag: the one scan per layer, its loop in a CUDA graph (the two
  levers together, which no notebook row runs: against ``bidir2`` and ``graphs`` it says whether they add up);

- ``perfusion``: ``threads`` with XLA's per-fusion autotuning cache in an empty folder
  (``--xla_gpu_per_fusion_autotune_cache_dir``, what JAX's persistent cache uses: one file per fusion, each written
  whole, so threads may write at once), and ``perfusion_read``: ``threads`` in a fresh process with that folder, now
  filled: whether XLA reads such files back, which would let a run that keeps its autotuning results compile on
  every core instead of one program at a time as ``dump`` does (the JSON holds the file count and one file's text;
  on a CPU XLA writes none and ``perfusion_read`` is skipped with that reason).

``--autotune-results FILE`` (a card's committed results) has every setting but ``dump``, ``loaded``, ``autotune0``
and the two ``perfusion`` ones read them first, so that a comparison of steps (``threads``, ``graphs``, ``hoist``,
``bidir2``) spends seconds, not minutes, compiling; what the file lacks (a variant's own products) is autotuned as
usual.

And, for each, the median of ``--steps`` training steps per shape (what a lever costs in speed).  The
model, loss, optimizer and training step are the notebook's own cells (sections 4, 6 and 7), at ``--precision``;
the shapes are ``--lengths`` seconds of the preset's batches.  It prints a line per setting and rewrites ``--out``
(JSON) after each, so a call stopped at its time limit keeps the settings that finished.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from common import xla_autotune  # noqa: E402  (no framework import)
from common.compile_cache import LOOP_GRAPHS_FLAG  # noqa: E402
from runner import validate  # noqa: E402  (standard library only)

NOTEBOOK = os.path.join(ROOT, "notebooks", "JAX_Flax_DS2.ipynb")
#: XLA's per-fusion autotuning cache: a folder of one file per fusion, each written whole (a temporary file renamed)
PER_FUSION_FLAG = "--xla_gpu_per_fusion_autotune_cache_dir"
SETTINGS = {
    "serial": {"threads": 1, "first": False, "xla_flags": ""},
    "threads": {"threads": None, "first": False, "xla_flags": ""},
    "first": {"threads": None, "first": True, "xla_flags": ""},
    "autotune0": {"threads": None, "first": False, "xla_flags": "--xla_gpu_autotune_level=0"},
    "cublas": {"threads": None, "first": False, "xla_flags": "--xla_gpu_enable_triton_gemm=false"},
    "dump": {"threads": 1, "first": False, "xla_flags": xla_autotune.DUMP_FLAG + "={autotune}"},
    "loaded": {"threads": None, "first": False, "xla_flags": xla_autotune.LOAD_FLAG + "={autotune}"},
    "graphs": {"threads": None, "first": False, "xla_flags": LOOP_GRAPHS_FLAG},     # the JAX notebook's variant
    "hoist": {"threads": None, "first": False, "xla_flags": "", "variant": "hoist"},   # the notebook's variants
    "bidir2": {"threads": None, "first": False, "xla_flags": "", "variant": "bidir2"},
    "bidir2_graphs": {"threads": None, "first": False, "xla_flags": LOOP_GRAPHS_FLAG, "variant": "bidir2"},
    "perfusion": {"threads": None, "first": False, "xla_flags": PER_FUSION_FLAG + "={perfusion}"},
    "perfusion_read": {"threads": None, "first": False, "xla_flags": PER_FUSION_FLAG + "={perfusion}"},
}
#: the autotuning results ``dump`` writes and ``loaded`` reads (text format: XLA picks it by the file's extension)
AUTOTUNE_FILE = "autotune_results.textproto"
#: the folder ``perfusion`` fills and ``perfusion_read`` reads
PER_FUSION_DIR = "per_fusion_autotune_cache"


#: the settings that measure XLA's autotuning itself: ``--autotune-results`` leaves them as they are
AUTOTUNING_SETTINGS = ("dump", "loaded", "autotune0", "perfusion", "perfusion_read")


def setting_flags(name: str, autotune_file: str, read: str = None, per_fusion_dir: str = "") -> str:
    """The XLA_FLAGS a setting adds, with the autotuning results' file (and the per-fusion folder) filled in; ``read``:
    a card's committed results (``--autotune-results``), read first by every setting that does not measure the
    autotuning itself."""
    flags = SETTINGS[name]["xla_flags"].format(autotune=autotune_file, perfusion=per_fusion_dir)
    if read and name not in AUTOTUNING_SETTINGS:
        flags = (flags + " %s=%s" % (xla_autotune.LOAD_FLAG, read)).strip()
    return flags


def per_fusion_summary(folder: str) -> dict:
    """What ``perfusion`` left in ``folder``: how many files, their bytes, and the text of the first (the format, for
    the JSON: a device call returns it inside the one file)."""
    names = sorted(n for n in os.listdir(folder) if not n.startswith(".")) if os.path.isdir(folder) else []
    sizes = [os.path.getsize(os.path.join(folder, n)) for n in names]
    sample = None
    if names:
        with open(os.path.join(folder, names[0]), errors="replace") as f:
            sample = {"name": names[0], "text": f.read(4000)}
    return {"files": len(names), "bytes": sum(sizes), "sample": sample}


def autotune_summary(path: str) -> dict:
    """What ``dump`` left at ``path``: its size, the number of results in it, and its text (for the JSON, so that
    a device call returns it inside the one file)."""
    with open(path) as f:
        text = f.read()
    try:
        entries = xla_autotune.count(text)
    except ValueError:                                       # not a whole file: the JSON keeps its text all the same
        entries = None
    return {"bytes": len(text.encode()), "results": entries, "textproto": text}


def measure(preset, precision, lengths, threads, first, steps, variant=""):
    """In this process: the notebook's step (its model in ``variant``) compiled for each length's batch shape, then
    timed."""
    import operator
    import statistics
    from concurrent.futures import ThreadPoolExecutor

    sys.path.insert(0, ROOT)
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from common.data import DeepMarkIterator
    from common.spec import get_preset

    jax.config.update("jax_enable_compilation_cache", False)
    jax.config.update("jax_default_matmul_precision", "tensorfloat32" if precision == "tf32" else "float32")
    compile_s = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, seconds, **kw: compile_s.append(seconds) if event == "/jax/core/compile/backend_compile_duration"
        else None)
    P = get_preset(preset)
    with open(NOTEBOOK) as f:
        cells = [c for c in json.load(f)["cells"] if c["cell_type"] == "code"]
    g = {"jax": jax, "jnp": jnp, "nnx": nnx, "optax": optax, "operator": operator, "np": np, "cfg": P.config,
         "seed": 0, "variant": variant, "scan_unroll": 1,
         "compute_dtype": jnp.bfloat16 if precision == "bf16" else jnp.float32}
    for tag in ("rosetta:model", "rosetta:loss", "rosetta:optimizer"):
        for c in cells:
            if tag in c["metadata"].get("tags", []):
                exec(c["source"] if isinstance(c["source"], str) else "".join(c["source"]), g)
    model, optimizer, step = g["model"], g["optimizer"], g["train_step_jit"]
    data = DeepMarkIterator(P.batch_size, P.scale, 0, lengths=P.lengths, n_freq=P.config.n_freq,
                            n_classes=P.config.n_classes)
    batches = {}
    for batch in data.warmup_batches():
        if batch.seconds in lengths and batch.seconds not in batches and batch.batch_size == P.batch_size:
            batches[batch.seconds] = batch
    missing = sorted(set(lengths) - set(batches))
    if missing:
        raise SystemExit("the %s preset has no full batch of %s s" % (preset, missing))
    order = sorted(batches)
    shapes = {s: [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (batches[s].features, batches[s].labels)]
              for s in order}
    start = time.perf_counter()
    lowered = {s: step.lower(model, optimizer, *shapes[s]) for s in order}
    lower_s = time.perf_counter() - start
    pool = ThreadPoolExecutor(max_workers=threads or os.cpu_count())
    before = len(compile_s)                                   # the model's initialisation compiled programs too
    start = time.perf_counter()
    first_s = None
    if first:
        lowered[order[0]].compile()
        first_s = time.perf_counter() - start
    rest = order[1:] if first else order
    list(pool.map(lambda s: lowered[s].compile(), rest))
    wall_s = time.perf_counter() - start
    compiled = compile_s[before:]
    step_ms = {}
    for s in order:
        x, y = jax.device_put(batches[s].features), jax.device_put(batches[s].labels)
        jax.block_until_ready(step(model, optimizer, x, y))      # loads the compiled program
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            jax.block_until_ready(step(model, optimizer, x, y))
            times.append(time.perf_counter() - t)
        step_ms[s] = 1000 * statistics.median(times)
    device = jax.local_devices()[0]
    return {"device": device.device_kind, "platform": device.platform, "jax": jax.__version__, "variant": variant,
            "programs": len(order), "lengths_s": order, "lower_s": lower_s, "compile_wall_s": wall_s,
            "first_s": first_s, "compile_s_summed": sum(compiled), "compiles": len(compiled),
            "threads": threads or os.cpu_count(), "step_ms_median": step_ms}


def length_list(text: str) -> str:
    """--lengths: a comma list of DeepMark's utterance lengths (1 to 15 s), each once; kept as typed (the child
    processes get it again)."""
    items = [t.strip() for t in text.split(",")]
    if not all(t.isdigit() and 1 <= int(t) <= 15 for t in items):
        raise argparse.ArgumentTypeError("%r: expected seconds from 1 to 15, such as 1,8,15" % text)
    twice = validate.first_repeated([int(t) for t in items])
    if twice is not None:
        raise argparse.ArgumentTypeError("%r names %d twice; name each length once" % (text, twice))
    return ",".join(items)


def main(argv=None):
    p = validate.OneLineParser(prog="jax_compile.py", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="quick", help="the batches' preset (default quick; smoke for a CPU check)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    p.add_argument("--lengths", type=length_list, default="1,8,15",
                   help="utterance lengths in seconds (1 to 15, each once), one program each (default 1,8,15)")
    p.add_argument("--settings", default=",".join(SETTINGS), help="default: %s" % ",".join(SETTINGS))
    p.add_argument("--steps", type=validate.positive_int, default=3,
                   help="timed steps per shape after compiling, at least 1 (default 3)")
    p.add_argument("--out", type=validate.non_empty("file"), default=None,
                   help="a JSON file for the results: new, or this benchmark's, in a folder that exists")
    p.add_argument("--autotune-results", default=None, metavar="FILE",
                   help="a card's autotuning results (results/autotune/jax-<jaxlib>/<card>.textproto), read first by "
                        "every setting but %s: their compile then costs what a run with the project's results "
                        "costs, and the steps are what the comparison is for" % ", ".join(AUTOTUNING_SETTINGS))
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)     # the child process: one setting
    args = p.parse_args(argv)
    lengths = [int(s) for s in args.lengths.split(",")]          # checked by length_list
    if args.measure:
        setting = SETTINGS[args.measure]
        print("RESULT " + json.dumps(measure(args.preset, args.precision, lengths, setting["threads"],
                                             setting["first"], args.steps, setting.get("variant", ""))), flush=True)
        return 0
    unknown = [s for s in args.settings.split(",") if s not in SETTINGS]
    if unknown:
        p.error("--settings: unknown %s; choose from %s" % (", ".join(unknown), ", ".join(SETTINGS)))
    problem = (validate.result_file_error("--out", args.out, validate.benchmark_file("jax_compile"))
               if args.out is not None else None)
    if problem:
        p.error(problem)
    if args.autotune_results is not None:
        if not os.path.isfile(args.autotune_results):
            p.error("--autotune-results: no file %s" % args.autotune_results)
        args.autotune_results = os.path.abspath(args.autotune_results)
        if any(c.isspace() for c in args.autotune_results):
            p.error("--autotune-results: %s has whitespace, which XLA_FLAGS cannot hold" % args.autotune_results)
    results = {}
    workdir = tempfile.mkdtemp(prefix="ds2-jax-compile-")        # the autotuning results between dump and loaded
    autotune_file = os.path.join(workdir, AUTOTUNE_FILE)
    per_fusion_dir = os.path.join(workdir, PER_FUSION_DIR)     # between perfusion and perfusion_read
    os.makedirs(per_fusion_dir)                                # XLA wants the folder to exist

    def write():                  # after every setting: a call stopped at its limit keeps what finished
        if args.out:
            with open(args.out + ".partial", "w") as f:
                json.dump({"benchmark": "jax_compile", "preset": args.preset, "precision": args.precision,
                           "lengths": lengths, "autotune_results_read": args.autotune_results, "results": results},
                          f, indent=1)
            os.replace(args.out + ".partial", args.out)

    def nothing_to_read(name):
        """Why a setting that reads what an earlier one wrote cannot run (None: it can)."""
        if name == "loaded" and not os.path.exists(autotune_file):
            return ("no autotuning results to load: `dump` did not run before it" if "dump" not in results else
                    "no autotuning results to load: XLA wrote none in `dump` (it autotunes on a GPU only)")
        if name == "perfusion_read" and not per_fusion_summary(per_fusion_dir)["files"]:
            return ("nothing to read: `perfusion` did not run before it" if "perfusion" not in results else
                    "nothing to read: XLA wrote no per-fusion results in `perfusion` (it autotunes on a GPU only)")
        return None

    for name in args.settings.split(","):
        why = nothing_to_read(name)
        if why:
            results[name] = {"skipped": why}
            print("%-10s skipped: %s" % (name, why), flush=True)
            write()
            continue
        env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
        flags = setting_flags(name, autotune_file, args.autotune_results, per_fusion_dir)
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--measure", name, "--preset", args.preset,
                               "--precision", args.precision, "--lengths", args.lengths, "--steps", str(args.steps)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
        lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
        if proc.returncode or not lines:
            results[name] = {"error": proc.stdout[-2000:], "exit": proc.returncode}
            print("%-10s failed (exit %s): %s" % (name, proc.returncode, proc.stdout.strip().splitlines()[-1:]))
            write()
            continue
        results[name] = dict(json.loads(lines[-1][7:]), xla_flags=env["XLA_FLAGS"],
                             process_s=time.perf_counter() - t)
        r = results[name]
        print("%-10s %d programs: compile %6.1f s wall (%6.1f s summed, first alone %s), lower %.1f s; step ms %s"
              % (name, r["programs"], r["compile_wall_s"], r["compile_s_summed"],
                 "-" if r["first_s"] is None else "%.1f s" % r["first_s"], r["lower_s"],
                 " ".join("%ss %.1f" % (s, ms) for s, ms in sorted(r["step_ms_median"].items(), key=lambda kv:
                                                                    int(kv[0])))), flush=True)
        if name == "perfusion":
            a = r["per_fusion_results"] = per_fusion_summary(per_fusion_dir)
            print("%-10s per-fusion results: %d files in %d bytes" % ("", a["files"], a["bytes"]), flush=True)
        if name == "dump":
            a = r["autotune_results"] = autotune_summary(autotune_file) if os.path.exists(autotune_file) else None
            print("%-10s autotuning results: %s" % ("", "none written (XLA autotunes on a GPU only)" if a is None else
                                                     "%s in %d bytes" % (a["results"], a["bytes"])), flush=True)
        write()
    shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
