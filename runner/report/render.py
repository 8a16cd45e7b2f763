"""results.md and its plots, generated from the result records only.

Sections: the table of record (one row per record, failed and skipped rows with their reason),
speed and efficiency per preset and device (achieved FLOP/s, share of the measured matmul peak,
speed relative to the group's fastest row, rows of record against their framework's fastest
variant) with the measured peaks per device, throughput bars, audio s/s against batch size,
step time per utterance length, where the time of a step goes (records with a ``profile``),
the cross-framework agreement table and loss trajectories ("they compute the same thing") with the
float64 control (a pytorch record of precision fp64: every fp32 trajectory against it; the control is a
row of no other table or plot), the migration matrix of ``run_all.py --migrate`` and the convention
differences measured on the exports (runner/migrate.py), the environments, and how the records were made.  A record without a ``flops`` or ``profile`` section
(older records) keeps its rows, with dashes.

The page is composed here; its parts live in

- ``runner/report/records.py``: selecting, grouping and naming records; the Markdown table helpers;
- ``runner/report/tables.py``: the summary, the table of record, speed and efficiency, peaks, profiles, step time;
- ``runner/report/checks.py``: agreement, the float64 control, the ONNX exit route, the migration matrix;
- ``runner/report/plots.py``: the plots;
- ``runner/report/provenance.py``: the environments and how the records were made;
- ``runner/report/data_parallel.py``, ``learning.py``, ``gpu_facts.py``, ``latency.py``: the data-parallel section,
  the real task's, the GPU facts and the latency-aware roofline's figures.

Each caller imports a name from the module that defines it.
"""
import os
import sys
from typing import List, Optional

from common import results
from common.profile import CATEGORIES
from common.results import atomic_write_text

from runner import validate
from runner.report import data_parallel, learning
from runner.base import ROOT
from runner.report.checks import (CONTROL_COLUMN, agreement_rows, control_section, is_control, migration_section,
                                  onnx_section)
from runner.report.plots import (PLOTS, discard, plot_batch_sweep, plot_flops, plot_step_time, plot_summary,
                                 plot_throughput, plot_trajectories)
from runner.report.provenance import environment_rows, provenance_rows
from runner.report.records import FAST_COMPILE_NOTE, K_STEPS, compiled_fast, dp_label, md_table
from runner.report.gpu_facts import TITLE, before_you_rent
from runner.report.latency import load_latency
from runner.report.tables import (FIT_MIN_R2, RNN_TOTAL, peak_section, profile_rows, record_tables, speed_section,
                                  step_time_rows, summary_section)


# ---- the page ----------------------------------------------------------------------------
def _records_dir(results_dir: str) -> str:
    d = os.path.join(results_dir, "records")
    return d if os.path.isdir(d) else results_dir


def _make_plots(records: List[dict], controls: List[dict], plots_dir: str) -> dict:
    """Write every plot into ``plots_dir`` ({name: whether it was made}); a plot with nothing to show is removed."""
    os.makedirs(plots_dir, exist_ok=True)
    made = {}
    for name, fn in (("summary", plot_summary), ("throughput", plot_throughput), ("step_time", plot_step_time),
                     ("trajectories", lambda recs, p: plot_trajectories(recs, p, controls=controls)),
                     ("flops", plot_flops), ("batch_sweep", plot_batch_sweep)):
        path = os.path.join(plots_dir, PLOTS[name])
        made[name] = fn(records, path)
        if not made[name]:
            discard(path)
    return made


