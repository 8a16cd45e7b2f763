#!/usr/bin/env python3
"""Run every framework's DS2 notebook with papermill and write results.md.

    python run_all.py                      # all frameworks; deepmark on a CUDA GPU, smoke on a CPU
    python run_all.py --list               # targets, environments and what they need
    python run_all.py --frameworks pytorch,jax --preset quick --precision fp32,tf32,bf16
    python run_all.py --help

On first use it creates its own environment (.venvs/runner) and one environment and Jupyter
kernel per framework (.venvs/<framework>-<cpu|cuda>) from the pins in envs/; later runs reuse them.
"""
import sys

from runner.envs.bootstrap import reexec_in_runner

def parse(args):
    """The options alone (standard library): the bootstrap asks before it makes the runner's environment."""
    from runner.cli_options import build_parser
    build_parser().parse_args(args)


if __name__ == "__main__":
    reexec_in_runner(sys.argv, parse)
    from runner import interrupt
    from runner.cli import main
    status = main(sys.argv[1:])
    interrupt.exit_if_stopped(status)       # stopped by a signal: no interpreter shutdown for a late one to hit
    sys.exit(status)
