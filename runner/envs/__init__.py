"""The environments: the runner's own (:mod:`runner.envs.bootstrap`, standard library only: it runs before
anything is installed), one per framework from the pins in envs/ (:mod:`.definitions`, :mod:`.framework_envs`),
interpreters used as installed (:mod:`.use_installed`), wheelhouses (:mod:`.wheelhouse`), the GPU preflight that
picks each framework's CUDA build (:mod:`.gpu_preflight`) and CNTK's Python 3.6 (:mod:`.cntk_python`, also run by
.ci/run with the system Python, 3.6 too).

May import runner.base, runner.interrupt and runner.validate; nothing above (no rows, runs or reports).  This file
imports nothing: ``python3 -m runner.envs.cntk_python`` and the bootstrap load it before any environment exists."""