def _top_lines(records, all_records, output, image, header, records_dir, latency=None) -> List[str]:
    """The title, the summary, what to know before renting a GPU and the table of record."""
    return [
        "# DS2 Rosetta results",
        "",
        header,
        "",
    ] + summary_section(records) + [
        image("summary", "seconds of audio per second per framework and batch size, one panel per device and preset"),
        "A framework that could not run keeps its row in the table of record, with the reason. CPU `smoke` rows "
        "check correctness and the pipeline; they say nothing about GPU speed.",
        "",
    ] + before_you_rent(all_records, records_dir, output, latency) + [
        "## Table of record",
        "",
    ] + (record_tables(records, output) if records else ["_No result records._\n"]) + [
        "Audio s/s: seconds of audio trained per second of wall time over the timed pass (the headline). "
        "Fwd ms: forward-only milliseconds for a batch of 1 s and of 15 s utterances (a dash: the preset has no "
        "15-s batch, or the run left the forward timing out). Peak mem: device memory on a GPU; on a CPU the "
        "process's peak resident memory through the warm-up and the timed pass (a dash: a profiled record older "
        "than that figure, whose only peak includes the profiler's). First-loss check: relative difference from the "
        "NumPy reference." + (" A row marked *(as installed)* ran in an interpreter whose frameworks were already "
                              "installed (`run_all.py --use-installed`): its versions, under Environments, are not "
                              "the pins'." if any(r.get("as_is") for r in all_records) else "")
        + (" A row named *(LLVM -O0)*: %s." % FAST_COMPILE_NOTE if any(compiled_fast(r) for r in records) else "")
        + (" A data-parallel row (*W workers*, with MXNet's mode and the hosts) ran a script made from its notebook, "
           "which the repository does not keep: *source, 9b* links the notebook, whose section 9b is that code."
           if any(dp_label(r) for r in records) else ""),
        "",
    ]


def _speed_lines(records, image, latency=None) -> List[str]:
    """Speed and efficiency, the measured peaks, throughput, batch size, step time and the profiles."""
    return [
        "## Speed and efficiency",
        "",
        speed_section(records, latency),
        image("flops", "achieved training FLOP/s per row, with the measured matmul peak"),
        "## Measured matrix-product peak",
        "",
        peak_section(records),
        "## Throughput",
        "",
        image("throughput", "seconds of audio per second, per framework and precision") or "_No completed runs._\n",
        "## Batch size",
        "",
        "Seconds of audio per second against the batch size, where one preset ran on one device with several "
        "batch sizes (`run_all.py --batch-size 8,32`).",
        "",
        image("batch_sweep", "audio seconds per second against batch size")
        or "_No preset ran on one device with more than one batch size._\n",
        "## Step time per utterance length",
        "",
        "Median milliseconds per training step, by utterance length (seconds). Fixed ms and ms per s of audio: the "
        "least-squares line through a row's medians, step = fixed + (ms per s) x seconds of audio: what a step "
        "costs whatever its length (launches, CTC, the update, host copies) and what each second of audio adds "
        "(the recurrence above all), for a batch of the row's batch size; shown where every length's batches were "
        "full and the line explains at least %d %% of the medians' variance (R²), else –. On the cpu and smoke "
        "presets a length's batch holds that length's share of the utterances (on cpu 1 to 14), so their columns "
        "compare rows, not lengths." % round(100 * FIT_MIN_R2),
        "",
        md_table(step_time_rows(records), dict({"%d s" % s: "{:.1f}" for s in range(1, 16)},
                                               **{"Fixed ms": "{:.1f}", "ms per s of audio": "{:.2f}"})),
        image("step_time", "ms per step against utterance length"),
        "## Where the time goes",
        "",
        "One training step on a batch of 8-second utterances under the framework's own profiler "
        "(`run_all.py --profile`): the share of the profiled operations' own time in each category, as each "
        "notebook classifies its framework's operation names (`common/profile.py`). Profiling slows a step "
        "down; the shares, not the seconds, are the result. `rnn_input` and `rnn_recurrence` are the RNN's input "
        "products and its recurrence where the framework's operations tell them apart (TensorFlow's); elsewhere a "
        "dash, and `rnn` holds the whole RNN. *%s* sums the three." % RNN_TOTAL,
        "",
        md_table(profile_rows(records), dict({"Step s": "{:.3f}", RNN_TOTAL: "{:.1f}"},
                                             **{"%s %%" % c: "{:.1f}" for c in CATEGORIES}))
        if profile_rows(records) else "_No record has a profile section._\n",
    ]


