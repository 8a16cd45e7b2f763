"""How environments are installed: uv where it serves (the package sources pip's configuration names, pip's choice
among them), pip otherwise; environments made ahead of the rows that need them, on background threads that no
signal leaves behind (runner/envs/bootstrap.py, runner/envs/framework_envs.py)."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from runner.envs import bootstrap
from runner.envs import framework_envs
from runner.base import EnvError
from runner.envs.definitions import ENVS
from tests.conftest import ROOT

MACHINE_PIP = {"index_url": "https://pypi.org/simple", "extra_index_urls": ["file:///opt/pypi/simple"],
               "find_links": ["/opt/wheels"], "no_index": False, "constraints": ["/etc/xdg/pip/constraints.txt"],
               "cert": "/etc/ssl/certs/ca-certificates.crt", "trusted_hosts": [], "pre": False, "only_binary": [],
               "no_binary": [], "timeout": 180.0, "proxy": None, "requirements": [], "editables": [],
               "client_cert": None, "prefer_binary": False}


def test_uv_reaches_the_sources_pip_is_configured_with_and_chooses_as_pip_does(monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("UV_HTTP_TIMEOUT", raising=False)
    args, env, why = bootstrap.uv_arguments(MACHINE_PIP)
    assert why == "" and args == ["--index-strategy", "unsafe-best-match", "--index-url", "https://pypi.org/simple",
                                  "--extra-index-url", "file:///opt/pypi/simple", "--find-links", "/opt/wheels",
                                  "--constraint", "/etc/xdg/pip/constraints.txt"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt", "UV_HTTP_TIMEOUT": "180"}
    args, _, _ = bootstrap.uv_arguments(dict(MACHINE_PIP, no_index=True, pre=True, trusted_hosts=["h"],
                                             only_binary=[":all:"]))
    assert "--no-index" in args and "--index-url" not in args
    assert args[-6:] == ["--allow-insecure-host", "h", "--prerelease", "allow", "--only-binary", ":all:"]
    # a setting uv would not follow the same way: pip makes the environment
    args, env, why = bootstrap.uv_arguments(dict(MACHINE_PIP, prefer_binary=True))
    assert args is None and "prefer_binary" in why


def test_pip_options_are_pips_own_reading_of_its_configuration(monkeypatch):
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_FIND_LINKS", "/nowhere/wheels")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///a/simple file:///b/simple")
    monkeypatch.setattr(bootstrap, "_pip_options_cache", {})
    options, why = bootstrap.pip_options()
    assert why == "" and options["find_links"] == ["/nowhere/wheels"]
    assert options["extra_index_urls"] == ["file:///a/simple", "file:///b/simple"] and not options["constraints"]


def test_the_installer_variable_and_what_makes_pip_install(monkeypatch):
    assert bootstrap.installer_problem({"DS2_INSTALLER": "conda"}) == \
        "DS2_INSTALLER=conda: expected uv or pip (unset: uv where it can serve, else pip)"
    assert bootstrap.installer_problem({"DS2_INSTALLER": "uv"}) is None and bootstrap.installer_problem({}) is None
    monkeypatch.delenv("DS2_INSTALLER", raising=False)
    assert bootstrap.uv_excluded(None) is None
    assert bootstrap.uv_excluded("/w") == "--wheelhouse (pip installs from it)"
    monkeypatch.setenv("DS2_INSTALLER", "pip")
    assert bootstrap.uv_excluded(None) == "DS2_INSTALLER=pip"
    assert bootstrap.uv_requirement() == "uv==" + [l.split("==")[1].strip() for l in
                                                   open(os.path.join(ROOT, "envs", "runner.txt"))
                                                   if l.startswith("uv==")][0]


def test_a_bad_installer_variable_is_one_line_before_anything_is_made():
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "run_all.py"), "--list"], cwd=ROOT,
                          env=dict(os.environ, DS2_INSTALLER="poetry"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "run_all.py: error: DS2_INSTALLER=poetry: expected uv or pip (unset: uv where it can serve, else pip)"]


def fake_installers(monkeypatch, uv_fails):
    calls = []

    def uv(path, *args, **kw):
        calls.append("uv")
        if uv_fails:
            raise EnvError("uv pip install -r envs/x.txt failed: no solution (log: x.log)")

    def pip(path, *args, **kw):
        calls.append("pip")
    monkeypatch.setattr(bootstrap, "_install_with_uv", uv)
    monkeypatch.setattr(bootstrap, "_install_with_pip", pip)
    monkeypatch.setattr(bootstrap, "pip_options", lambda python=None: (dict(MACHINE_PIP), ""))
    return calls


def test_uv_that_fails_is_followed_by_pip_unless_uv_is_asked_for(tmp_path, monkeypatch):
    monkeypatch.delenv("DS2_INSTALLER", raising=False)
    said = []
    calls = fake_installers(monkeypatch, uv_fails=True)
    log = str(tmp_path / "e.log")
    got = bootstrap.create_venv(str(tmp_path / "e"), "req.txt", sys.executable, {"s": 1}, log, uv="/bin/true",
                                progress=said.append)
    assert got == "pip" and calls == ["uv", "pip"] and bootstrap.read_stamp(str(tmp_path / "e")) == {"s": 1}
    assert said == ["uv failed; pip installs instead (log: %s)" % log]
    assert "# pip installs this environment: uv failed: uv pip install -r envs/x.txt failed" in open(log).read()
    monkeypatch.setenv("DS2_INSTALLER", "uv")
    with pytest.raises(EnvError, match="no solution"):
        bootstrap.create_venv(str(tmp_path / "f"), "req.txt", sys.executable, {"s": 1}, log, uv="/bin/true")
    assert bootstrap.read_stamp(str(tmp_path / "f")) == {}
    # no uv at all: pip, and nothing failed; with DS2_INSTALLER=uv that is an error naming why
    monkeypatch.setattr(bootstrap, "uv_executable", lambda: None)
    with pytest.raises(EnvError, match="DS2_INSTALLER=uv, but uv cannot make .*: no uv beside"):
        bootstrap.create_venv(str(tmp_path / "g"), "req.txt", sys.executable, {"s": 1}, log)
    monkeypatch.delenv("DS2_INSTALLER")
    calls[:] = []
    assert bootstrap.create_venv(str(tmp_path / "g"), "req.txt", sys.executable, {"s": 1}, log) == "pip"
    assert calls == ["pip"]
    # a wheelhouse: pip, uv not tried
    calls[:] = []
    monkeypatch.setattr(bootstrap, "uv_executable", lambda: "/bin/true")
    bootstrap.create_venv(str(tmp_path / "h"), "req.txt", sys.executable, {"s": 1}, log, wheelhouse=str(tmp_path))
    assert calls == ["pip"]


@pytest.mark.skipif(not bootstrap.uv_executable(), reason="no uv beside this interpreter (envs/runner.txt has it)")
def test_uv_makes_an_environment_that_starts_as_venvs_and_upgrades_pip(tmp_path, monkeypatch):
    """A small real environment (tabulate, from the configured sources): pip and the setuptools ``python -m venv``
    puts there, as pip's route makes them; the log names each uv command."""
    monkeypatch.delenv("DS2_INSTALLER", raising=False)
    req = tmp_path / "req.txt"
    req.write_text("tabulate==0.10.0\n")
    path, log, said = str(tmp_path / "env"), str(tmp_path / "env.log"), []
    base = getattr(sys, "_base_executable", None) or sys.executable
    assert bootstrap.create_venv(path, str(req), base, {"s": 1}, log, progress=said.append) == "uv"
    assert said == ["uv installs 2 packages"] or said == ["uv installs 3 packages"], said   # tabulate, pip (setuptools)
    freeze = subprocess.run([bootstrap.env_python(path), "-m", "pip", "freeze", "--all"], stdout=subprocess.PIPE,
                            universal_newlines=True).stdout.split()
    assert "tabulate==0.10.0" in freeze and any(l.startswith("pip==") for l in freeze)
    seed = bootstrap.bundled_seed(base)
    if seed:
        assert "setuptools==%s" % os.path.basename(seed[0]).split("-")[1] in freeze
    text = open(log).read()
    assert "--index-strategy unsafe-best-match" in text and "-r %s" % req in text
    assert has_bytecode(path, "tabulate")


