"""Each framework's environment: one virtual environment plus Jupyter kernel, with pins in
``envs/<name>-<cpu|cuda>.txt`` (``ENVS``), the Python it needs, and what its kernel needs beyond the pins (CNTK's
OpenMPI 1.10 sonames and driver directories, MXNet's CUDA 11 libraries).  Several rows share an environment (Keras
on JAX runs in the JAX environment): the rows are runner/run/targets.py."""
import glob
import os
import subprocess
from collections import OrderedDict
from typing import Callable, Dict, List, Optional, Tuple

from runner.base import ROOT, EnvError, last_error_line
from runner.envs.bootstrap import env_python
from runner.envs.gpu_preflight import Build

class Env:
    """One framework environment: pins per device kind, and what its interpreter must be."""

    def __init__(self, name: str, label: str, python_hint: str = "", needs_python: Optional[str] = None,
                 needs: Optional[Callable[[], Optional[str]]] = None,
                 kernel_env: Optional[Callable[[str], Dict[str, str]]] = None,
                 post_create: Optional[Callable[[str], None]] = None, pip: str = "pip",
                 python_versions: Tuple[Optional[str], Optional[str]] = (None, None), python_why: str = "",
                 shared_python: bool = False):
        self.name = name
        self.label = label
        self.python_hint = python_hint          # shown by --list
        self.needs_python = needs_python        # reason shown when no interpreter was given for it
        self.needs = needs                      # returns a reason when a system prerequisite is missing
        self.kernel_env = kernel_env            # extra environment variables of the kernel (venv path -> env)
        self.post_create = post_create          # hook after pip install (venv path)
        self.pip = pip                          # what pip is upgraded to before the pins are installed
        self.python_versions = python_versions  # (lowest, highest) major.minor its pins support (None: no bound)
        self.python_why = python_why            # which pins set those bounds
        self.shared_python = shared_python      # the interpreter must be a shared-library build

    def python_problem(self, version: str) -> Optional[str]:
        """Why Python ``version`` ("3.12.1") cannot build this environment, or None."""
        have = tuple(int(x) for x in version.split(".")[:2])
        low, high = self.python_versions
        if (low and have < tuple(map(int, low.split(".")))) or (high and have > tuple(map(int, high.split(".")))):
            return "%s needs Python %s%s" % (self.label, self.python_range(), " (%s)" % self.python_why
                                             if self.python_why else "")
        return None

    def python_range(self) -> str:
        low, high = self.python_versions
        if low and low == high:
            return low
        if low and high:
            return "%s-%s" % (low, high)
        return (">= %s" % low) if low else ("<= %s" % high) if high else "any"

    def requirements(self, device: str, build: Optional[Build] = None) -> str:
        """The pins file: ``envs/<env>-<device>.txt``, or on a GPU the chosen build's (runner/envs/gpu_preflight.py)."""
        if device == "cuda" and build is not None:
            return os.path.join(ROOT, "envs", build.pins)
        return os.path.join(ROOT, "envs", "%s-%s.txt" % (self.name, device))


# ---- MXNet: CUDA 11 libraries from NVIDIA's wheels -------------------------------------------------
# (which GPUs its GPU build runs on: runner/envs/gpu_preflight.py BUILDS["mxnet"])
def mxnet_kernel_env(venv: str) -> Dict[str, str]:
    """LD_LIBRARY_PATH to the CUDA 11 libraries of NVIDIA's pip wheels (envs/mxnet-cuda.txt), which
    libmxnet.so links but does not bundle; then the machine's own LD_LIBRARY_PATH (the driver may be
    found through it).  Nothing for the CPU environment."""
    libs = sorted(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "nvidia", "*", "lib")))
    return {"LD_LIBRARY_PATH": os.pathsep.join(libs + ["${LD_LIBRARY_PATH}"])} if libs else {}


# ---- CNTK: CPython 3.6, OpenMPI 1.10 sonames, a library path that keeps the driver ------------------------------------
MPI_LIBDIRS = ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/lib64/openmpi/lib",
               "/usr/lib/x86_64-linux-gnu/openmpi/lib"]
#: the OpenMPI 1.10 sonames CNTK 2.7 links -> the OpenMPI 4 libraries that stand in for them
CNTK_MPI_SONAMES = {"libmpi.so.12": "libmpi.so.40", "libmpi_cxx.so.1": "libmpi_cxx.so.40"}


def _find_lib(name: str) -> Optional[str]:
    for d in MPI_LIBDIRS:
        hits = glob.glob(os.path.join(d, name))
        if hits:
            return hits[0]
    return None


def cntk_mpi_libraries() -> Dict[str, Optional[str]]:
    """For each soname CNTK needs, the library that provides it: OpenMPI 1.10's own, else OpenMPI 4's."""
    return {old: _find_lib(old) or _find_lib(new) for old, new in CNTK_MPI_SONAMES.items()}


def cntk_needs() -> Optional[str]:
    missing = [CNTK_MPI_SONAMES[old] for old, lib in cntk_mpi_libraries().items() if not lib]
    if missing:
        return ("CNTK 2.7 links OpenMPI 1.10 (libmpi.so.12); this machine lacks OpenMPI 4's %s: install the "
                "package libopenmpi3 (Debian/Ubuntu: apt-get install libopenmpi3; Ubuntu 24.04: libopenmpi3t64)"
                % ", ".join(missing))
    return None


def cntk_mpi_dir(venv: str) -> str:
    return os.path.join(venv, "mpi-compat")


