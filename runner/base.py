"""What every package of runner/ shares: the repository's root and the error an environment raises.  A leaf:
standard library only, imports nothing from runner/ (runner/envs/bootstrap.py runs before anything is installed,
and imports it)."""
import os

#: the repository: notebooks/, envs/, results/ and runner/ are under it
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class EnvError(RuntimeError):
    """An environment could not be created; the message is one line."""


class WheelhouseError(EnvError):
    """The wheelhouse (``--wheelhouse DIR``) lacks a wheel an environment needs: run_all.py exits 2."""


def last_error_line(text: str) -> str:
    """The line of a command's output that says what went wrong: the last that looks like an error, else the last."""
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    for line in reversed(lines):
        if line.startswith(("ERROR", "error:", "E:")) or "Error" in line:
            return line
    return lines[-1] if lines else "no output"
