"""GPU preflight: which framework build can run on this GPU and driver, decided before anything is built.

Standard library only (run_all.py calls it before any framework environment exists).  Two facts
decide whether a CUDA build of a framework runs on a machine:

1. **The driver.**  A build made with CUDA X.y needs a driver at least as new as the minimum of
   CUDA X's family (minor-version compatibility, CUDA 11 and later: any 12.y build runs on a
   525+ driver, any 13.y build needs 580+).  ``DRIVER_MINIMUM`` below.
2. **The GPU architecture.**  Machine code (SASS) for ``sm_XY`` runs on GPUs of compute capability
   X.z with z >= Y (sm_80 code runs on an sm_86 or sm_89 GPU, never on sm_90); PTX for
   ``compute_XY`` is compiled by the driver (JIT) for any GPU of capability >= X.Y, at the first
   start -- which can take many minutes, cached afterwards in ``~/.nv/ComputeCache``.  A build with
   neither for this GPU fails with "no kernel image is available".  JAX (XLA) compiles its kernels
   for the GPU at run time with the ``ptxas`` of its CUDA wheels, so its limit is what that ptxas
   targets.

``BUILDS`` holds, per environment, the CUDA builds this project can install, newest first, each
with where its facts come from; :func:`plan` picks for each target the newest build that runs here
(or the one forced with ``--gpu-build ENV=BUILD`` / ``DS2_GPU_BUILD``), or says why none does.
``tools/fatbin_archs.py`` reads the architectures out of a library (what "verified" means below).
"""
import os
import re
from collections import OrderedDict
from typing import Dict, List, Optional, Sequence, Tuple

from common import envinfo
from runner.validate import assignments      # standard library only, like this module

#: Minimum Linux driver per CUDA major version: NVIDIA, "CUDA Compatibility", Minor Version
#: Compatibility, Table 1 (CUDA 13.x >= 580, 12.x >= 525, 11.x >= 450; 11.x from 450.80.02 on,
#: https://docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html) and the CUDA
#: 10.0 release notes' toolkit/driver table (10.0.130 >= 410.48).  The 12.x and 13.x patch levels
#: (525.60.13, 580.65.06) are those of the CUDA 12.0 and 13.0 release notes' tables.
DRIVER_MINIMUM = {
    "10": "410.48",
    "11": "450.80.02",
    "12": "525.60.13",
    "13": "580.65.06",
}


class Build:
    """One CUDA build of a framework environment and the facts that decide where it runs."""

    def __init__(self, env: str, name: str, package: str, cuda: str, pins: str, source: str,
                 sass: Sequence[int] = (), ptx: Sequence[int] = (), codegen: Optional[Tuple[int, int]] = None,
                 verified: bool = False, note: Optional[Tuple[str, str]] = None, jit_note: str = ""):
        self.env = env                  # the environment (runner/run/targets.py ENVS)
        self.name = name                # short name: cu130, cuda12, ... (--gpu-build ENV=NAME)
        self.package = package          # what is installed, in words
        self.cuda = cuda                # CUDA version it was built with / runs on
        self.pins = pins                # its pins file under envs/
        self.sass = tuple(sass)         # sm_XY machine code in its GPU libraries
        self.ptx = tuple(ptx)           # compute_XY PTX the driver can JIT for newer GPUs
        self.codegen = codegen          # (lowest, highest) sm XLA's ptxas compiles for (JAX), or None
        self.source = source            # where the facts come from
        self.verified = verified        # architectures read from the binaries by this project
        self.note = note                # (driver version, caveat shown when the driver is older than it)
        self.jit_note = jit_note        # the caveat when it runs through the driver's PTX JIT

    @property
    def cuda_major(self) -> str:
        return self.cuda.split(".")[0]

    def arch_summary(self) -> str:
        if self.codegen:
            return "compiles for sm_%d-sm_%d at run time (ptxas)" % self.codegen
        sass = ", ".join("sm_%d" % a for a in self.sass) or "none"
        ptx = ", ".join("compute_%d" % a for a in self.ptx) or "none"
        return "SASS %s; PTX %s" % (sass, ptx)

    def __repr__(self):
        return "Build(%s %s)" % (self.env, self.name)


