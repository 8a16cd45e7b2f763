"""Run one target's notebook with papermill; always leave exactly one complete result record.

The notebook writes its record to a staging path; the runner checks it (data checksum
against its own iterator), adds how it was produced, and writes it atomically into
``<results>/records/``.  A run that fails at any point -- environment, kernel start, a failed
check, out of memory, timeout, interruption -- gets a record with status "failed" (or
"skipped" when the target cannot run here) and a one-line reason instead.
"""
import getpass
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Set

from common import envinfo, results
from common.data import DeepMarkIterator
from common.spec import Preset, get_preset

from runner.envs import framework_envs
from runner.envs import use_installed
from runner import interrupt, validate
from runner.envs import gpu_preflight
from runner.base import ROOT, EnvError
from runner.envs.definitions import ENVS
from runner.run import staging
from runner.run.targets import Target


class RunOptions:
    def __init__(self, preset: Preset, precision: str, seed: int, device: str, results_dir: str,
                 timeout: Optional[float] = None, pythons: Optional[Dict[str, str]] = None,
                 command: str = "", gpu: Optional[dict] = None, progress: bool = True,
                 found: Optional[Set[str]] = None, gpu_builds: Optional[Dict[str, str]] = None,
                 profile: bool = False, init_weights: Optional[str] = None,
                 installed: Optional[Dict[str, str]] = None, installed_facts: Optional[Dict[str, dict]] = None,
                 wheelhouse: Optional[str] = None, skip: Optional[List[str]] = None):
        self.preset = preset
        self.precision = precision
        self.seed = seed
        self.device = device            # "cpu" or "cuda"
        self.results_dir = results_dir
        self.timeout = timeout
        self.pythons = pythons or {}    # env name -> interpreter
        self.command = command
        self.gpu = gpu                  # first GPU's facts (envinfo.gpus()[0]) when device is cuda
        self.progress = progress
        self.found = found or set()     # env names whose interpreter was found here, not given (CNTK's)
        self.gpu_builds = gpu_builds or {}  # env name -> CUDA build forced with --gpu-build (runner/envs/gpu_preflight.py)
        self.profile = profile          # profile one training step (the notebook's ``profile`` parameter)
        self.init_weights = init_weights  # a canonical .npz every notebook starts from (``init_weights``), or None
        self.installed = installed or {}  # env name -> an interpreter run as it is (--use-installed)
        self.installed_facts = installed_facts or {}   # env name -> its preflight (runner/envs/use_installed.py probe)
        self.wheelhouse = wheelhouse    # environments are made from this directory, no index (--wheelhouse)
        self.skip = list(skip or [])    # parts every notebook leaves out (--skip; the ``skip`` parameter)

    @property
    def device_slug(self) -> str:
        if self.device == "cpu" or not self.gpu:
            return self.device
        return envinfo.device_slug(self.gpu.get("name", "gpu"))


def git_commit() -> Optional[str]:
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, universal_newlines=True).stdout.strip()
        # "-dirty" when the code differs from the commit; the generated results/ and results.md do not count
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results",
                                ":!results.md"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                               universal_newlines=True).stdout
    except OSError:
        return None
    return (sha + ("-dirty" if dirty.strip() else "")) if sha else None


def prepare_kernel(env, opts: RunOptions, build=None, announce=print) -> str:
    """The Jupyter kernel ``env``'s rows run in: the interpreter as installed (--use-installed; nothing is made),
    or the environment's own, made or updated from its pins.  Raises EnvError with one line."""
    if env.name in opts.installed:
        python = opts.installed[env.name]
        return use_installed.kernel(env, opts.device, python, opts.installed_facts.get(env.name)
                                or use_installed.check_env(env, opts.device, [], python)[0])
    return framework_envs.ensure(env, opts.device, opts.pythons.get(env.name), announce=announce, build=build,
                       wheelhouse=opts.wheelhouse)