def has_bytecode(env_path, module):
    """Whether ``module``'s bytecode was compiled at install, as pip's route does (a process that may not write
    bytecode would compile the module again at every import)."""
    return subprocess.run([bootstrap.env_python(env_path), "-c", "import importlib.util as u, os, %s as m; "
                           "print(os.path.exists(u.cache_from_source(m.__file__)))" % module],
                          stdout=subprocess.PIPE, universal_newlines=True,
                          env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1")).stdout.strip() == "True"


def test_uv_makes_cntks_python_36_environment_with_its_bytecode(tmp_path, monkeypatch):
    """uv's --compile-bytecode needs Python 3.7's py_compile; on CNTK's Python 3.6 the environment compiles itself.
    The interpreter is the one the runner finds (DS2_CNTK_PYTHON, else its search)."""
    from runner.envs import cntk_python
    python36 = cntk_python.discover().path
    if not python36:
        pytest.skip("no CNTK interpreter: DS2_CNTK_PYTHON is unset and the runner's search found none")
    monkeypatch.setenv("DS2_INSTALLER", "uv")
    req = tmp_path / "req.txt"
    req.write_text("six==1.16.0\n")
    path, log = str(tmp_path / "env36"), str(tmp_path / "env36.log")
    assert bootstrap.create_venv(path, str(req), python36, {"s": 1}, log, pip="pip==21.3.1") == "uv"
    assert has_bytecode(path, "six"), open(log).read()[-2000:]
    assert "compileall.compile_dir" in open(log).read()


# ---- environments made ahead ------------------------------------------------------------------------------------
def fake_environments(monkeypatch, tmp_path, make):
    """start_ahead on fakes: every environment is missing, and ``make(env)`` stands for making it."""
    monkeypatch.setattr(framework_envs, "_stamp", lambda env, device, python, build: (
        "python", "req", str(tmp_path / env.name), "3.11.7", {"s": 1}))

    def ensure(env, device, python, announce, build, wheelhouse, progress=None, creating=None):
        announce(creating("Python 3.11.7, envs/%s-cpu.txt, uv" % env.name, str(tmp_path / "x.log")))
        progress("uv installs 7 packages")
        return make(env)
    monkeypatch.setattr(framework_envs, "_ensure", ensure)


def jobs(*names):
    return [(ENVS[n], "cpu", None, None, None) for n in names]


def test_environments_made_ahead_are_waited_for_and_a_failed_one_fails_its_rows_only(tmp_path, monkeypatch):
    def make(env):
        time.sleep(0.3)
        if env.name == "mxnet":
            raise EnvError("pip install -r envs/mxnet-cpu.txt failed: no numpy")
        return "ds2-%s-cpu" % env.name
    fake_environments(monkeypatch, tmp_path, make)
    printed = []
    try:
        t0 = time.monotonic()
        assert framework_envs.start_ahead(jobs("pytorch", "mxnet", "pytorch", "jax"), workers=2) == 3   # repeats once
        assert framework_envs.ensure(ENVS["pytorch"], "cpu", announce=printed.append) == "ds2-pytorch-cpu"
        with pytest.raises(EnvError, match="no numpy"):
            framework_envs.ensure(ENVS["mxnet"], "cpu", announce=printed.append)
        with pytest.raises(EnvError, match="no numpy"):       # its second row: the same reason, not made again
            framework_envs.ensure(ENVS["mxnet"], "cpu", announce=printed.append)
        assert framework_envs.ensure(ENVS["jax"], "cpu", announce=printed.append) == "ds2-jax-cpu"
        assert sorted(framework_envs.made_between(t0, time.monotonic())) == ["jax-cpu", "mxnet-cpu", "pytorch-cpu"]
        assert framework_envs.made_between(time.monotonic(), time.monotonic() + 1) == []
    finally:
        framework_envs.stop_ahead()
    text = "\n".join(printed)
    assert "environment 1/3: pytorch-cpu: being made (Python 3.11.7, envs/pytorch-cpu.txt, uv); log: " in text
    assert "environment 2/3: mxnet-cpu: failed: pip install -r envs/mxnet-cpu.txt failed: no numpy" in text
    assert "environment 3/3: jax-cpu: installing 7 packages" in text and "environment 3/3: jax-cpu: ready in" in text
    assert not framework_envs._ahead and not framework_envs._threads


def test_quiet_environments_made_ahead_say_only_what_is_made_and_what_failed(tmp_path, monkeypatch):
    fake_environments(monkeypatch, tmp_path, lambda env: "k")
    printed = []
    try:
        framework_envs.start_ahead(jobs("pytorch"), verbose=False)
        framework_envs.ensure(ENVS["pytorch"], "cpu", announce=printed.append)
    finally:
        framework_envs.stop_ahead()
    assert len(printed) == 1 and printed[0].startswith("environment 1/1: pytorch-cpu: being made ("), printed


def sleeper(tmp_path):
    """A stand-in install command: writes its pid, then sleeps a minute."""
    def make(env):
        bootstrap.run_logged(["sh", "-c", "echo $$ > %s/%s.pid; exec sleep 60" % (tmp_path, env.name)],
                             str(tmp_path / "install.log"), "installing %s" % env.name)
        return "k"
    return make


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split()[2] != "Z"
    except OSError:
        return False


def wait_for_pids(tmp_path, names, seconds=30):
    deadline = time.time() + seconds
    while time.time() < deadline:
        pids = [tmp_path / ("%s.pid" % n) for n in names]
        if all(p.exists() and p.read_text().strip() for p in pids):
            return [int(p.read_text()) for p in pids]
        time.sleep(0.05)
    pytest.fail("the stand-in installs did not start")


def test_stopping_ends_every_install_command_still_running(tmp_path, monkeypatch):
    fake_environments(monkeypatch, tmp_path, sleeper(tmp_path))
    framework_envs.start_ahead(jobs("pytorch", "jax"), workers=2)
    try:
        pids = wait_for_pids(tmp_path, ["pytorch", "jax"])
    finally:
        t0 = time.time()
        framework_envs.stop_ahead()
    assert time.time() - t0 < 10
    assert not [p for p in pids if pid_alive(p)]
    assert not framework_envs._ahead and not framework_envs._threads and not bootstrap._children


def test_a_command_started_while_the_run_stops_is_ended_too(tmp_path, monkeypatch):
    """stop_children lists the commands running when it is called; one whose process had started but was not yet
    listed (another thread between Popen and the list: on a slow machine the stop then waited 30 s for it) ends
    at once, by the thread that started it."""
    real = subprocess.Popen

    def popen_then_stop(*args, **kwargs):
        proc = real(*args, **kwargs)
        bootstrap.stop_children(wait_s=0)         # the stop comes before the command is listed
        return proc
    monkeypatch.setattr(bootstrap.subprocess, "Popen", popen_then_stop)
    t0 = time.time()
    try:
        with pytest.raises(EnvError, match="^installing: stopped, the run is stopping$"):
            bootstrap.run_logged(["sleep", "60"], str(tmp_path / "install.log"), "installing")
    finally:
        bootstrap.allow_children()
    assert time.time() - t0 < 10 and not bootstrap._children


DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, %(root)r)
    from runner import cli
    from runner.envs import bootstrap, framework_envs

    def create_venv(path, requirements, base, stamp, log, pip="pip", wheelhouse=None, progress=None):
        bootstrap.run_logged(["sh", "-c", "echo $$ > %(tmp)s/$(basename %%s).pid; exec sleep 60" %% path], log, "x")
    framework_envs.create_venv = create_venv
    framework_envs.AHEAD_WORKERS = 2
    sys.exit(cli.main(["--setup-only", "--device", "cpu", "--frameworks", "pytorch,mxnet,jax"]))
