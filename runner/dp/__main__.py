"""``python -m runner.dp``: the launcher table, and which targets can run data-parallel now."""
import sys

from runner.dp.launch import main

if sys.argv[1:]:
    print("python -m runner.dp: error: it takes no arguments (got %s); it prints the launchers and which targets can "
          "run data-parallel" % " ".join(sys.argv[1:]), file=sys.stderr)
    sys.exit(2)
sys.exit(main())
