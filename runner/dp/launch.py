"""Data-parallel runs: ``run_all.py --workers W`` (W > 1) -- one notebook, W processes, one record.

**One source.**  The notebook stays the only copy of each framework's model, loss and weight
loading.  The runner gives it its parameters with papermill's own API
(:func:`papermill.parameterize.parameterize_notebook`, the same injected cell a papermill run gets,
plus ``workers=W`` and the *global* batch size), exports the code cells with nbconvert's
``PythonExporter`` to ``results/.staging/<stem>.py``, and launches that script W times with the
framework's standard launcher (:data:`LAUNCHERS`).  The notebook's data-parallel code reads its rank
from the launcher's standard variables (:func:`common.parallel.world_from_env`), builds the shared
iterator with the global batch size and trains on its slice of every batch (``batch.shard(rank, W)``,
:func:`common.data.shard_bounds`); rank 0 alone writes the record to the staging path, with a
``distributed`` section (:func:`common.parallel.distributed_section`).

**What a data-parallel run leaves**: the record ``records/<stem>_w<W>.json``, whose ``run`` section
names the script (the "executed notebook" of a data-parallel run: the exported code, exactly what
ran) and the logs ``logs/<stem>_w<W>.rank<N>.log`` (every rank's stdout and stderr, the framework's
C++ output included) and ``logs/<stem>_w<W>.launcher.log`` (the launcher's own output).

**Failures.**  Every worker runs under ``runner/dp/worker.py``, which writes a status file (running /
ok / failed with a one-line reason).  The runner starts each launcher process in a new session
(its own process group) and polls: when any process exits non-zero, or the run passes its timeout,
or the runner itself is interrupted (Ctrl-C), it sends SIGTERM to every process group of the run and
to every process that carries the run's marker variable ``DS2_DP_RUN`` (torchrun starts its workers
in sessions of their own, so a process-group kill alone would miss them), waits :data:`GRACE_S` (5 s),
then SIGKILLs what is left: a framework that catches SIGTERM itself (JAX's preemption notifier, installed
by ``jax.distributed.initialize``) is never relied on to exit.  A second signal to the runner during that
clean-up SIGKILLs every process of the run at once (:func:`runner.interrupt.hard_stop`).

**A runner that dies.**  Should the runner itself be killed outright (SIGKILL, the OOM killer), its
processes end within about a second: each process it starts gets ``PR_SET_PDEATHSIG`` -- SIGKILL for a
worker or an MXNet ps-lite role it starts itself, SIGTERM for torchrun and mpiexec, which then stop their
workers -- and every worker (``runner/dp/worker.py``) also watches the runner's process
(``DS2_RUNNER_PID``) and kills itself once that is gone, whoever its parent is.  The next run into the same
results directory writes such a row's failed record (prepared when it started) and removes what it left in
``.staging/`` (rank 0's record, the status files): :mod:`runner.run.staging`.  The failed row's reason names the rank
and the last error line of its log.  A run whose every rank reported ok counts, even when a process
then dies at exit (a framework's teardown: gloo was seen to abort one rank's interpreter shutdown in
6 runs in 240): its record's ``run.teardown`` names the process, the signal and its last log line.

**Batch size.**  ``--batch-size b`` (default: the preset's) is the batch of *one worker*, DeepMark's
"per GPU" convention: the run trains on global batches of ``W*b`` and its record's ``batch_size`` is
the global ``W*b`` -- so it sits in the same results.md group as the single-worker run with
``--batch-size W*b``, the run it must equal (:func:`common.parallel.equivalence`, recorded as
``checks.equivalence`` when that record exists).

**Timeout.**  With ``--workers`` there are no cells: ``--timeout S`` bounds the whole run.

**Modules.**  This one runs a target (:func:`run_target`: its steps are :class:`_Run`'s methods);
``runner/dp/launchers.py`` holds the launcher table, ``runner/dp/supervisor.py`` starts, watches and stops the
processes (:func:`launch`), ``runner/dp/hosts.py`` and ``runner/dp/host_agent.py`` add several hosts, and
``runner/report/data_parallel.py`` writes results.md's data-parallel section.
"""
import os
import uuid
from collections import OrderedDict
from typing import List, Optional

from common import envinfo, parallel, results
from common.data import shard_sizes

