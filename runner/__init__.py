"""The orchestration behind ``python run_all.py`` and ``python -m tests``; framework-free.

The packages, lowest first; each imports only from those above it in this list (tests/test_runner_layers.py
holds them to it; docs/architecture.md draws it):

- :mod:`runner.base`      ROOT and EnvError: a leaf, standard library only
- :mod:`runner.interrupt` Ctrl-C and SIGTERM end a run within seconds, tidily: a leaf, standard library only
- :mod:`runner.validate`  the checks every command shares (parsers, paths, environment variables): one line,
  exit status 2; standard library only
- :mod:`runner.envs`      the environments: the runner's own (bootstrap), one per framework from the pins in
  envs/, interpreters as installed, wheelhouses, the GPU preflight, CNTK's Python
- :mod:`runner.run`       the rows (targets) and running one notebook with papermill into a result record
- :mod:`runner.dp`        data-parallel runs: the launch, the launchers, the supervisor, several hosts, the worker
- :mod:`runner.migrate`   ``run_all.py --migrate``: each notebook's export loaded by every other
- :mod:`runner.report`    results.md from the records (``python -m runner.report``); never imports runner.dp
- :mod:`runner.rosetta`   ROSETTA.md, docs/rosetta.html and the translations (``python -m runner.rosetta``)
- :mod:`runner.cli`       the command line of run_all.py, on top: its checks (runner.cli_checks), then each mode
"""
