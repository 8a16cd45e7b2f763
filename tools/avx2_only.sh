#!/usr/bin/env bash
# Run a command as on an AVX2-only x86 CPU (such as the AMD EPYC some CI machines have) on a machine with AVX-512:
#
#   sudo tools/avx2_only.sh python -m tests          # the default tier, as on an AVX2-only AMD EPYC
#
# What it changes, for the command and everything it starts:
# - /proc/cpuinfo (what common/envinfo.py, runner/run/targets.py's precision checks and lscpu read): a copy without the
#   AVX-512, AMX and AVX-VNNI flags, vendor AuthenticAMD, model name "AMD EPYC (AVX2 only, emulated)", bind-mounted
#   over the real one in a mount namespace of the command's own (so root is needed: unshare -m);
# - what the libraries detect with CPUID themselves, capped at AVX2 by their own switches: XLA (JAX, TensorFlow's
#   XLA) --xla_cpu_max_isa=AVX2, oneDNN (PyTorch, TensorFlow, MXNet) ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA /
#   MKLDNN_MAX_CPU_ISA, MKL MKL_ENABLE_INSTRUCTIONS, PyTorch's own kernels ATEN_CPU_CAPABILITY, OpenBLAS
#   OPENBLAS_CORETYPE=Haswell.
# What it cannot change: the speed (an EPYC's clock, caches and compile times), NumPy's own SIMD dispatch (its
# NPY_DISABLE_CPU_FEATURES warns in every cell output when a name is not in that NumPy's list), and CNTK's MKL
# builds' choice of code path. It uses a cache directory of its own ($XDG_CACHE_HOME/avx2-only) so that no XLA
# program compiled for AVX-512 is loaded from the persistent compilation cache. Run inside itself (the tier, run
# under it, holds a test of it) it adds nothing a second time.
set -euo pipefail
if [ "$#" = 0 ]; then
  echo "usage: tools/avx2_only.sh COMMAND [ARG...]" >&2
  exit 2
fi
if [ "$(id -u)" != 0 ] || ! command -v unshare >/dev/null; then
  echo "tools/avx2_only.sh: needs root and unshare (util-linux) for a mount namespace" >&2
  exit 2
fi
cpuinfo="$(mktemp "${TMPDIR:-/tmp}/cpuinfo.avx2.XXXXXX")"
trap 'rm -f "$cpuinfo"' EXIT
sed -e 's/^vendor_id.*/vendor_id\t: AuthenticAMD/' \
    -e 's/^model name.*/model name\t: AMD EPYC (AVX2 only, emulated)/' \
    -e '/^flags/{s/ avx512[a-z0-9_]*//g; s/ amx_[a-z0-9_]*//g; s/ avx_vnni//g}' /proc/cpuinfo > "$cpuinfo"
# shellcheck disable=SC2016
unshare -m bash -c '
mount --bind "$0" /proc/cpuinfo
case " ${XLA_FLAGS:-} " in *" --xla_cpu_max_isa=AVX2 "*) ;; *) export XLA_FLAGS="${XLA_FLAGS:+$XLA_FLAGS }--xla_cpu_max_isa=AVX2";; esac
export ONEDNN_MAX_CPU_ISA=AVX2 DNNL_MAX_CPU_ISA=AVX2 MKLDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2
export ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=Haswell
case "${XDG_CACHE_HOME:-}" in */avx2-only) ;; *) export XDG_CACHE_HOME="${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/avx2-only";; esac
mkdir -p "$XDG_CACHE_HOME"
exec "$@"' "$cpuinfo" "$@"