def _agreement_lines(records, controls, image) -> List[str]:
    """Do they compute the same thing: the agreement table, the float64 control, the loss trajectories."""
    return [
        "## Do they compute the same thing?",
        "",
        "The first batch's loss from the canonical weights against the NumPy reference, and the largest "
        "relative difference of the first %d training losses (warm-up steps first) from PyTorch's on the same "
        "benchmark." % K_STEPS,
        "",
        md_table(agreement_rows(records, controls),
                 {"First loss": "{:.6f}", "NumPy reference": "{:.6f}", "Rel. diff": "{:.1e}",
                  "Max rel. diff of first %d step losses vs PyTorch" % K_STEPS: "{:.1e}", CONTROL_COLUMN: "{:.1e}"}),
        control_section(records, controls),
        image("trajectories", "loss trajectories of all frameworks"),
    ]


def _warn(message: str) -> None:
    print("warning: %s" % message, file=sys.stderr, flush=True)


def unreadable_lines(unreadable, records_dir: str, output: str) -> List[str]:
    """The files of the records directory that are not readable records: each with why (no table has them)."""
    if not unreadable:
        return []
    rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(output)))  # noqa: E731
    return ["## Unreadable records", "",
            "These files in `%s` are not records this page can read, so every table leaves them out; running the "
            "row again rewrites its record." % rel(records_dir), ""] + [
        "- `%s`: %s" % (rel(path), why.replace("`", "'")) for path, why in unreadable] + [""]


def _count(n: int, one: str, many: str) -> str:
    return "%d %s" % (n, one if n == 1 else many)


def header_line(command: str, commit: Optional[str], records: int, records_dir: str, commands: int,
                machines: int) -> str:
    """The page's third line: what wrote it -- this module, run on its own or by ``run_all.py`` after its rows --
    and from which records, with a link to the section that lists the commands and machines that made them."""
    made = ("from %d result record(s) in `%s`, which %s made on %s ([how these records were made]"
            "(#how-these-records-were-made)); never edited by hand." % (
                records, records_dir, _count(commands, "command", "commands"),
                _count(machines, "kind of machine", "kinds of machine")))   # by their GPU's or CPU's name
    if command.split()[:3] == PROG.split():
        return "Generated by `%s` (commit `%s`) on %s %s" % (command, commit or "unknown", results.utc_now()[:10],
                                                            made)
    return ("Generated by `%s` (commit `%s`) on %s: after its own rows it regenerated this page, as `%s` does, %s"
            % (command, commit or "unknown", results.utc_now()[:10], PROG, made))


def render(results_dir: str, command: str, commit: Optional[str], output: str, warn=None) -> str:
    """results.md's text; writes the plots next to the records (``<results_dir>/plots``).  A file of the records
    directory that is not a readable record is one ``warn`` line (default: stderr) and listed on the page."""
    records_dir = _records_dir(results_dir)
    all_records, unreadable = results.scan_records(records_dir) if os.path.isdir(records_dir) else ([], [])
    for path, why in unreadable:
        rel = os.path.relpath(path)
        (warn or _warn)("%s is not a readable record (%s): %s leaves it out and lists it as unreadable"
                        % (path if rel.startswith("..") else rel, why, os.path.basename(output)))
    controls = [r for r in all_records if is_control(r)]        # the float64 control: no row anywhere
    learning_records = [r for r in all_records if learning.is_learning(r)]   # the real task: its own section only
    records = [r for r in all_records if not is_control(r) and not learning.is_learning(r)]
    plots_dir = os.path.join(results_dir, "plots")
    made = _make_plots(records, controls, plots_dir)
    rel = lambda p: os.path.relpath(p, os.path.dirname(os.path.abspath(output)))  # noqa: E731

    def image(name, alt):
        return "![%s](%s)\n" % (alt, rel(os.path.join(plots_dir, PLOTS[name]))) if made[name] else ""

    provenance = provenance_rows(all_records)
    header = header_line(command, commit, len(all_records), rel(records_dir), len(provenance),
                         len(set(p["Machine"] for p in provenance)))
    latency = load_latency(results_dir)
    lines = _top_lines(records, all_records, output, image, header, records_dir, latency) \
        + unreadable_lines(unreadable, records_dir, output) + _speed_lines(records, image, latency) \
        + _agreement_lines(records, controls, image) \
        + migration_section(results_dir, records, records_dir, controls) + onnx_section(records, results_dir, output) \
        + data_parallel.report_section(records, md_table) + learning.section(learning_records, plots_dir, rel) + [
            "## Environments",
            "",
            md_table(environment_rows(all_records)),
            "## How these records were made",
            "",
            md_table(provenance),
        ]
    return "\n".join(lines)


