"""results.md from the records: selecting and naming records (:mod:`runner.report.records`), the tables
(:mod:`.tables`), the checks' sections (:mod:`.checks`: agreement, the float64 control, ONNX, the migration
matrix), the data-parallel section (:mod:`.data_parallel`), the real task's (:mod:`.learning`), the plots (:mod:`.plots`), the GPU facts
(:mod:`.gpu_facts`), latency figures (:mod:`.latency`), provenance (:mod:`.provenance`), and the page on top
(:mod:`.render`).  ``python -m runner.report`` writes results.md again from the records.

May import runner.base, runner.validate, runner.envs, runner.run and runner.migrate (the records of each);
never runner.dp (the launchers, the supervisor): generating a page loads no launch stack."""
