"""The rows of the comparison: which notebook, in which environment, on which GPUs.

A *target* is one row of results.md.  Several targets can share a notebook (Keras 3 on three
backends) or an environment (Keras on JAX runs in the JAX environment); the environments are
runner/envs/definitions.py.  MXNet's data-parallel modes are here too: each is a row of its own in results.md.
"""
import os
from collections import OrderedDict
from typing import Dict, List, Optional, Tuple

from common.envinfo import cpu_flags
from common.spec import CONTROL_PRECISION

from runner.base import ROOT
from runner.envs.definitions import CNTK_UNSUPPORTED_PRECISIONS


class Target:
    """One row: a notebook run in an environment with fixed extra parameters.

    Which GPUs and drivers can run it is decided by its environment's CUDA builds in
    runner/envs/gpu_preflight.py (BUILDS); ``cpu_precisions`` are the precisions it runs on a CPU, with
    ``cpu_precision_reasons`` saying why the others do not; ``cpu_precision_flags`` the CPU features
    (/proc/cpuinfo flags) a precision needs beyond that, with what fails without them.
    """

    def __init__(self, name: str, label: str, notebook: str, env: str, parameters: Optional[dict] = None,
                 unsupported_gpu_precisions: Optional[Dict[str, str]] = None,
                 cpu_precisions: Tuple[str, ...] = ("fp32", "bf16"),
                 cpu_precision_reasons: Optional[Dict[str, str]] = None, variant_of: Optional[str] = None,
                 control_precisions: Tuple[str, ...] = (),
                 cpu_precision_flags: Optional[Dict[str, Tuple[Tuple[str, ...], str]]] = None,
                 gpu_only: Optional[str] = None):
        self.name = name
        self.variant_of = variant_of            # the row of record this target is a faster variant of
        self.label = label
        self.notebook = notebook
        self.env = env
        self.parameters = parameters or {}
        self.unsupported_gpu_precisions = unsupported_gpu_precisions or {}  # precision -> why it has no GPU path
        self.cpu_precisions = cpu_precisions                                 # precisions that run on a CPU
        self.cpu_precision_reasons = cpu_precision_reasons or {}            # precision -> why not on a CPU
        self.cpu_precision_flags = cpu_precision_flags or {}    # precision -> (CPU flags it needs, what fails without)
        self.control_precisions = control_precisions  # a reference mode (fp64), on any device; never a benchmark row
        self.gpu_only = gpu_only                # why it runs on a CUDA GPU only (every precision), or None

    @property
    def row_of_record(self) -> str:
        """The framework's row of record: this target, or the one it is a variant of."""
        return self.variant_of or self.name

    def cpu_precision_reason(self, precision: str, flags: Optional[set] = None) -> Optional[str]:
        """Why ``precision`` does not run on a CPU for this target, or None when it does; ``flags``: the
        CPU's features (default: this machine's, common/envinfo.py cpu_flags)."""
        if precision in self.control_precisions:
            return None
        if self.gpu_only:
            return self.gpu_only
        if precision in self.cpu_precisions:
            if precision not in self.cpu_precision_flags:
                return None
            needed, without = self.cpu_precision_flags[precision]
            missing = [f for f in needed if f not in (cpu_flags() if flags is None else flags)]
            return "precision %s: %s; this CPU lacks %s" % (precision, without, ", ".join(missing)) if missing else None
        if precision == "tf32":
            return "precision tf32 needs an NVIDIA GPU (Ampere or newer): TF32 is a format of its tensor cores, a CPU has none"
        return "precision %s: %s" % (precision, self.cpu_precision_reasons.get(
            precision, "%s does not run it on a CPU" % self.label))

    @property
    def notebook_path(self) -> str:
        return os.path.join(ROOT, "notebooks", self.notebook)


#: oneDNN's avx512_core ISA as /proc/cpuinfo flags: AVX-512 F, BW (byte/word), VL (vector length), DQ
AVX512_CORE = ("avx512f", "avx512bw", "avx512vl", "avx512dq")