from runner.envs import framework_envs
from runner.dp import supervisor
from runner.base import ROOT, EnvError
from runner.envs.bootstrap import env_python
from runner.envs.definitions import ENVS
from runner.run.targets import Target
from runner.dp.launchers import LAUNCHERS, Launcher, launcher_for, launcher_table_markdown, one_process_reason
from runner.run import staging
from runner.run.targets import MXNET_DP_MODES
from runner.dp.supervisor import GRACE_S, _which, launch


# ---- the notebook: its parameters, and the script exported from it -------------------------------
def notebook_parameter_names(path: str) -> List[str]:
    """Names assigned in the notebook's cell tagged ``parameters`` (empty when it has none or cannot be read;
    runner/validate.py reads them)."""
    from runner.validate import notebook_parameter_names as names
    return names(path) or []


def export_script(notebook: str, parameters: dict, script: str, header: str = "") -> str:
    """``notebook`` with ``parameters`` injected by papermill, its code cells as one Python script."""
    import nbformat
    from nbconvert import PythonExporter
    from papermill.parameterize import parameterize_notebook
    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:                          # what papermill's execute_notebook prepares first
        cell.metadata.setdefault("tags", [])
    nb.metadata.setdefault("papermill", {})
    nb = parameterize_notebook(nb, parameters, report_mode=False, language="python")
    body, _ = PythonExporter().from_notebook_node(nb)
    text = "".join("# %s\n" % line for line in header.splitlines()) + body
    results.atomic_write_text(script, text)
    return script


# ---- one target, W workers: the record -----------------------------------------------------------------
def _global_opts(opts, workers: int):
    """``opts`` with the preset's batch size multiplied by ``workers`` (the per-worker batch stays b)."""
    import copy
    g = copy.copy(opts)
    g.preset = opts.preset.with_overrides(batch_size=opts.preset.batch_size * workers)
    return g


def record_stem(target: Target, opts, workers: int, mxnet_dp: str = "sync", n_hosts: int = 1) -> str:
    """The single-worker stem of the *global* batch, plus ``_w<W>`` (an MXNet mode's suffix; ``_h<N>`` on N
    hosts)."""
    from runner.run.execute import record_stem as single_stem
    return single_stem(target, _global_opts(opts, workers)) + "_w%d" % workers + MXNET_DP_MODES[mxnet_dp]["suffix"] \
        + ("_h%d" % n_hosts if n_hosts > 1 else "")


def no_dp_reason(target: Target, launcher: Optional[Launcher] = None, profile: bool = False) -> Optional[str]:
    """Why ``target`` cannot run data-parallel (from its notebook and the launcher table; ``profile``: with
    ``--profile``), or None."""
    if (launcher or launcher_for(target)) is None:
        return "no data-parallel launcher is defined for %s (runner/dp/launch.py)" % target.name
    if not os.path.exists(target.notebook_path):
        return None   # reported as a missing notebook
    if "workers" not in notebook_parameter_names(target.notebook_path):
        return ("the %s notebook has no data-parallel code yet (no 'workers' parameter)"
                % target.label.split(" (")[0])
    return one_process_reason(target, profile)


