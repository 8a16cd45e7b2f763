#!/usr/bin/env python3
"""The same rows run on two machines, side by side: each row's wall time, warm-up and speed, and their ratio.

    python tools/compare_runs.py results/records results/experiments/smoke_xeon_b26da18/records

Compares the records of the same file name (row, preset, precision, batch size) in the two record folders and
prints a Markdown table: the notebook's wall time (``run.wall_s``), its warm-up (``timing.warmup_s``), its audio
seconds per second, each as A, B and A / B, and the totals of the wall times.  Each column is named by the machine
its record names (``device.name``).  Exit status 2 (one line) for an empty or missing folder, a path that is not
a folder, a file that is not a record, or no record in common.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common.results import read_record  # noqa: E402

PROG = "compare_runs.py"


def _records(folder):
    """{file name: record} of the ok records in ``folder`` (each read and checked as the report reads it: a file
    that is not a record of this schema is an error, ValueError)."""
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".json") and not name.startswith("."):
            rec = read_record(os.path.join(folder, name))
            if rec["status"] == "ok":
                out[name] = rec
    return out


def _ratio(a, b):
    return "%.2f" % (a / b) if a and b else "-"


def _num(x):
    return "-" if x is None else "%.1f" % x


def compare(folder_a, folder_b):
    """The Markdown table of the rows both folders ran ok."""
    a, b = _records(folder_a), _records(folder_b)
    common = [n for n in a if n in b]
    if not common:
        raise ValueError("no ok record of the same name in %s and %s" % (folder_a, folder_b))
    name_a = a[common[0]]["device"].get("name") or folder_a
    name_b = b[common[0]]["device"].get("name") or folder_b
    lines = ["A: %s (%s); B: %s (%s)" % (name_a, folder_a, name_b, folder_b), "",
             "| row | wall s A | wall s B | A / B | warm-up s A | warm-up s B | A / B | audio-s/s A | audio-s/s B "
             "| B / A |", "|---|---|---|---|---|---|---|---|---|---|"]
    totals = [0.0, 0.0]
    for n in common:
        ra, rb = a[n], b[n]
        wa, wb = ra["run"]["wall_s"], rb["run"]["wall_s"]
        ua, ub = ra["timing"].get("warmup_s"), rb["timing"].get("warmup_s")
        sa, sb = ra["timing"].get("audio_s_per_s"), rb["timing"].get("audio_s_per_s")
        totals[0] += wa
        totals[1] += wb
        lines.append("| %s | %.1f | %.1f | %s | %s | %s | %s | %s | %s | %s |" % (
            n[:-len(".json")], wa, wb, _ratio(wa, wb), _num(ua), _num(ub), _ratio(ua, ub), _num(sa), _num(sb),
            _ratio(sb, sa)))
    lines.append("| all (%d) | %.1f | %.1f | %s | | | | | | |" % (len(common), totals[0], totals[1],
                                                                 _ratio(totals[0], totals[1])))
    return "\n".join(lines)


def folder_error(folder):
    """Why ``folder`` cannot be read as a record folder, or None."""
    if not folder.strip():
        return "%r is empty: an empty path names no folder" % folder
    if not os.path.exists(folder):
        return "no folder %s" % folder
    if not os.path.isdir(folder):
        return "%s is not a folder: name a folder of records (results/records)" % folder
    return None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    usage = "usage: %s RECORDS_A RECORDS_B" % PROG
    if argv in (["-h"], ["--help"]):
        print(usage + "\n\n" + __doc__.split("\n\n")[0])
        return 0
    if len(argv) != 2 or any(a.startswith("-") for a in argv):
        print("%s: error: expected two record folders, got %s: %s" % (PROG, " ".join(argv) or "none", usage),
              file=sys.stderr)
        return 2
    problem = next((e for e in map(folder_error, argv) if e), None)
    if problem:
        print("%s: error: %s" % (PROG, problem), file=sys.stderr)
        return 2
    try:
        print(compare(*argv))
    except ValueError as e:
        print("%s: error: %s" % (PROG, e), file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
