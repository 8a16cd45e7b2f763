"""``python -m runner.rosetta [--check] [--extract NAME]``: the Rosetta pages and translations regenerated."""
import sys

from runner.rosetta.pages import main

sys.exit(main())
