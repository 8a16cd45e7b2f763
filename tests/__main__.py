"""``python -m tests``: the project's test command, on a fresh machine too.

Creates (once) the runner environment with pytest, then runs ``pytest tests`` in it; extra
arguments go to pytest (``python -m tests -k data -x``; ``python -m tests tests/test_data.py`` runs that file
only).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runner.base import ROOT  # noqa: E402
from runner.envs.bootstrap import reexec_in_runner  # noqa: E402

if __name__ == "__main__":
    reexec_in_runner(["-m", "tests"] + sys.argv[1:])
    os.chdir(ROOT)
    import pytest  # noqa: E402
    args = sys.argv[1:]
    # a test file, folder or node id among the arguments selects the tests; else the whole tier
    named = any(os.path.exists(a.split("::")[0]) for a in args if not a.startswith("-"))
    sys.exit(pytest.main(args if named else ["tests"] + args))