TARGETS = OrderedDict((t.name, t) for t in [
    # fp64: the float64 control (common/spec.py CONTROL_PRECISION), the PyTorch notebook only
    Target("pytorch", "PyTorch (torch.nn)", "PyTorch_DS2.ipynb", "pytorch", control_precisions=(CONTROL_PRECISION,)),
    Target("tensorflow", "TensorFlow (tf.keras)", "TensorFlow_DS2.ipynb", "tensorflow"),
    # bf16 on a CPU: mx.contrib.amp's bfloat16 mode (oneDNN) puts convolutions and dense layers in bf16,
    # the RNN and CTC stay fp32 (the notebook says why)
    Target("mxnet", "MXNet (Gluon)", "MXNet_DS2.ipynb", "mxnet",
           unsupported_gpu_precisions={"bf16": "MXNet 1.9 has no bfloat16 GPU path (mx.contrib.amp casts to "
                                               "bfloat16 on the CPU only, to float16 on a GPU)"},
           # measured on an AVX2-only AMD EPYC: bfloat16 Convolution and FullyConnected both raise
           cpu_precision_flags={"bf16": (AVX512_CORE, "MXNet 1.9's oneDNN has bfloat16 Convolution and "
                                         "FullyConnected only on CPUs with AVX-512 (avx512_core), elsewhere they "
                                         "raise 'could not create a primitive descriptor iterator'")}),
    Target("cntk", "CNTK (cntk.layers)", "CNTK_DS2.ipynb", "cntk",
           unsupported_gpu_precisions=CNTK_UNSUPPORTED_PRECISIONS, cpu_precisions=("fp32",),
           cpu_precision_reasons={"bf16": CNTK_UNSUPPORTED_PRECISIONS["bf16"]}),
    Target("jax", "JAX (Flax NNX)", "JAX_Flax_DS2.ipynb", "jax"),
    Target("keras-jax", "Keras 3 (JAX backend)", "Keras3_DS2.ipynb", "jax", parameters={"backend": "jax"}),
    Target("keras-torch", "Keras 3 (torch backend)", "Keras3_DS2.ipynb", "pytorch", parameters={"backend": "torch"}),
    Target("keras-tensorflow", "Keras 3 (TensorFlow backend)", "Keras3_DS2.ipynb", "tensorflow",
           parameters={"backend": "tensorflow"}),
])


# ---- each framework's fastest known variant: its own row next to the row of record ------------------
#: name -> (row of record, label, the notebook's ``variant`` parameter).  The row of record stays the
#: framework's highest-level API; a variant changes only what its label says, and passes the same checks.
#: Named ``<row of record>+<variant>``.  No variant: CNTK (cntk.layers has no compiled or fused CPU path
#: beyond what the row of record uses), Keras on JAX (its row of record is already one XLA program) and Keras on
#: torch (torch.compile cannot compile Keras's SimpleRNN loop: its time index is a tensor, so Dynamo breaks the
#: graph and recompiles at every time step; the Keras notebook, section 7, shows it and refuses variant "compile").
_VARIANTS = [
    ("pytorch+compile", "pytorch", "PyTorch (torch.compile)", "compile"),
    ("pytorch+graphs", "pytorch", "PyTorch (CUDA graphs)", "graphs"),
    ("pytorch+bidir2", "pytorch", "PyTorch (RNN directions batched)", "bidir2"),
    ("pytorch+bidir2+graphs", "pytorch", "PyTorch (RNN directions batched, in CUDA graphs)", "bidir2+graphs"),
    ("tensorflow+xla", "tensorflow", "TensorFlow (tf.keras, XLA)", "xla"),
    ("mxnet+static", "mxnet", "MXNet (Gluon, static_shape)", "static"),
    ("jax+unroll", "jax", "JAX (Flax NNX, unrolled scan)", "unroll"),
    ("jax+hoist", "jax", "JAX (Flax NNX, input projection hoisted out of the scan)", "hoist"),
    ("jax+graphs", "jax", "JAX (Flax NNX, scan loops in CUDA graphs)", "graphs"),
    ("jax+bidir2", "jax", "JAX (Flax NNX, RNN directions in one scan)", "bidir2"),
    ("keras-tensorflow+xla", "keras-tensorflow", "Keras 3 (TensorFlow backend, XLA)", "xla"),
]