class _Run:
    """One data-parallel run of a target, in the steps :func:`run_target` takes: its plan (here: the record's
    name, the paths, the launcher, the ``distributed`` section), whether it can run here (:meth:`refusal`), its
    environment (:meth:`environment`), the script (:meth:`export`), the launch (:meth:`start`) and rank 0's record
    checked and completed (:meth:`collect`).  Every early end writes the same failed record through
    :meth:`finish`, with the same ``distributed`` and ``run`` sections."""

    def __init__(self, target: Target, opts, workers: int, announce, python: Optional[str],
                 launcher: Optional[Launcher], mxnet_dp: str, hosts):
        self.target, self.opts, self.workers, self.announce = target, opts, workers, announce
        self.python, self.venv, self.mxnet_dp, self.hosts = python, None, mxnet_dp, hosts
        self.mode = MXNET_DP_MODES[mxnet_dp]
        self.started = results.utc_now()
        self.gopts = _global_opts(opts, workers)
        self.stem = record_stem(target, opts, workers, mxnet_dp, len(hosts or []))
        self.dirs = {k: os.path.join(opts.results_dir, k) for k in ("records", ".staging", "logs")}
        for d in self.dirs.values():
            os.makedirs(d, exist_ok=True)
        staging.recover(opts.results_dir)                    # the rows of a runner killed outright
        self.record_path = os.path.join(self.dirs["records"], self.stem + ".json")
        self.staged = os.path.join(self.dirs[".staging"], self.stem + ".json")
        self.script = os.path.join(self.dirs[".staging"], self.stem + ".py")
        self.log_prefix = os.path.join(self.dirs["logs"], self.stem)
        self.status_prefix = os.path.join(self.dirs[".staging"], self.stem)
        if launcher is None and mxnet_dp != "sync" and target.row_of_record == "mxnet":
            launcher = LAUNCHERS[self.mode["launcher"]]
        self.launcher = launcher or launcher_for(target)
        self.decision = None                 # the GPU preflight's, once can_run has been asked (refusal)
        self.per_worker = opts.preset.batch_size
        self.section = OrderedDict([("world_size", workers), ("launcher", self.launcher.name if self.launcher else None),
                                    ("per_worker_batch", self.per_worker), ("global_batch", self.per_worker * workers),
                                    ("shards", None)])
        if target.row_of_record == "mxnet":
            self.section["mxnet_dp"] = mxnet_dp
        if hosts:
            self.section["hosts"] = [h.to_dict() for h in hosts]

    def run_section(self, extra=None) -> dict:
        from runner.run import execute
        info = execute._run_info(self.target, self.gopts, self.started, None, self.decision)
        single = self.launcher is not None and self.launcher.kind == "single"
        info.update(script=_rel(self.script) if os.path.exists(self.script) else None,
                    logs=[_rel("%s.rank%d.log" % (self.log_prefix, r)) for r in range(1 if single else self.workers)],
                    launcher_log=_rel(self.log_prefix + ".launcher.log"))
        info["executed_notebook"] = info["script"]
        info.update(extra or {})
        return info

    def failed(self, status: str, reason: str, extra=None) -> dict:
        """The failed record of this run, with its ``distributed`` and ``run`` sections."""
        from runner.run import execute
        rec = results.failed_record(self.target.name, status, reason, **execute._base_fields(self.target, self.gopts))
        rec["environment"] = envinfo.collect()
        rec["distributed"] = dict(self.section)
        rec["run"] = self.run_section(extra)
        return execute.mark_as_is(rec, self.target, self.opts)

    def finish(self, status: str, reason: str, extra=None) -> dict:
        rec = self.failed(status, reason, extra)
        results.write_record(self.record_path, rec)
        self.announce("  %s: %s" % (status, rec["error"]))
        return rec

    def refusal(self) -> Optional[tuple]:
        """(status, reason) when the run cannot start here: not MXNet's mode, no launcher, the GPU preflight, the
        notebook, several hosts, too few GPUs, no mpiexec; else None."""
        from runner.run import execute
        target, launcher, opts = self.target, self.launcher, self.opts
        if self.mxnet_dp != "sync" and target.row_of_record != "mxnet":
            return "skipped", "--mxnet-dp %s is a mode of MXNet's data-parallel code, not of %s" % (self.mxnet_dp,
                                                                                                 target.name)
        if launcher is None:
            return "skipped", "no data-parallel launcher is defined for %s (runner/dp/launch.py)" % target.name
        self.decision, status, why = execute.can_run(target, opts)
        if why:
            return status, why
        reason = no_dp_reason(target, launcher, opts.profile)
        if reason:
            return "skipped", reason
        if self.hosts and launcher.kind not in ("torchrun", "processes", "ps", "mpiexec"):
            from runner.dp import hosts as hosts_mod
            return "skipped", "the %s launcher is not run on several hosts here (%s)" % (
                launcher.name, hosts_mod.MULTI_HOST.get(launcher.name, "no multi-host form"))
        if opts.device == "cuda" and not self.hosts:     # each host's GPUs are its own
            visible = len(envinfo.gpus())
            if visible < self.workers:  # one GPU per worker (torchrun LOCAL_RANK, MWMS, JAX, mpiexec) or per device
                return "skipped", "%d workers need %d GPUs; %d visible" % (self.workers, self.workers, visible)
        if launcher.kind == "mpiexec" and not _which("mpiexec"):
            return "skipped", "mpiexec not found: install OpenMPI (Debian/Ubuntu: apt-get install openmpi-bin)"
        return None

    def environment(self) -> Optional[tuple]:
        """The interpreter (given, as installed, or the target's environment, made if needed) and its venv;
        (status, reason) when there is none."""
        target, opts, python = self.target, self.opts, self.python
        if python is not None and os.path.exists(os.path.join(os.path.dirname(os.path.dirname(python)), "pyvenv.cfg")):
            self.venv = os.path.dirname(os.path.dirname(python))       # an interpreter given by hand: still its venv's
        if python is None and target.env in opts.installed:     # --use-installed: the interpreter as it is
            python = opts.installed[target.env]
        if python is None:
            env = ENVS[target.env]
            build = self.decision.build if self.decision else None
            try:
                framework_envs.ensure(env, opts.device, opts.pythons.get(env.name), announce=self.announce,
                                      build=build, wheelhouse=opts.wheelhouse)
            except EnvError as e:
                missing = env.needs_python and env.name not in opts.pythons
                return "skipped" if missing else "failed", "environment %s: %s" % (env.name, e)
            self.venv = framework_envs.env_path(env, opts.device, opts.pythons.get(env.name), build)
            python = env_python(self.venv)
        self.python = python
        if self.launcher.kind == "torchrun" and not os.path.exists(os.path.join(os.path.dirname(python), "torchrun")):
            return "failed", "torchrun not found next to %s" % python
        return None

    def export(self) -> Optional[str]:
        """The script: the notebook, parameterised, as code; the reason when it cannot be exported."""
        from runner.run import execute
        parameters = dict(execute.notebook_parameters(self.target, self.gopts, self.staged), workers=self.workers,
                          **self.mode["parameters"])
        for path in (self.staged, self.script):
            if os.path.exists(path):
                os.remove(path)
        header = ("Generated by run_all.py --workers %d from %s: the notebook's code cells with papermill's "
                  "injected parameters.\nLaunched with %s; do not edit (edit the notebook)."
                  % (self.workers, _rel(self.target.notebook_path), self.launcher.name))
        try:
            export_script(self.target.notebook_path, parameters, self.script, header)
        except Exception as e:  # nbformat/nbconvert/papermill errors: one line
            return "cannot export the notebook to a script: %s: %s" % (type(e).__name__, results.one_line(str(e)))
        return None

    def start(self, grace: float, ssh_options, join_timeout):
        """The launch, watched to its end by the supervisor: (its LaunchResult, None), or (None, the failed
        record) when the hosts' preflight or the launcher's start failed.  An interruption is recorded, then
        re-raised."""
        hosts, launcher, workers = self.hosts, self.launcher, self.workers
        if hosts:
            from runner.dp import hosts as hosts_mod
            try:
                hosts_mod.preflight(hosts, ssh_options or [], self.python, [ROOT, self.script],
                                    hosts_mod.JOIN_TIMEOUT_S if join_timeout is None else join_timeout)
            except hosts_mod.HostsError as e:
                return None, self.finish("failed", str(e))
        self.announce("  %d workers via %s%s" % (workers, launcher.name, " on %d hosts (%s)" % (
            len(hosts), ", ".join("%s:%d" % (h.name, h.slots) for h in hosts)) if hosts else ""))
        staging.claim(self.dirs[".staging"], self.stem, self.failed)
        try:
            res = launch(launcher, self.python, self.script, workers, self.log_prefix, self.status_prefix,
                         cwd=os.path.dirname(self.target.notebook_path), timeout=self.opts.timeout, venv=self.venv,
                         announce=self.announce, grace=grace, hosts=hosts, ssh_options=ssh_options,
                         join_timeout=join_timeout)
        except KeyboardInterrupt as e:     # run_all.py's SIGINT/SIGTERM (runner.interrupt) say which
            self.finish("failed", getattr(e, "reason", "interrupted by the user"))
            raise
        except OSError as e:
            return None, self.finish("failed", "cannot start the %s launcher: %s" % (launcher.name, e))
        return res, None

    def collect(self, res) -> dict:
        """Rank 0's record, checked (the data checksum, the world size, the global batch) and completed (the
        ``distributed`` and ``run`` sections, the equivalence with one worker), written; or the failed record."""
        from runner.run import execute
        workers, per_worker, target, opts = self.workers, self.per_worker, self.target, self.opts
        extra = {"launch_commands": res.commands, "wall_s": res.wall_s,
                 "ranks": {str(r): {k: st.get(k) for k in ("status", "exit_code", "error", "pid", "host")}
                           for r, st in sorted(res.statuses.items())},
                 "returncodes": res.returncodes}
        if res.teardown:
            extra["teardown"] = "every rank reported ok; then " + res.teardown
        if not res.ok:
            return self.finish("failed", res.reason, extra)
        try:
            rec = results.read_record(self.staged)
        except (OSError, ValueError) as e:
            return self.finish("failed", "rank 0 wrote no valid record: %s" % e, extra)
        expected = execute.expected_checksum(self.gopts.preset, opts.seed)
        got = (rec.get("data") or {}).get("checksum")
        rec.setdefault("checks", {})["checksum"] = {"checksum": got, "expected": expected, "ok": got == expected}
        notebook_section = rec.get("distributed") or {}
        section = self.section
        section.update(notebook_section)
        section.update(world_size=workers, launcher=self.launcher.name, per_worker_batch=per_worker,
                       global_batch=per_worker * workers, backend=notebook_section.get("backend"),
                       notebook_world_size=notebook_section.get("world_size"),
                       shards={"sizes_of_a_full_batch": shard_sizes(per_worker * workers, workers)})
        rec["distributed"] = section
        rec["row_of_record"] = target.row_of_record
        rec["run"] = dict(rec.get("run", {}), **self.run_section(extra))
        problems = []
        if got != expected:
            problems.append("data checksum %s differs from the runner's %s" % (got, expected))
        if notebook_section.get("world_size") != workers:
            problems.append("rank 0 reports world size %r, not the %d workers launched (its record has no "
                            "distributed section from common.parallel.distributed_section?)"
                            % (notebook_section.get("world_size"), workers))
        if rec.get("batch_size") != per_worker * workers:
            problems.append("rank 0's record has batch size %r, not the global %d" % (rec.get("batch_size"),
                                                                                     per_worker * workers))
        eq = rec["checks"]["equivalence"] = self.equivalence(rec)
        if eq.get("ok") is False:
            problems.append("not equivalent to the single-worker run %s: %s" % (eq.get("reference"), eq.get("error")))
        if problems and rec.get("status") == "ok":
            rec["status"], rec["error"] = "failed", results.one_line(problems[0])
        results.write_record(self.record_path, execute.mark_as_is(rec, target, opts))
        if rec["status"] == "ok":
            t = rec.get("timing") or {}
            self.announce("  ok: %d workers, %.1f s of audio per second; equivalence with 1 worker: %s"
                          % (workers, t.get("audio_s_per_s", float("nan")),
                             "rel. diff %.1e" % eq["rel_diff"] if eq.get("rel_diff") is not None else eq.get("note")))
        else:
            self.announce("  %s: %s" % (rec["status"], rec["error"]))
        return rec

    def equivalence(self, rec: dict) -> dict:
        """The equivalence with one worker and the global batch (MXNet dist_sync: with its 'local' run), when that
        record exists."""
        from runner.run import execute
        reference = self.mode["reference"]
        if reference is None:
            return {"ok": None, "note": "each device its own BatchNorm statistics: not one worker's computation; the "
                                        "reference of --mxnet-dp dist_sync"}
        stem = execute.record_stem(self.target, self.gopts) if reference == "single-worker" else \
            record_stem(self.target, self.opts, self.workers, reference)
        return equivalence_with(rec, os.path.join(self.dirs["records"], stem + ".json"))


