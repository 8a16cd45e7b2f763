"""The orchestration behind ``python run_all.py`` and ``python -m tests``; framework-free.

- :mod:`runner.bootstrap` creates the runner's own virtual environment (papermill, pandas, ...)
  and re-executes the command inside it -- standard library only
- :mod:`runner.targets`   the rows of the comparison: notebook, environment and GPU support of each
- :mod:`runner.envs`      one isolated environment and Jupyter kernel per framework, from the pins in envs/
- :mod:`runner.cntk_python` finds the shared-library CPython 3.6 CNTK needs (also for .ci/run) -- standard
  library only
- :mod:`runner.execute`   runs one notebook with papermill and always leaves a result record
- :mod:`runner.interrupt` Ctrl-C and SIGTERM end a run within seconds, tidily -- standard library only
- :mod:`runner.report`    writes results.md from the records
- :mod:`runner.rosetta`   ROSETTA.md and docs/rosetta.html from the notebooks' tagged cells
- :mod:`runner.validate`  every input of run_all.py, the report and the Rosetta pages, checked before anything
  is created or started: one line, exit status 2 -- standard library only
- :mod:`runner.cli`       the command line of run_all.py: checks every argument (runner.validate), then runs
"""