def mark_as_is(rec: dict, target: Target, opts: RunOptions) -> dict:
    """A record of a row that ran in an interpreter as installed: ``as_is`` and ``run.installed`` (its versions)."""
    env = target.env
    if env in opts.installed:
        rec["as_is"] = True
        rec.setdefault("run", {})["installed"] = use_installed.record_section(opts.installed[env],
                                                                          opts.installed_facts.get(env) or {
                                                                              "python": None, "packages": {}})
    return rec


def record_stem(target: Target, opts: RunOptions) -> str:
    p = opts.preset
    stem = "%s_%s_%s_bs%d" % (target.name, p.name, opts.precision, p.batch_size)
    if p.scale != get_preset(p.name).scale:
        stem += "_scale%d" % p.scale
    if opts.seed:                       # seed 0 keeps the names it always had; another seed is another record
        stem += "_seed%d" % opts.seed
    return stem + "_" + opts.device_slug


_expected_checksums = {}  # type: Dict[tuple, str]


def expected_checksum(preset: Preset, seed: int) -> str:
    key = (preset.batch_size, preset.scale, seed, preset.config.n_freq, preset.config.n_classes, preset.lengths)
    if key not in _expected_checksums:
        it = DeepMarkIterator(preset.batch_size, preset.scale, seed, n_freq=preset.config.n_freq,
                              n_classes=preset.config.n_classes, lengths=preset.lengths)
        _expected_checksums[key] = it.expected_checksum()
    return _expected_checksums[key]


def _base_fields(target: Target, opts: RunOptions) -> dict:
    return dict(framework=target.label.split(" (")[0], api=target.label, preset=opts.preset.name,
                row_of_record=target.row_of_record,
                batch_size=opts.preset.batch_size, scale=opts.preset.scale, seed=opts.seed,
                precision=opts.precision, config=opts.preset.config.to_dict(),
                device={"type": opts.device, "name": (opts.gpu or {}).get("name") if opts.device == "cuda"
                        else envinfo.cpu_model()})


def _run_info(target: Target, opts: RunOptions, started: str, notebook_out: Optional[str],
              decision: Optional[gpu_preflight.Decision] = None) -> dict:
    env = ENVS[target.env]
    build = decision.build if decision else None
    info = {"started": started, "finished": results.utc_now(), "command": opts.command,
            "git_commit": git_commit(), "notebook": "notebooks/" + target.notebook,
            "environment": os.path.relpath(env.requirements(opts.device, build), ROOT),   # the CPU or GPU build's pins
            "interpreter": opts.pythons.get(env.name),
            "executed_notebook": os.path.relpath(notebook_out, ROOT) if notebook_out else None,
            "runner_python": sys.version.split()[0]}
    if decision is not None:
        info["gpu_build"] = decision.record()      # which CUDA build, why (runner/envs/gpu_preflight.py)
    elif opts.device == "cuda" and target.env in opts.installed:
        info["gpu_build"] = {"env": env.name, "build": "as installed", "reason": "the interpreter's own build "
                             "(--use-installed): the notebook records the framework's CUDA version"}
    return info


def papermill_reason(exc: BaseException, timeout: Optional[float]) -> str:
    """One line that says why a notebook run failed."""
    name = type(exc).__name__
    if name == "PapermillExecutionError":
        return "%s: %s" % (exc.ename, results.one_line(str(exc.evalue)))
    if name == "DeadKernelError":
        return "the kernel died (killed for memory?; see its log in results/logs): %s" % results.one_line(str(exc))
    if name == "CellTimeoutError" or isinstance(exc, TimeoutError):
        return "a cell ran past the %s s timeout" % (timeout,)
    if name == "NoSuchKernel":
        return "Jupyter kernel not found: %s" % results.one_line(str(exc))
    return "%s: %s" % (name, results.one_line(str(exc)))