def _rel(path: str) -> str:
    return os.path.relpath(path, ROOT)


def run_target(target: Target, opts, workers: int, announce=print, python: Optional[str] = None,
               launcher: Optional[Launcher] = None, grace: float = GRACE_S, mxnet_dp: str = "sync",
               hosts=None, ssh_options: Optional[List[str]] = None, join_timeout: Optional[float] = None,
               print_host_commands: bool = False) -> dict:
    """Run ``target`` with ``workers`` processes and write its record (``<stem>_w<W>.json``); returns it.

    ``python`` / ``launcher`` override the target's environment interpreter and launcher (the tests run
    a standard-library fixture notebook in the runner's own interpreter with the "python" launcher).
    ``mxnet_dp``: MXNet's mode (:data:`MXNET_DP_MODES`; "sync" for every other framework).
    ``hosts``, ``ssh_options``, ``join_timeout``: several hosts (runner/dp/hosts.py); ``print_host_commands``: print
    each host's command instead of running it (returns None).

    The steps: plan, can it run here, its environment, the script, the launch, rank 0's record (:class:`_Run`)."""
    if workers < 2:
        raise ValueError("run_target runs 2 or more workers; one worker is execute.run_target")
    run = _Run(target, opts, workers, announce, python, launcher, mxnet_dp, hosts)
    refused = run.refusal() or run.environment()
    if refused:
        return run.finish(*refused)
    reason = run.export()
    if reason:
        return run.finish("failed", reason)
    if print_host_commands:
        return print_commands(run.launcher, hosts, run.python, run.venv, run.script, workers, run.log_prefix,
                              run.status_prefix, target, join_timeout)
    try:
        res, failed = run.start(grace, ssh_options, join_timeout)
        return failed if res is None else run.collect(res)
    finally:
        staging.release(run.dirs[".staging"], run.stem)      # however it ended: its transient files go