#: README.md's copies of parts of the page sit between marker lines; writing the project's results.md rewrites them
README = os.path.join(ROOT, "README.md")
README_BEGIN = "<!-- results.md's summary, copied here by python -m runner.report: edit runner/report/tables.py -->"
README_END = "<!-- end of results.md's summary -->"
GPU_BEGIN = "<!-- results.md's GPU facts, copied here by python -m runner.report: edit runner/report/gpu_facts.py -->"
GPU_END = "<!-- end of results.md's GPU facts -->"


def section_block(page: str, title: str, stop=("![", "## ")) -> str:
    """The lines of ``page``'s section ``title`` (a ``## `` heading), without the heading: up to a plot or the
    next section."""
    marker = "\n%s\n" % title
    lines = page.split(marker, 1)[1].split("\n") if marker in page else []
    out = []
    for line in lines:
        if line.startswith(stop):
            break
        out.append(line)
    return "\n".join(out).strip("\n")


def summary_block(page: str) -> str:
    """The summary of a results page without its heading: its lines up to the plot or the next section."""
    return section_block(page, "## Summary")


def _replace_between(text: str, begin: str, end: str, block: str) -> str:
    if begin not in text or end not in text.split(begin, 1)[1]:
        return text
    head, rest = text.split(begin, 1)
    return "%s%s\n\n%s\n\n%s%s" % (head, begin, block, end, rest.split(end, 1)[1])


def sync_readme(page: str, readme: str = README) -> bool:
    """Put ``page``'s summary and its GPU facts ("Before you rent a GPU", under a heading of README.md's own)
    between README.md's marker lines; True when README.md changed."""
    try:
        with open(readme) as f:
            text = f.read()
    except OSError:
        return False
    new = _replace_between(text, README_BEGIN, README_END, summary_block(page))
    new = _replace_between(new, GPU_BEGIN, GPU_END, section_block(page, TITLE, stop=("## ",)))
    if new == text:
        return False
    atomic_write_text(readme, new)
    return True


def write(results_dir: str, output: str, command: str, commit: Optional[str], warn=None) -> str:
    """Render the page, then put it in place atomically (a temporary file renamed over ``output``): a crash
    while rendering, or a signal, leaves the previous page whole.  The project's own results.md also refreshes
    README.md's copy of its summary."""
    page = render(results_dir, command, commit, output, warn=warn)
    atomic_write_text(output, page)
    if os.path.abspath(output) == os.path.join(ROOT, "results.md"):
        sync_readme(page)
    return output


PROG = "python -m runner.report"


def recover_killed(results_dir: str) -> List[str]:
    """The rows and migration pairs whose runner was killed outright (SIGKILL, a restart) while they ran, and which
    no run since has found: their prepared records written (runner/run/staging.py), so that the page says they did
    not finish instead of showing an earlier record of them.  A live runner's rows are left alone."""
    from runner.run import staging
    return staging.recover(results_dir) + staging.recover(os.path.join(results_dir, "migration"), records="")


def main(argv=None) -> int:
    """``python -m runner.report [--results-dir DIR] [--output FILE]``: results.md again from the records."""
    from runner.run.execute import git_commit
    p = validate.OneLineParser(prog=PROG, description=main.__doc__)
    p.add_argument("--results-dir", default=os.path.join(ROOT, "results"),
                   help="an existing results directory with records (default: results/)")
    p.add_argument("--output", default=None, help="default: results.md, or <results-dir>/results.md")
    args = p.parse_args(argv)
    problem = validate.report_error(args.results_dir, args.output)
    if problem:
        return validate.refuse(PROG, problem)
    results_dir = os.path.abspath(args.results_dir)
    output = os.path.abspath(args.output or validate.output_default(results_dir))
    for path in recover_killed(results_dir):
        print("%s: %s: its runner ended while the row ran; wrote the record it prepared" % (PROG, path))
    write(results_dir, output, PROG, git_commit(),
          warn=lambda message: print("%s: warning: %s" % (PROG, message), file=sys.stderr, flush=True))
    print("Wrote %s" % output)
    return 0