# ---- the facts: one table -------------------------------------------------------------------------
# "verified" = the architectures were read from the wheel's libraries with tools/fatbin_archs.py (and,
# where cuobjdump 13.5 could read them, cuobjdump --list-elf/--list-ptx agreed), 2026-11, on a CPU machine.
# Nothing here was run on a GPU.
BUILDS = OrderedDict()  # type: Dict[str, List[Build]]


def _add(*builds: Build) -> None:
    for b in builds:
        BUILDS.setdefault(b.env, []).append(b)


_add(
    # PyTorch: PyPI's torch 2.13.0 is +cu130; PyTorch's own index serves +cu128 and +cu126 builds.
    Build("pytorch", "cu130", "torch 2.13.0+cu130 (PyPI)", "13.0", "pytorch-cuda.txt",
          sass=(75, 80, 86, 90, 100, 120), verified=True,
          source="torch/version.py of the PyPI wheel (cuda='13.0'); libtorch_cuda.so read with "
                 "tools/fatbin_archs.py and cuobjdump 13.5: all 449 fat binaries carry SASS sm_75, 80, 86, 90, 100, "
                 "120 (59 also sm_103, 1 also sm_89/sm_121), none PTX; torch.cuda.get_arch_list() agrees "
                 "(libtorch_cuda_linalg.so starts at sm_80)"),
    Build("pytorch", "cu128", "torch 2.13.0+cu128 (download.pytorch.org/whl/cu128)", "12.8",
          "pytorch-cuda-cu128.txt", sass=(70, 75, 80, 86, 90, 100, 120),
          source="TORCH_CUDA_ARCH_LIST of pytorch/pytorch .ci/manywheel/build_cuda.sh (commit 799d09f2: "
                 "12.8 -> 7.0;7.5;8.0;8.6;9.0;10.0;12.0); NOT verified: the index is unreachable from the "
                 "machines this project was built on, so 2.13.0's actual list (and whether 2.13.0+cu128 "
                 "exists) is unknown"),
    Build("pytorch", "cu126", "torch 2.13.0+cu126 (download.pytorch.org/whl/cu126)", "12.6",
          "pytorch-cuda-cu126.txt", sass=(50, 60, 70, 75, 80, 86, 90),
          source="TORCH_CUDA_ARCH_LIST of pytorch/pytorch .ci/manywheel/build_cuda.sh (commit 799d09f2: "
                 "12.6 -> 5.0;6.0;7.0;7.5;8.0;8.6;9.0); NOT verified (index unreachable, as for cu128)"),
    # TensorFlow: one GPU build (PyPI tensorflow[and-cuda], CUDA 12 wheels).
    Build("tensorflow", "cuda12", "tensorflow[and-cuda] 2.21.0 (PyPI)", "12.5", "tensorflow-cuda.txt",
          sass=(60, 70, 80, 89), ptx=(90,), verified=True,
          source="libtensorflow_cc.so.2 and libtensorflow_framework.so.2 of the 2.21.0 wheel read with "
                 "tools/fatbin_archs.py (cuobjdump 13.5 agrees on libtensorflow_framework): every fat binary "
                 "carries SASS sm_60, 70, 80, 89 and PTX compute_90; only 289 of 1438 also SASS sm_90; built with "
                 "CUDA 12.5 (FRAMEWORK_NOTES j), runs on the CUDA 12.9 wheels its and-cuda extra pulls",
          jit_note="most of TensorFlow's kernels have no machine code for this GPU: the driver JIT-compiles their "
                   "compute_90 PTX at the first start (minutes; cached after)"),
    # JAX: XLA generates every kernel at run time and compiles it with the ptxas of the CUDA wheels.
    Build("jax", "cuda13", "jax[cuda13] (PyPI jax-cuda13-plugin, CUDA 13.5 wheels)", "13.5", "jax-cuda-cuda13.txt",
          codegen=(75, 121), verified=True,
          source="jax-cuda13-plugin 0.10.2 read with tools/fatbin_archs.py: xla_cuda_plugin.so and the _linalg/_prng/"
                 "_solver kernels carry SASS sm_75, 80, 90, 100, 110, 120 + PTX compute_120; the ptxas of its "
                 "nvidia-cuda-nvcc 13.5 wheel rejects sm_52 and sm_70 (\"Value 'sm_70' is not defined for option "
                 "'gpu-name'\") and compiles sm_75 and sm_120"),
    Build("jax", "cuda12", "jax[cuda12] (PyPI jax-cuda12-plugin, CUDA 12.9 wheels)", "12.9", "jax-cuda.txt",
          codegen=(52, 121), verified=True,
          source="jax-cuda12-plugin 0.10.2 read with tools/fatbin_archs.py: xla_cuda_plugin.so and the _linalg/_prng/"
                 "_solver kernels carry SASS sm_50, 60, 70, 80, 90, 100, 101, 120 + PTX compute_120; the ptxas of its "
                 "nvidia-cuda-nvcc 12.9 wheel compiles sm_50-sm_120; the lower bound sm_52 is JAX's installation "
                 "guide's (SM 5.2 or newer; driver >= 525 with the pip CUDA 12 wheels)"),
    # MXNet: the last release's GPU wheels.
    Build("mxnet", "cu112", "mxnet-cu112 1.9.1 (PyPI) + NVIDIA's CUDA 11.8 wheels", "11.2", "mxnet-cuda.txt",
          sass=(50, 60, 70, 80, 86), verified=True,
          source="libmxnet.so of mxnet-cu112 1.9.1 read with cuobjdump 13.5 --list-elf/--list-ptx and "
                 "tools/fatbin_archs.py: 198 kernels each for sm_50, 60, 70, 80, 86 and no PTX "
                 "(the other 1.9.1 GPU wheel, mxnet-cu117, read the same way: SASS sm_50-sm_86, no PTX, so it would not help)",
          note=("520", "its pointwise fusion compiles with NVRTC 11.8 at run time, which this driver (older than "
                       "CUDA 11.8's 520) may refuse: set MXNET_USE_FUSION=0 if it fails (not tested)")),
    # CNTK: the last release's GPU wheel, Python 3.6.
    Build("cntk", "cu100", "cntk-gpu 2.7.post2 (PyPI, bundles CUDA 10.0, cuDNN 7.3.1)", "10.0", "cntk-cuda.txt",
          sass=(30, 35, 50, 60, 61, 70), ptx=(70,), verified=True,
          source="cntk-gpu 2.7.post2 cp36 wheel read with tools/fatbin_archs.py (cuobjdump 13.5 refuses it: "
                 "\"Support for 'sm_30' has been removed\"): each of the 8 fat binaries of libCntk.Math-2.7.so and "
                 "the one of libCntk.Core-2.7.so carries SASS sm_30, 35, 50, 60, 61, 70 and PTX compute_30-compute_70; "
                 "the bundled libcudnn.so.7 (cuDNN 7.3.1) and libcublas.so.10.0 carry SASS sm_30-sm_75, but PTX "
                 "(compute_70) in only 188 of cuDNN's 218 and 161 of cuBLAS's 174 fat binaries with sm_70 code: "
                 "the rest (Volta/Turing-only kernels) have no code for newer GPUs; libnccl.so.2 41 of 42",
          jit_note="the driver JIT-compiles CNTK's, cuDNN 7's and cuBLAS 10's compute_70 PTX at the first start: "
                   "expect many minutes before the first step (cached in ~/.nv/ComputeCache; the kernel sets "
                   "CUDA_CACHE_MAXSIZE to 4 GiB). Not run on such a GPU: cuDNN 7.3 and cuBLAS 10 have some "
                   "Volta/Turing-only kernels without PTX -- if they pick one, the row fails with CUDA's "
                   "'no kernel image' or a cuBLAS/cuDNN execution error"),
)


