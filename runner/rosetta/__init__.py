"""The side-by-side pages, ROSETTA.md and docs/rosetta.html (:mod:`runner.rosetta.pages`), and the standalone
translations lifted out of each notebook, docs/translations/ds2_<name>.py (:mod:`runner.rosetta.extract`).
``python -m runner.rosetta`` regenerates them (``--check``, ``--extract NAME``).

May import runner.base, runner.validate and runner.run (the rows); nothing that runs a notebook."""