""")


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_environments_are_made_ahead_leaves_no_install_behind(tmp_path, sig, status):
    """run_all.py --setup-only makes three environments (stand-in installs of a minute), here two at a time: SIGTERM to
    the runner alone, or Ctrl-C to the terminal's process group, ends it within seconds, its installs too."""
    env = dict(os.environ, DS2_ENVS_DIR=str(tmp_path / "venvs"))
    proc = subprocess.Popen([sys.executable, "-c", DRIVER % {"root": ROOT, "tmp": tmp_path}], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                            start_new_session=True)
    seen = []

    def read_until_made():              # the main thread prints what the threads said (every 0.2 s)
        for line in proc.stdout:
            seen.append(line)
            if "environment 1/3: pytorch-cpu: being made" in line:
                return
    try:
        pids = wait_for_pids(tmp_path, ["pytorch-cpu", "mxnet-cpu"], seconds=120)
        reader = threading.Thread(target=read_until_made, daemon=True)
        reader.start()
        reader.join(60)                 # not a sleep: a loaded machine may print it later
        assert not reader.is_alive(), "run_all.py never said the first environment is being made: %r" % seen
    except BaseException:
        proc.kill()
        raise
    t0 = time.time()
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    out = "".join(seen) + out
    assert proc.returncode == status, (out, err)
    assert time.time() - t0 < 15
    assert err.strip().splitlines() == ["run_all.py: %s (%s)" % ("terminated" if sig == signal.SIGTERM else
                                                                 "interrupted", signal.Signals(sig).name)], err
    assert "environment 1/3: pytorch-cpu: being made" in out
    assert not [p for p in pids if pid_alive(p)]
    assert not (tmp_path / "jax-cpu.pid").exists()           # the third was never started
    assert not [n for n in os.listdir(str(tmp_path / "venvs")) if os.path.exists(
        os.path.join(str(tmp_path / "venvs"), n, bootstrap.STAMP))]