def cntk_post_create(venv: str) -> None:
    """Make CNTK's OpenMPI 1.10 sonames resolve (links inside the environment), then import CNTK once."""
    directory = cntk_mpi_dir(venv)
    os.makedirs(directory, exist_ok=True)
    for old, lib in cntk_mpi_libraries().items():
        link = os.path.join(directory, old)
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(lib, link)
    proc = subprocess.run([env_python(venv), "-c", "import cntk"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, env=dict(os.environ, **cntk_kernel_env(venv)))
    if proc.returncode != 0:
        raise EnvError("import cntk fails in %s: %s" % (venv, last_error_line(proc.stdout)))


#: Where NVIDIA drivers live outside the loader's default directories: NVIDIA's container runtime
#: (older nvidia-docker and Kubernetes device plugins mount the driver at /usr/local/nvidia/lib64)
#: and WSL 2 (/usr/lib/wsl/lib).  The default directories (/usr/lib/x86_64-linux-gnu, /usr/lib64)
#: are found through ld.so.cache without LD_LIBRARY_PATH, so they are never added.
DRIVER_DIRS = ["/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib"]
#: The driver's own libraries that CNTK's GPU build loads (libcuda: CUDA; libnvidia-ml: NVML, a NEEDED entry)
DRIVER_LIBS = ("libcuda.so.1", "libnvidia-ml.so.1")


def driver_dirs(environ=None) -> List[str]:
    """Directories holding the NVIDIA driver's libraries that the loader reaches only through
    LD_LIBRARY_PATH: those of the inherited LD_LIBRARY_PATH, then DRIVER_DIRS, in that order, once each."""
    environ = os.environ if environ is None else environ
    found = []
    for d in [p for p in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p] + DRIVER_DIRS:
        if d not in found and any(os.path.exists(os.path.join(d, lib)) for lib in DRIVER_LIBS):
            found.append(d)
    return found


#: Largest CUDA JIT cache the driver accepts: 4 GiB (CUDA Programming Guide, environment variables,
#: CUDA_CACHE_MAXSIZE; recalled, not re-read for this driver generation -- a larger value would be ignored
#: or capped, a smaller default (256 MiB to 1 GiB depending on the driver) can evict the compiled code).
#: On GPUs newer than Turing the driver compiles CNTK's and cuDNN 7's PTX, which must stay in the cache.
CNTK_JIT_CACHE_BYTES = str(4 << 30)


def cntk_kernel_env(venv: str, environ=None) -> Dict[str, str]:
    """The kernel's library path: the soname links, then the driver's directories that the loader
    would not find by itself (:func:`driver_dirs`) -- and nothing else of the machine's LD_LIBRARY_PATH.

    Trade-off: CNTK's import runs ``ldconfig -N -v`` on every directory of LD_LIBRARY_PATH, which as root
    writes soname links there.  System directories stay out, so nothing is written there; a driver
    directory that a container mounts (or puts on LD_LIBRARY_PATH) does get that treatment -- ldconfig
    only adds missing soname links, and without the directory CNTK's GPU build cannot find
    libcuda.so.1 / libnvidia-ml.so.1 at all.
    """
    return {"LD_LIBRARY_PATH": os.pathsep.join([cntk_mpi_dir(venv)] + driver_dirs(environ)),
            "CUDA_CACHE_MAXSIZE": CNTK_JIT_CACHE_BYTES}


#: CNTK computes in fp32 only: its CUDA 10 predates TF32 and it has no bfloat16
CNTK_UNSUPPORTED_PRECISIONS = {
    p: "CNTK 2.7 computes in fp32 only: its CUDA 10 predates TF32 and it has no bfloat16" for p in ("tf32", "bf16")}


#: Python bounds come from the pins' Requires-Python: numpy 2.4.6, keras 3.15.1, ipykernel 7.4.0, jax 0.10.2 and
#: flax 0.12.8 need >= 3.11 (torch 2.13 and tensorflow 2.21 alone would take 3.10); numpy 1.23.5 has no
#: wheels (and no building sdist) past 3.11.
NEEDS_311 = "numpy 2.4.6, keras 3.15.1 and ipykernel 7.4.0 need >= 3.11"

ENVS = OrderedDict((e.name, e) for e in [
    Env("pytorch", "PyTorch 2.13 + Keras 3", python_hint="Python >= 3.11", python_versions=("3.11", None),
        python_why=NEEDS_311),
    Env("tensorflow", "TensorFlow 2.21 + Keras 3", python_hint="Python >= 3.11", python_versions=("3.11", None),
        python_why=NEEDS_311),
    Env("mxnet", "MXNet 1.9.1", python_hint="Python 3.11 (numpy<1.24)", kernel_env=mxnet_kernel_env,
        python_versions=("3.11", "3.11"), python_why="numpy 1.23.5 has wheels up to 3.11, ipykernel 7.4.0 needs >= 3.11"),
    Env("cntk", "CNTK 2.7", python_hint="shared-library CPython 3.6",
        needs_python="no CNTK interpreter given or found: pass --cntk-python PATH (a shared-library CPython 3.6, "
                     "e.g. from conda create -n cntk36 python=3.6) or set DS2_CNTK_PYTHON",
        needs=cntk_needs, kernel_env=cntk_kernel_env, post_create=cntk_post_create,
        pip="pip==21.3.1", python_versions=("3.6", "3.6"), shared_python=True),  # pip 21.3.1: the last for 3.6
    Env("jax", "JAX + Flax + Keras 3", python_hint="Python >= 3.11", python_versions=("3.11", None),
        python_why="jax 0.10.2, flax 0.12.8, numpy 2.4.6 and keras 3.15.1 need >= 3.11"),
])