def print_commands(launcher, hosts, python, venv, script, workers, log_prefix, status_prefix, target,
                   join_timeout) -> None:
    """``--print-host-commands``: each host's processes as shell lines, for a job script (Slurm, Kubernetes)."""
    from runner.dp import hosts as hosts_mod
    worker = supervisor.worker_argv(log_prefix, status_prefix, script)
    ports = [29400 + i for i in range(supervisor.port_count(launcher, workers))]   # fixed: the lines run elsewhere
    per_host = hosts_mod.host_processes(launcher, hosts, python, worker, supervisor.launcher_env(launcher, venv), ports,
                                        "ds2-" + uuid.uuid4().hex[:8],
                                        hosts_mod.JOIN_TIMEOUT_S if join_timeout is None else join_timeout)
    print("# %s on %d hosts: run each host's lines on that host (rank 0 writes its record to %s)"
          % (target.name, len(hosts), os.path.relpath(status_prefix + ".json", ROOT)))
    for name, processes in per_host.items():
        for line in hosts_mod.printable(processes, os.path.dirname(target.notebook_path)):
            print("%s\t%s" % (name, line))
    return None


def equivalence_with(rec: dict, single_path: str) -> dict:
    """``checks.equivalence`` of a W-worker record against the single-worker record at ``single_path``."""
    reference = os.path.relpath(single_path, ROOT)
    if not os.path.exists(single_path):
        d = rec.get("distributed") or {}
        if d.get("mxnet_dp") == "dist_sync":
            return {"reference": reference, "ok": None,
                    "note": "no --mxnet-dp local record yet: run_all.py --frameworks %s --workers %s --batch-size %s "
                            "--mxnet-dp local (same preset, scale, seed) records it"
                            % (rec.get("target"), d.get("world_size"), d.get("per_worker_batch"))}
        return {"reference": reference, "ok": None,
                "note": "no single-worker record with the global batch yet: run_all.py --frameworks %s "
                        "--batch-size %s (same preset, scale, seed) records one" % (rec.get("target"),
                                                                                   rec.get("batch_size"))}
    try:
        single = results.read_record(single_path)
    except (OSError, ValueError) as e:
        return {"reference": reference, "ok": None, "note": "unreadable: %s" % e}
    if single.get("status") != "ok":
        return {"reference": reference, "ok": None, "note": "the single-worker run is %s" % single.get("status")}
    out = parallel.equivalence(rec, single)
    out["reference"] = reference
    return out


def main() -> int:
    """``python -m runner.dp``: the launcher table, and which targets can run data-parallel now."""
    from runner.run.targets import ALL_TARGETS
    print(launcher_table_markdown())
    for target in ALL_TARGETS.values():
        launcher = launcher_for(target)
        print("%-22s %-10s %s" % (target.name, launcher.name if launcher else "-",
                                  no_dp_reason(target) or "ready: the notebook has a 'workers' parameter"))
    return 0