# ---- one environment, two processes -------------------------------------------------------------------------------
LOCK_DRIVER = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, %(root)r)
    from runner.envs import bootstrap, framework_envs
    from runner.envs.definitions import ENVS

    def create_venv(path, requirements, base, stamp, log, pip="pip", wheelhouse=None, progress=None):
        with open(%(events)r, "a") as f:
            f.write("start %%d\\n" %% os.getpid())
        deadline = time.time() + 60
        while not os.path.exists(%(go)r) and time.time() < deadline:
            time.sleep(0.05)
        os.makedirs(os.path.join(path, "bin"))
        open(os.path.join(path, "pyvenv.cfg"), "w").close()
        os.symlink(sys.executable, bootstrap.env_python(path))
        bootstrap.write_stamp(path, stamp)
        with open(%(events)r, "a") as f:
            f.write("end %%d\\n" %% os.getpid())
    framework_envs.create_venv = create_venv
    framework_envs.register_kernel = lambda *args: None
    print(framework_envs.ensure(ENVS["pytorch"], "cpu"))
""")


def test_a_second_process_waits_for_the_environment_the_first_is_making_and_does_not_make_it_again(tmp_path):
    """Two run_all.py in one checkout that need the same environment: the second waits for the first (a lock per
    environment) and finds it made. Made a second time, it was removed under the first one's installer, whose
    `uv pip install --python .venvs/<env>/bin/python` then installed into the base interpreter."""
    events, go = tmp_path / "events", tmp_path / "go"
    env = dict(os.environ, DS2_ENVS_DIR=str(tmp_path / "venvs"), PYTHONUNBUFFERED="1")
    code = LOCK_DRIVER % {"root": ROOT, "events": str(events), "go": str(go)}
    first = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, universal_newlines=True)
    procs = [first]
    try:
        deadline = time.time() + 60
        while not (events.exists() and events.read_text()) and time.time() < deadline:
            time.sleep(0.05)
        assert events.read_text().split()[0] == "start"          # the first is making it, and holds the lock
        second = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, universal_newlines=True)
        procs.append(second)
        waiting = second.stdout.readline()
        assert waiting.startswith("waiting for another process that is making %s"
                                  % (tmp_path / "venvs" / "pytorch-cpu")), waiting
        go.write_text("")
        outs = [p.communicate(timeout=60) for p in procs]
    finally:
        go.write_text("")
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0].splitlines()[-1] == outs[1][0].splitlines()[-1] == "ds2-pytorch-cpu", outs
    assert [line.split()[0] for line in events.read_text().splitlines()] == ["start", "end"]   # made once
    assert "Creating environment" not in waiting + outs[1][0]


def test_nothing_is_installed_into_a_directory_that_is_no_longer_a_virtual_environment(tmp_path):
    """Its bin/python still there, its pyvenv.cfg gone: that python is the base interpreter, so installing is
    refused with one line, before uv runs."""
    path = tmp_path / "env"
    (path / "bin").mkdir(parents=True)
    os.symlink(sys.executable, bootstrap.env_python(str(path)))
    with pytest.raises(EnvError, match=r"env is not a virtual environment \(no pyvenv.cfg: removed while it was "
                                       r"being made\?\); nothing was installed"):
        bootstrap._install_with_uv(str(path), "req.txt", sys.executable, str(tmp_path / "log"), "pip", "/bin/false",
                                   [], {}, lambda message: None, fresh=False)
    assert not (tmp_path / "log").exists()


@pytest.mark.skipif(not bootstrap.uv_executable(), reason="no uv beside this interpreter (envs/runner.txt has it)")
def test_uv_installs_into_a_venv_made_again_where_uv_once_saw_the_base_interpreter(tmp_path, monkeypatch):
    """uv caches which environment an interpreter path is. Asked once while the path was no venv (its pyvenv.cfg
    gone, so bin/python is the base interpreter), it took the venv made again there for the base interpreter and
    installed into that. Every uv command of ours asks afresh. Run with uv's --dry-run: a regression cannot touch
    the base interpreter."""
    uv, base = bootstrap.uv_executable(), getattr(sys, "_base_executable", None) or sys.executable
    seed = bootstrap.bundled_seed(base)
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    path = tmp_path / "env"
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True)
    (path / "pyvenv.cfg").unlink()
    probe = subprocess.run([uv, "pip", "install", "--dry-run", "--no-config", "--python", bootstrap.env_python(str(path)),
                            "--no-index", "--no-deps", "--find-links", str(tmp_path), "nothing-to-find"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True).stdout
    base_prefix = subprocess.run([base, "-c", "import sys; print(sys.prefix)"], stdout=subprocess.PIPE,
                                 universal_newlines=True).stdout.strip()
    assert "environment at: %s" % base_prefix in probe, probe        # uv has now seen the base interpreter there
    subprocess.run(["rm", "-rf", str(path)], check=True)
    real = bootstrap.run_logged

    def dry(argv, *args, **kw):             # every uv install a dry run
        if argv[:3] == [uv, "pip", "install"]:
            argv = argv[:3] + ["--dry-run"] + argv[3:]
        return real(argv, *args, **kw)
    monkeypatch.setattr(bootstrap, "run_logged", dry)
    req, log = tmp_path / "req.txt", tmp_path / "env.log"
    req.write_text("")
    bundled = os.path.join(os.path.dirname(os.__file__), "ensurepip", "_bundled")       # pip's wheel, no index
    bootstrap._install_with_uv(str(path), str(req), base, str(log), "pip", uv, ["--no-index", "--find-links", bundled],
                               {}, lambda message: None)
    used = [line for line in log.read_text().splitlines() if "environment at:" in line]
    assert len(used) == (2 if seed else 1), log.read_text()
    assert not [line for line in used if line.endswith(base_prefix)], log.read_text()


def test_where_the_filesystem_has_no_locks_the_environment_is_made_unlocked(tmp_path, monkeypatch):
    import errno
    import fcntl

    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", no_locks)
    entered = []
    with bootstrap.env_lock(str(tmp_path / "venvs" / "pytorch-cpu"), announce=entered.append):
        entered.append("made")
    assert entered == ["made"]


def test_registering_a_kernel_leaves_nothing_in_the_temporary_folder(tmp_path, monkeypatch):
    """ipykernel's install stages the kernel spec in a tempfile.mkdtemp() folder and leaves that folder behind: the
    registration gives it a temporary folder of its own, removed afterwards."""
    python = os.path.join(ROOT, ".venvs", "pytorch-cpu", "bin", "python")
    if not os.path.exists(python):
        pytest.fail("no PyTorch CPU environment at %s: make it with `python run_all.py --setup-only --frameworks "
                    "pytorch`" % python)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(framework_envs, "kernels_prefix", lambda: str(tmp_path / "prefix"))
    framework_envs.register_kernel(ENVS["pytorch"], os.path.join(ROOT, ".venvs", "pytorch-cpu"), "ds2-test-kernel",
                                   "3.11", str(tmp_path / "log"))
    spec = tmp_path / "prefix" / "share" / "jupyter" / "kernels" / "ds2-test-kernel" / "kernel.json"
    assert spec.exists() and '"PYTHONNOUSERSITE": "1"' in spec.read_text()
    assert os.listdir(str(tmp)) == []