#: why a PyTorch variant that replays CUDA graphs (its ``variant`` named in) does not run on a CPU
_TORCH_GRAPHS = ("variant %s needs a CUDA GPU: it replays the training step from CUDA graphs (torch.cuda.CUDAGraph), "
                 "which a CPU does not have")
#: variants that run on a CUDA GPU only, with the reason run_all.py gives for not running them on a CPU
_GPU_ONLY = {
    "pytorch+graphs": _TORCH_GRAPHS % "graphs",
    "pytorch+bidir2+graphs": _TORCH_GRAPHS % "bidir2+graphs",
    "jax+graphs": "variant graphs needs a CUDA GPU: XLA records the scans' loops into CUDA graphs (its command "
                  "buffers), which a CPU does not have",
}


def _variant(name: str, of: str, label: str, variant: str) -> Target:
    base = TARGETS[of]
    return Target(name, label, base.notebook, base.env, parameters=dict(base.parameters, variant=variant),
                  unsupported_gpu_precisions=base.unsupported_gpu_precisions, cpu_precisions=base.cpu_precisions,
                  cpu_precision_reasons=base.cpu_precision_reasons, variant_of=of,
                  cpu_precision_flags=base.cpu_precision_flags, gpu_only=_GPU_ONLY.get(name))


VARIANTS = OrderedDict((name, _variant(name, of, label, v)) for name, of, label, v in _VARIANTS)
#: every target run_all.py knows: the rows of record, then the variants
ALL_TARGETS = OrderedDict(list(TARGETS.items()) + list(VARIANTS.items()))


def variants_of(name: str) -> list:
    """The variant targets of the row of record ``name``."""
    return [v for v in VARIANTS.values() if v.variant_of == name]


def select_targets(frameworks: List[str], with_variants: bool = False) -> list:
    """The targets of ``--frameworks`` in order; ``--variants`` adds each one's variant targets
    (``<row>+<variant>``) after them, once each."""
    targets = [ALL_TARGETS[name] for name in frameworks]
    if with_variants:
        targets += [v for t in list(targets) for v in variants_of(t.name) if v not in targets]
    return targets


def control_precision_error(targets, precisions) -> Optional[str]:
    """The one line that refuses a control precision (fp64) for a target that has none, or None."""
    for precision in precisions:
        if precision != CONTROL_PRECISION:
            continue
        for t in targets:
            if precision not in t.control_precisions:
                have = [n for n, x in ALL_TARGETS.items() if precision in x.control_precisions]
                return ("--precision %s is the float64 control of %s only (a reference trajectory, not a benchmark "
                        "row); %s has none" % (precision, ", ".join(have) or "no target", t.name))
    return None


def names() -> str:
    return ", ".join(TARGETS)


#: MXNet's data-parallel modes (``run_all.py --workers W --mxnet-dp MODE``): the notebook's ``kvstore`` and
#: ``sync_batchnorm`` parameters, the launcher, the record name's suffix and the run each must equal
MXNET_DP_MODES = OrderedDict([
    ("sync", {"parameters": {}, "launcher": "single", "suffix": "", "reference": "single-worker",
              "doc": "one process, W devices, kvstore 'device', SyncBatchNorm: equals one worker with batch W*b"}),
    ("local", {"parameters": {"kvstore": "device", "sync_batchnorm": False}, "launcher": "single",
               "suffix": "_localbn", "reference": None,
               "doc": "one process, W devices, kvstore 'device', each device its own BatchNorm statistics: the "
                      "reference of dist_sync (its first loss is checked against the NumPy reference per share)"}),
    ("dist_sync", {"parameters": {"kvstore": "dist_sync", "sync_batchnorm": False}, "launcher": "mxnet_dist_sync",
                   "suffix": "_dist_sync", "reference": "local",
                   "doc": "W worker processes + a ps-lite scheduler + a server, kvstore 'dist_sync', each process its "
                          "own BatchNorm statistics (MXNet 1.9 cannot synchronise them across processes): equals "
                          "'local'"}),
])
