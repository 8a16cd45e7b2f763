"""``python -m runner.dp``: the launcher table, and which targets can run data-parallel now."""
import sys

from runner.dp.launch import main

sys.exit(main())
