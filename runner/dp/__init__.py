"""Data-parallel runs (``run_all.py --workers W``): the launch of one target (:mod:`runner.dp.launch`), the
framework launchers (:mod:`.launchers`), the supervisor that starts, watches and stops every process
(:mod:`.supervisor`), several hosts (:mod:`.hosts`, with :mod:`.host_agent` on each host) and the worker wrapper
(:mod:`.worker`).  ``worker.py`` and ``host_agent.py`` run as scripts, standard library only.
``python -m runner.dp``: the launcher table and which rows can run data-parallel here.

May import runner.base, runner.interrupt, runner.validate, runner.envs and runner.run; nothing above.  The report
of data-parallel records is runner.report.data_parallel: the report never loads this package."""
