"""``python -m runner.report [--results-dir DIR] [--output FILE]``: results.md again from the records."""
import sys

from runner.report.render import main

sys.exit(main())
