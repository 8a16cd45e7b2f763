"""One run: the rows of the comparison (:mod:`runner.run.targets`: notebook, environment, precisions, variants)
and executing one notebook with papermill into a result record (:mod:`runner.run.execute`).

May import runner.base, runner.interrupt, runner.validate and runner.envs; nothing above."""