def builds(env: str) -> List[Build]:
    return BUILDS.get(env, [])


def get_build(env: str, name: str) -> Optional[Build]:
    for b in builds(env):
        if b.name == name:
            return b
    return None


# ---- the machine ---------------------------------------------------------------------------------
def parse_version(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    """'535.183.01' -> (535, 183, 1); None when it is not a version."""
    m = re.match(r"^\s*(\d+(?:\.\d+)*)\s*$", text or "")
    return tuple(int(x) for x in m.group(1).split(".")) if m else None


def parse_compute_capability(text: Optional[str]) -> Optional[Tuple[int, int]]:
    """'8.6' -> (8, 6); '12.0' -> (12, 0); None when unknown ('[N/A]', '')."""
    m = re.match(r"^\s*(\d+)\.(\d+)\s*$", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_nvidia_smi(text: str) -> List[dict]:
    """The lines ``nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap
    --format=csv,noheader,nounits`` prints -> GPUs as common.envinfo.gpus() returns them."""
    return envinfo.parse_gpus(text)


def sm(cc: Tuple[int, int]) -> str:
    return "sm_%d%d" % cc


# ---- the decisions -------------------------------------------------------------------------------
def driver_reason(build: Build, driver: Optional[str]) -> Optional[str]:
    """Why the driver cannot run ``build``, or None (also when the driver version is unknown)."""
    have = parse_version(driver)
    need = DRIVER_MINIMUM[build.cuda_major]
    if have is None or have >= parse_version(need):
        return None
    return ("%s is a CUDA %s build: it needs NVIDIA driver >= %s, this machine has %s"
            % (build.package, build.cuda, need, driver))


def arch_verdict(build: Build, cc: Optional[Tuple[int, int]]) -> Tuple[Optional[str], Optional[str]]:
    """(reason it cannot run on compute capability ``cc``, or None; how it runs: 'sass', 'jit', 'codegen')."""
    if cc is None:
        return None, None                       # unknown (driver < 510 does not report it): let it try
    value = cc[0] * 10 + cc[1]
    if build.codegen:
        lo, hi = build.codegen
        if value < lo:
            return ("%s compiles for sm_%d and newer (its ptxas); this GPU is %s" % (build.package, lo, sm(cc))), None
        return None, "codegen"
    if any(a // 10 == cc[0] and a % 10 <= cc[1] for a in build.sass):
        return None, "sass"
    if any(p <= value for p in build.ptx):
        return None, "jit"
    sass = ", ".join("sm_%d" % a for a in build.sass) or "none"
    ptx = ("PTX only for " + ", ".join("compute_%d" % p for p in build.ptx)) if build.ptx else "no PTX"
    return ("%s has machine code (SASS) for %s and %s: nothing runs on this %s GPU "
            "(CUDA: no kernel image is available)" % (build.package, sass, ptx, sm(cc))), None


class Decision:
    """What one environment does on this GPU: the build, or the reason none runs."""

    def __init__(self, env: str, build: Optional[Build], reason: Optional[str] = None, how: Optional[str] = None,
                 forced: bool = False, warning: Optional[str] = None, driver: Optional[str] = None):
        self.env = env
        self.driver = parse_version(driver)  # this machine's driver version
        self.build = build          # None: nothing runs
        self.reason = reason        # why not (build None), one line
        self.how = how              # 'sass' | 'jit' | 'codegen' | None (compute capability unknown)
        self.forced = forced        # chosen with --gpu-build / DS2_GPU_BUILD
        self.warning = warning      # a forced build the facts say will not run

    @property
    def runs(self) -> bool:
        return self.build is not None

    def describe(self) -> str:
        if not self.build:
            return "cannot run: %s" % self.reason
        text = "%s (%s)" % (self.build.name, self.build.package)
        if self.forced:
            text += ", forced"
        if not self.build.verified:
            text += " [architectures not verified from the binary]"
        if self.how == "jit":
            text += "; via PTX JIT: " + (self.build.jit_note or "the first start compiles its PTX (minutes)")
        if self.build.note and self.driver is not None and self.driver < parse_version(self.build.note[0]):
            text += "; " + self.build.note[1]
        if self.warning:
            text += "; WARNING: " + self.warning
        return text

    def record(self) -> dict:
        """What the run record's ``run.gpu_build`` says."""
        if not self.build:
            return {"env": self.env, "build": None, "reason": self.reason}
        return {"env": self.env, "build": self.build.name, "package": self.build.package, "cuda": self.build.cuda,
                "pins": "envs/" + self.build.pins, "chosen": "forced" if self.forced else "auto",
                "runs_via": self.how, "facts_verified": self.build.verified}


def decide(env: str, gpu: Optional[dict], override: Optional[str] = None) -> Decision:
    """The build of ``env`` for ``gpu`` (envinfo.gpus()[0]): the forced one, else the newest that runs."""
    candidates = builds(env)
    if not candidates:
        return Decision(env, None, "no CUDA build of %s is known (runner/envs/gpu_preflight.py BUILDS)" % env)
    gpu = gpu or {}
    cc = parse_compute_capability(gpu.get("compute_capability"))
    driver = gpu.get("driver")
    if override:
        build = get_build(env, override)
        if build is None:
            raise ValueError("unknown build %r for %s; choose from: %s"
                             % (override, env, ", ".join(b.name for b in candidates)))
        arch, how = arch_verdict(build, cc)
        why = driver_reason(build, driver) or arch
        return Decision(env, build, how=how, forced=True, warning=why, driver=driver)
    reasons = []
    for build in candidates:
        why = driver_reason(build, driver)
        arch, how = arch_verdict(build, cc)
        why = why or arch
        if why is None:
            return Decision(env, build, how=how, driver=driver)
        reasons.append(why)
    if len(reasons) == 1:
        return Decision(env, None, reasons[0])
    return Decision(env, None, "no build runs here: " + "; ".join(reasons))


#: TF32 is a tensor-core format of NVIDIA GPUs from Ampere (sm_80) on (NVIDIA A100 whitepaper).
TF32_MIN_CC = (8, 0)


def precision_reason(precision: str, gpu: Optional[dict]) -> Optional[str]:
    """Why ``precision`` cannot run on this GPU, or None."""
    cc = parse_compute_capability((gpu or {}).get("compute_capability"))
    if precision == "tf32" and cc is not None and cc < TF32_MIN_CC:
        return "precision tf32: TF32 tensor cores start with Ampere (sm_80); this GPU is %s" % sm(cc)
    return None


def parse_overrides(text: Optional[str]) -> Dict[str, str]:
    """'pytorch=cu126,jax=cuda12' -> {'pytorch': 'cu126', 'jax': 'cuda12'}; ValueError with one line (an empty
    item, such as a trailing comma's, and an environment named twice too)."""
    result = {}
    for env, name in assignments(text, "BUILD"):
        item = "%s=%s" % (env, name)
        if env not in BUILDS:
            raise ValueError("unknown environment %r in %r; choose from: %s" % (env, item, ", ".join(BUILDS)))
        if get_build(env, name) is None:
            raise ValueError("unknown build %r for %s; choose from: %s"
                             % (name, env, ", ".join(b.name for b in builds(env))))
        result[env] = name
    return result


def env_overrides(environ=None) -> Dict[str, str]:
    """The builds forced by DS2_GPU_BUILD (same form as --gpu-build)."""
    return parse_overrides((environ if environ is not None else os.environ).get("DS2_GPU_BUILD"))


def plan(targets, gpu: Optional[dict], overrides: Optional[Dict[str, str]] = None) -> "OrderedDict[str, Decision]":
    """target name -> Decision, for runner.run.targets.Target objects (each names its env)."""
    overrides = overrides or {}
    return OrderedDict((t.name, decide(t.env, gpu, overrides.get(t.env))) for t in targets)


def report(targets, gpus: List[dict], overrides: Optional[Dict[str, str]] = None, details: bool = False) -> List[str]:
    """The lines run_all.py --list prints (and, with ``details``, --check: every build considered)."""
    if not gpus:
        return ["GPU preflight: no NVIDIA GPU visible (nvidia-smi missing or lists none): the CPU builds "
                "(envs/<env>-cpu.txt) run."]
    gpu = gpus[0]
    cc = parse_compute_capability(gpu.get("compute_capability"))
    lines = ["GPU preflight: %s, compute capability %s, NVIDIA driver %s%s"
             % (gpu.get("name", "?"), "%d.%d (%s)" % (cc + (sm(cc),)) if cc else "unknown (driver < 510?)",
                gpu.get("driver", "?"), "" if len(gpus) == 1 else " (GPU 0 of %d; runs use GPU 0)" % len(gpus))]
    decisions = plan(targets, gpu, overrides)
    for name, d in decisions.items():
        lines.append("  %-17s %-10s %s" % (name, d.env, d.describe()))
    if details:
        lines.append("Builds considered (newest first; runner/envs/gpu_preflight.py BUILDS):")
        for env in OrderedDict((d.env, None) for d in decisions.values()):
            for b in builds(env):
                why = driver_reason(b, gpu.get("driver")) or arch_verdict(b, cc)[0]
                lines.append("  %-10s %-7s CUDA %s (driver >= %s), %s%s: %s"
                             % (env, b.name, b.cuda, DRIVER_MINIMUM[b.cuda_major], b.arch_summary(),
                                "" if b.verified else " [unverified]", "runs here" if why is None else "no: " + why))
    return lines


#: GPUs for docs/gpus.md's table "which GPU runs which framework" (tests/test_preflight.py keeps it current)
EXAMPLE_GPUS = [
    ("Tesla P100", "6.0", "535.183.01"),
    ("Tesla V100", "7.0", "535.183.01"),
    ("Tesla T4", "7.5", "535.183.01"),
    ("A100", "8.0", "550.90.07"),
    ("A100", "8.0", "580.65.06"),
    ("RTX 4090, L4, L40S", "8.9", "570.133.07"),
    ("H100, H200", "9.0", "580.65.06"),
    ("B200", "10.0", "580.65.06"),
    ("RTX 5090, RTX PRO 6000", "12.0", "580.65.06"),
]


def gpu_table() -> List[str]:
    """Markdown: for each example GPU and driver, the build each environment gets, or why none runs."""
    envs = list(BUILDS)
    lines = ["| GPU (compute capability) | driver | " + " | ".join(envs) + " |",
             "|---|---|" + "---|" * len(envs)]
    for name, cc, driver in EXAMPLE_GPUS:
        cells = []
        for env in envs:
            d = decide(env, {"name": name, "driver": driver, "compute_capability": cc})
            if d.runs:
                cells.append(d.build.name + (" (PTX JIT)" if d.how == "jit" else ""))
            elif any(arch_verdict(b, parse_compute_capability(cc))[0] is None for b in builds(env)):
                cells.append("no: driver too old")
            else:
                cells.append("no: no code for sm_%s" % cc.replace(".", ""))
        lines.append("| %s (%s) | %s | %s |" % (name, cc, driver.split(".")[0], " | ".join(cells)))
    return lines
