"""``python -m tests``: the project's test command, on a fresh machine too.

Creates (once) the runner environment with pytest, then runs ``pytest tests`` in it; extra
arguments go to pytest (``python -m tests -k data -x``).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from runner.bootstrap import ROOT, reexec_in_runner  # noqa: E402

if __name__ == "__main__":
    reexec_in_runner(["-m", "tests"] + sys.argv[1:])
    os.chdir(ROOT)
    import pytest  # noqa: E402
    sys.exit(pytest.main(["tests"] + sys.argv[1:]))