def run_papermill(notebook_in: str, notebook_out: str, parameters: dict, kernel: str, cwd: str, opts: RunOptions,
                  kernel_log: str) -> Optional[Exception]:
    """Execute ``notebook_in`` with papermill in ``kernel`` (its output to ``kernel_log``), within
    ``opts.timeout`` per cell; the error it raised, or None.  Signals are deferred while it runs (a signal stops
    the kernel, papermill saves what ran and raises), and no kernel is left running, whatever happened."""
    import papermill as pm
    with interrupt.deferred(), interrupt.temporary_folder("ds2-kernel-") as tmp:   # the kernel's (kernel_environment)
        try:
            pm.execute_notebook(notebook_in, notebook_out, parameters=parameters, kernel_name=kernel, cwd=cwd,
                                execution_timeout=opts.timeout, progress_bar=opts.progress, log_output=False,
                                report_mode=False, kernel_manager_class=kernel_manager_logging_to(kernel_log, tmp))
        except Exception as e:  # papermill/nbclient raise many kinds; each becomes a failed row
            return e
        finally:
            interrupt.reap_kernels()
    return None


def kernel_environment(tmp: str) -> Dict[str, str]:
    """The environment a notebook's kernel starts with: this process's, with ``tmp`` as its temporary folder
    (``TMPDIR``), so that what the kernel leaves there goes with the folder even when the kernel is stopped
    outright (TensorFlow's AutoGraph sources, a profiler's trace folder).  PyTorch Inductor's compile cache, whose
    default is in the temporary folder, stays where it is by default (``<TMPDIR>/torchinductor_<user>``): a rerun
    finds what the last one compiled."""
    env = dict(os.environ)
    if not env.get("TORCHINDUCTOR_CACHE_DIR"):
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "uid_%d" % os.getuid()
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(tempfile.gettempdir(),
                                                      "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    env["TMPDIR"] = tmp
    return env


def notebook_parameters(target: Target, opts: RunOptions, result_path: str) -> dict:
    """What papermill writes into the notebook's ``parameters`` cell.  ``profile``, ``init_weights`` and ``skip``
    (a list of parts) only when asked for, so a notebook without those parameters still runs."""
    params = dict(preset=opts.preset.name, batch_size=opts.preset.batch_size, scale=opts.preset.scale,
                  precision=opts.precision, seed=opts.seed, device=opts.device, result_path=result_path,
                  target=target.name, **target.parameters)
    if opts.profile:
        params["profile"] = True
    if getattr(opts, "init_weights", None):
        params["init_weights"] = opts.init_weights
    if getattr(opts, "skip", None):
        # --skip is refused for a notebook without the parameter (runner/validate.py); a learn preset's implicit
        # skip goes only where the notebook declares it (the others run every part, and their records say none
        # was skipped)
        names = validate.notebook_parameter_names(target.notebook_path)
        if names is None or "skip" in names:
            params["skip"] = list(opts.skip)
    return params


def _not_after_a_signal(record) -> bool:
    """papermill's logger (nbclient logs through it) complains that the kernel died when a signal stopped
    it on purpose: keep that off the terminal, whose one line then says what happened."""
    return interrupt.pending() is None


logging.getLogger("papermill").addFilter(_not_after_a_signal)


def kernel_manager_logging_to(log_path: str, tmp: str):
    """A Jupyter kernel manager whose kernel writes its own stdout and stderr (C++ logs of the
    frameworks, warnings printed before a cell runs) to ``log_path`` instead of this terminal, and
    which tells :mod:`runner.interrupt` about its kernel, so that Ctrl-C or SIGTERM stops it.  ``tmp``: the
    kernel's temporary folder (:func:`kernel_environment`), which also holds its connection file."""
    from jupyter_client.manager import AsyncKernelManager

    class LoggingKernelManager(AsyncKernelManager):
        async def start_kernel(self, **kw):
            log = open(log_path, "a")
            kw.setdefault("stdout", log)
            kw.setdefault("stderr", log)
            kw.setdefault("env", kernel_environment(tmp))
            if not self.connection_file:      # else a tmp*.json in the caller's temporary folder
                self.connection_file = os.path.join(tmp, "kernel-connection.json")
            try:
                result = await super().start_kernel(**kw)
            finally:
                log.close()             # the kernel process holds its own descriptor
            prov = self.provisioner
            pgid = getattr(prov, "pgid", None) or getattr(prov, "pid", None)
            if pgid:
                interrupt.track_kernel(id(self), pgid)
            return result

        async def shutdown_kernel(self, now=False, restart=False):
            try:
                return await super().shutdown_kernel(now=now, restart=restart)
            finally:
                interrupt.untrack_kernel(id(self))

    return LoggingKernelManager


def can_run(target: Target, opts: RunOptions):
    """(the GPU preflight's decision or None, status, reason): reason is None when ``target`` can run with
    ``opts`` here, else why not ("failed" for a missing notebook, "skipped" for what this machine cannot do)."""
    decision = None
    if opts.device == "cuda" and target.env not in opts.installed:    # an interpreter as installed brings its build
        decision = gpu_preflight.decide(target.env, opts.gpu, opts.gpu_builds.get(target.env))
    if not os.path.exists(target.notebook_path):
        return decision, "failed", "notebook %s does not exist" % os.path.relpath(target.notebook_path, ROOT)
    why = target.cpu_precision_reason(opts.precision) if opts.device == "cpu" else None
    if why:
        return decision, "skipped", why
    if decision is not None and not decision.runs:
        return decision, "skipped", decision.reason
    why = gpu_preflight.precision_reason(opts.precision, opts.gpu) if opts.device == "cuda" else None
    if why:
        return decision, "skipped", why
    if opts.device == "cuda" and opts.precision in target.unsupported_gpu_precisions:
        why = target.unsupported_gpu_precisions[opts.precision]
        return decision, "skipped", "precision %s: %s" % (opts.precision, why)
    return decision, None, None


def run_target(target: Target, opts: RunOptions, announce=print) -> dict:
    """Run ``target`` and write its record; returns the record.

    SIGINT/SIGTERM (:mod:`runner.interrupt`) stop it within seconds: the kernel is stopped, the executed
    part of the notebook is kept under its final name, the record says "interrupted" (or "terminated"),
    and :class:`~runner.interrupt.Interrupted` goes on to the caller.
    """
    started = results.utc_now()
    stem = record_stem(target, opts)
    records_dir = os.path.join(opts.results_dir, "records")
    notebooks_dir = os.path.join(opts.results_dir, "notebooks")
    staging_dir = os.path.join(opts.results_dir, ".staging")
    logs_dir = os.path.join(opts.results_dir, "logs")          # the kernels' own output (not committed)
    record_path = os.path.join(records_dir, stem + ".json")
    notebook_out = os.path.join(notebooks_dir, stem + ".ipynb")
    partial_nb = notebook_out[:-len(".ipynb")] + ".partial.ipynb"
    staged = os.path.join(staging_dir, stem + ".json")
    written = []                                               # the record, once it is on disk
    decision, status, reason = can_run(target, opts)           # the GPU preflight: build, driver, architecture

    def failed(status: str, reason: str, executed: Optional[str] = None) -> dict:
        rec = results.failed_record(target.name, status, reason, **_base_fields(target, opts))
        rec["environment"] = envinfo.collect()
        rec["run"] = _run_info(target, opts, started, executed, decision)
        return mark_as_is(rec, target, opts)

    def finish(status: str, reason: str, executed: Optional[str] = None) -> dict:
        return done(failed(status, reason, executed))

    def done(rec: dict) -> dict:
        with interrupt.deferred():     # a record is written whole, and then it stands
            results.write_record(record_path, mark_as_is(rec, target, opts))
            written.append(rec)
            if rec["status"] == "ok":
                t = rec.get("timing", {})
                announce("  ok: %.1f s of audio per second, first-loss check rel. diff %.1e"
                         % (t.get("audio_s_per_s", float("nan")),
                            rec["checks"].get("loss", {}).get("rel_diff", float("nan"))))
            else:
                announce("  %s: %s" % (rec["status"], rec["error"]))
        return rec

    try:
        for d in (records_dir, notebooks_dir, staging_dir, logs_dir):
            os.makedirs(d, exist_ok=True)
        staging.recover(opts.results_dir)          # the rows of a runner killed outright
        staging.claim(staging_dir, stem, failed)          # the record, should this runner be killed outright
        try:
            return _run(target, opts, announce, finish, done, staged, partial_nb, notebook_out,
                        os.path.join(logs_dir, stem + ".kernel.log"), started,
                        (decision, status, reason))
        finally:
            staging.release(staging_dir, stem)
    except interrupt.Interrupted as e:
        # the clean-up; a second signal ends the process at once (runner.interrupt)
        interrupt.reap_kernels()
        executed = staging.keep_executed(partial_nb, notebook_out)
        if not written:
            finish("failed", e.reason, executed)
        raise


def _run(target, opts, announce, finish, done, staged, partial_nb, notebook_out, kernel_log, started,
         verdict) -> dict:
    # 1. can it run here at all?  (run_target asked can_run: the GPU preflight, the notebook, the precision)
    decision, status, reason = verdict
    if reason:
        return finish(status, reason)
    # 2. its environment and kernel
    env = ENVS[target.env]
    if env.needs and env.name in opts.found:   # nobody asked for it: a missing system piece skips it
        reason = env.needs()
        if reason:
            return finish("skipped", "environment %s: %s" % (env.name, reason))
    try:
        kernel = prepare_kernel(env, opts, decision.build if decision else None, announce)
    except EnvError as e:
        missing = env.needs_python and env.name not in opts.pythons   # not given: skipped, not broken
        return finish("skipped" if missing else "failed", "environment %s: %s" % (env.name, e))
    # 3. the notebook: a signal stops its kernel, papermill saves what ran and returns with an error
    parameters = notebook_parameters(target, opts, staged)
    if os.path.exists(staged):
        os.remove(staged)
    if os.path.exists(kernel_log):
        os.remove(kernel_log)
    t0, since = time.time(), time.monotonic()
    error = run_papermill(target.notebook_path, partial_nb, parameters, kernel, os.path.dirname(target.notebook_path),
                          opts, kernel_log)
    # (an interruption is raised here, as the block ends)
    with interrupt.deferred():
        executed = staging.keep_executed(partial_nb, notebook_out)
        if error is not None:
            return finish("failed", papermill_reason(error, opts.timeout), executed)
        # 4. the notebook's record, checked and completed
        try:
            rec = results.read_record(staged)
        except (OSError, ValueError) as e:
            return finish("failed", "the notebook wrote no valid record: %s" % e, executed)
        os.remove(staged)
        expected = expected_checksum(opts.preset, opts.seed)
        got = rec.get("data", {}).get("checksum")
        rec.setdefault("checks", {})["checksum"] = {"checksum": got, "expected": expected, "ok": got == expected}
        if got != expected:
            rec["status"], rec["error"] = "failed", "data checksum %s differs from the runner's %s" % (got, expected)
        rec["row_of_record"] = target.row_of_record
        rec["run"] = dict(rec.get("run", {}), **_run_info(target, opts, started, executed, decision))
        rec["run"]["wall_s"] = time.time() - t0
        alongside = framework_envs.made_between(since, time.monotonic())
        if alongside:       # its timings shared the machine with these installs (runner/envs/framework_envs.py start_ahead)
            rec["run"]["environments_made_alongside"] = alongside
        return done(rec)
