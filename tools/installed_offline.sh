#!/usr/bin/env bash
# Run rows in an interpreter whose frameworks are already installed (a GPU image: PyTorch, JAX, ... with CUDA),
# on a machine that reaches no package registry.
#
#   tools/installed_offline.sh WHEELHOUSE PYTHON [run_all.py options]
#
# PYTHON has the frameworks but not what the runner and a Jupyter kernel need (papermill, ipykernel, ...).
# WHEELHOUSE holds those as wheels for PYTHON's version and platform; make it on a machine with a registry:
#
#   pip download --dest WHEELHOUSE --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 \
#       --platform manylinux2014_x86_64 papermill==2.7.0 nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0 \
#       pandas==3.1.1 matplotlib==3.11.2 tabulate==0.10.0 tqdm==4.70.1 mistune==3.4.0 Pygments==2.21.0 onnxscript \
#       keras==3.15.1 namex optree       # the runner's pins (envs/runner.txt); the last three for the Keras rows
#
# (and delete what the image has, e.g. numpy and onnx, to keep it small).  This script makes
# .venvs/installed on top of PYTHON (--system-site-packages: the image's frameworks stay as they are), installs
# every wheel of WHEELHOUSE whose distribution PYTHON lacks (--no-index --no-deps: nothing the image has is
# replaced), then runs `run_all.py --use-installed ENV=.venvs/installed/bin/python` for each framework it finds
# there (torch: pytorch, jax: jax, tensorflow: tensorflow), with the runner in the same interpreter
# (DS2_RUNNER=current).  Without the venv module it installs into .venvs/installed-site (PYTHONPATH) instead.
# Bad input is refused in one line (exit status 2) before .venvs/installed is made: WHEELHOUSE, PYTHON (a Python 3.8+
# with torch, jax or tensorflow) and run_all.py's options (its parser and checks, run by PYTHON).
set -euo pipefail
die() { echo "installed_offline.sh: error: $*" >&2; exit 2; }     # bad input: one line, exit status 2
[ $# -ge 2 ] || die "usage: tools/installed_offline.sh WHEELHOUSE PYTHON [run_all.py options]"
[ -n "$1" ] || die "WHEELHOUSE '' is empty: an empty path is not 'here'; name the wheel directory"
[ -d "$1" ] || die "WHEELHOUSE $1: no such directory"
[ -n "$2" ] || die "PYTHON '' is empty; name the interpreter whose frameworks are installed"
[ ! -d "$2" ] || die "PYTHON $2 is a directory; name the interpreter whose frameworks are installed"
[ -x "$2" ] || command -v "$2" >/dev/null || die "PYTHON $2: no such executable"
wheelhouse=$(cd "$1" && pwd)
python=$2
case $python in */*) python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python") ;; esac   # before the cd
shift 2
cd "$(dirname "$0")/.."
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 8))' 2>/dev/null \
    || die "PYTHON $python does not run as a Python 3.8 or newer"

# run_all.py's options, checked before anything is made: its parser and its checks (runner/cli_options.py,
# runner/cli_checks.py: standard library only, so PYTHON runs them as it is), with the variables this script sets
status=0
env -u DS2_USE_INSTALLED DS2_RUNNER=current "$python" - "$@" <<'EOF' || status=$?
import sys
try:
    from runner import cli_checks
    from runner.cli_options import build_parser
    from runner.run.targets import select_targets
except Exception as e:      # not bad input: this interpreter cannot read the runner
    sys.exit("installed_offline.sh: error: PYTHON cannot import the runner to check run_all.py's options: %s" % e)
p = build_parser()
p.error = lambda message: p.exit(2, "installed_offline.sh: error: run_all.py %s\n" % message)
try:
    args = p.parse_args(sys.argv[1:])
except SystemExit as e:
    sys.exit(10 if not e.code else 2)       # 10: --help printed, nothing to run
errors = cli_checks.run_all_errors(args, select_targets(args.frameworks, args.variants))
if errors:
    p.error(errors[0].replace("\n", " "))
EOF
case $status in 0) ;; 10) exit 0 ;; *) exit 2 ;; esac
"$python" -c 'import importlib.util, sys; sys.exit(not any(importlib.util.find_spec(m) for m in ("torch", "jax", "tensorflow")))' \
    || die "PYTHON $python has none of torch, jax, tensorflow"

venv=.venvs/installed
if "$python" -m venv --system-site-packages "$venv" >/dev/null 2>&1 && [ -x "$venv/bin/python" ]; then
    run_python=$(pwd)/$venv/bin/python
    install=("$run_python" -m pip install)
    # PYTHON may itself be a virtual environment, whose packages --system-site-packages does not see: a .pth file
    # puts its site-packages after the new environment's own
    "$python" -c 'import site, sys; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
        > "$("$run_python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/ds2-installed.pth"
else
    echo "$python has no venv module: installing into .venvs/installed-site (PYTHONPATH)" >&2
    site=$(pwd)/.venvs/installed-site
    mkdir -p "$site"
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    run_python=$python
    install=("$python" -m pip install --target "$site")
fi

# the wheels whose distribution the interpreter lacks
mapfile -t missing < <("$run_python" - "$wheelhouse" <<'EOF'
import os, re, sys
from importlib.metadata import PackageNotFoundError, version
for name in sorted(os.listdir(sys.argv[1])):
    if name.endswith(".whl"):
        dist = name.split("-")[0]
        try:
            version(dist)
        except PackageNotFoundError:
            try:
                version(re.sub(r"[-_.]+", "-", dist))
            except PackageNotFoundError:
                print(os.path.join(sys.argv[1], name))
EOF
)
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${#missing[@]} wheel(s) from $wheelhouse: $(for w in "${missing[@]}"; do basename "$w" | cut -d- -f1; done | tr '\n' ' ')"
    PIP_DISABLE_PIP_VERSION_CHECK=1 "${install[@]}" -q --no-index --no-deps "${missing[@]}"
fi
"$run_python" -m pip check 2>/dev/null | sed 's/^/pip check: /' || true

assign=()
for pair in torch:pytorch jax:jax tensorflow:tensorflow; do
    if "$run_python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('${pair%%:*}') is None)"; then
        assign+=("${pair#*:}=$run_python")
    fi
done
[ ${#assign[@]} -gt 0 ] || { echo "$python has none of torch, jax, tensorflow" >&2; exit 2; }
DS2_USE_INSTALLED=$(IFS=,; echo "${assign[*]}")
export DS2_USE_INSTALLED DS2_RUNNER=current
echo "DS2_USE_INSTALLED=$DS2_USE_INSTALLED"
exec "$run_python" run_all.py "$@"
