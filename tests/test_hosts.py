"""Data-parallel training across machines (``run_all.py --workers W --hosts HOSTFILE``, runner/dp/hosts.py,
runner/dp/host_agent.py), on hosts simulated on this machine by ``tools/simulate_hosts.sh``: network namespaces with
their own interface, address, hostname and sshd.  Those tests need root, iproute2 and OpenSSH's server, and are
skipped with that reason without them; the hostfile, the per-launcher commands and the agent are tested
without.

On 2 simulated hosts (1 process each, batch 4): PyTorch (torchrun, c10d rendezvous) and JAX
(``jax.distributed``) train like one process with batch 8, to the one-host tests' tolerance (default tier;
TensorFlow and Keras on JAX under ``--full``); a host that never joins ends the run within ``--join-timeout``
with one line naming it; a rank killed on host 1 mid-epoch, and Ctrl-C on the launching host, leave no process
in either host's process table and no half-written record."""
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from common import results
from common.spec import get_preset
from runner.dp import launch
from runner.run import execute
from runner.dp import hosts
from runner.dp import launchers
from runner.dp import supervisor
from runner.run.targets import Target
from tests.conftest import ROOT, RunAll, assert_trains_like, run_all, selected_targets, two_worker_record

FIXTURE = "../tests/fixtures/dp_fixture.ipynb"
SIM = os.path.join(ROOT, "tools", "simulate_hosts.sh")
SIM_DIR = "/run/ds2-hosts-tests"


# ---- without hosts: the hostfile, the commands, the agent --------------------------------------------------
def test_hostfile_lines_comments_and_slots(tmp_path):
    path = tmp_path / "hosts"
    path.write_text("# the cluster\nnode-a:2\n\n10.0.0.7   # a comment\n")
    got = [(h.name, h.slots) for h in hosts.parse_hostfile(str(path))]
    assert got == [("node-a", 2), ("10.0.0.7", 1)]
    assert hosts.check_workers(hosts.parse_hostfile(str(path)), 3) is None
    assert "slots add up to 3" in hosts.check_workers(hosts.parse_hostfile(str(path)), 2)


@pytest.mark.parametrize("text, message", [
    ("a\na\n", "listed twice"), ("a:0\nb\n", "expected host[:slots]"), ("a b\nc\n", "expected host[:slots]"),
    ("only\n", "needs 2 or more"), ("", "0 host(s)")])
def test_a_bad_hostfile_is_one_line(tmp_path, text, message):
    path = tmp_path / "hosts"
    path.write_text(text)
    with pytest.raises(hosts.HostsError) as e:
        hosts.parse_hostfile(str(path))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_each_launcher_starts_its_own_multi_node_form():
    two = [hosts.Host("h0", 1), hosts.Host("h1", 1)]
    worker = ["dp_worker.py", "script.py"]
    torch = hosts.host_processes(launchers.LAUNCHERS["torchrun"], two, "/env/bin/python", worker, {}, [29500],
                                 "job", 30)
    for i, name in enumerate(("h0", "h1")):
        (p,) = torch[name]
        argv = " ".join(p["argv"])
        assert argv.startswith("/env/bin/torchrun --nnodes 2 --node_rank %d --nproc_per_node 1 " % i)
        assert "--rdzv_backend c10d --rdzv_endpoint h0:29500 --rdzv_id job" in argv
        assert "--rdzv_conf join_timeout=30,is_host=%d --local-addr %s" % (int(i == 0), name) in argv
        assert p["env"]["DS2_HOST"] == name and argv.endswith("dp_worker.py script.py")
    jax = hosts.host_processes(launchers.LAUNCHERS["jax"], two, "py", worker, {}, [1234], "job", 30)
    assert [p["env"]["DS2_PROCESS_ID"] for n in ("h0", "h1") for p in jax[n]] == ["0", "1"]
    assert {p["env"]["DS2_COORDINATOR"] for n in ("h0", "h1") for p in jax[n]} == {"h0:1234"}
    tf = hosts.host_processes(launchers.LAUNCHERS["tf_config"], two, "py", worker, {}, [11, 12], "job", 30)
    config = json.loads(tf["h1"][0]["env"]["TF_CONFIG"])
    assert config == {"cluster": {"worker": ["h0:11", "h1:12"]}, "task": {"type": "worker", "index": 1}}
    ps = hosts.host_processes(launchers.LAUNCHERS["mxnet_dist_sync"], two, "py", worker, {}, [99], "job", 30)
    assert [p["env"]["DMLC_ROLE"] for p in ps["h0"]] == ["worker", "scheduler", "server"]
    assert ps["h1"][0]["env"]["DMLC_PS_ROOT_URI"] == "h0" and ps["h1"][0]["env"]["DMLC_NODE_HOST"] == "h1"
    with pytest.raises(hosts.HostsError, match="same number of processes"):
        hosts.host_processes(launchers.LAUNCHERS["torchrun"], [hosts.Host("a", 2), hosts.Host("b", 1)], "py",
                             worker, {}, [1], "job", 30)


def test_host_options_without_hosts_or_with_the_wrong_worker_count_are_one_line(tmp_path):
    out = run_all(["--frameworks", "pytorch", "--workers", "2", "--print-host-commands"], tmp_path)
    assert out.returncode == 2 and "go with --hosts HOSTFILE" in out.output
    (tmp_path / "hosts").write_text("a:2\nb:2\n")
    out = run_all(["--frameworks", "pytorch", "--workers", "2", "--hosts", str(tmp_path / "hosts")], tmp_path)
    assert out.returncode == 2 and "slots add up to 4" in out.output and len(out.output.strip().splitlines()) == 1


def test_uneven_slots_are_refused_up_front_for_torchrun_rows_only(tmp_path):
    """torchrun starts the same number of processes on every host: a hostfile with node1:2, node2:1 is one line
    before anything for PyTorch (and Keras on PyTorch), and fine for the launchers that start one process per slot."""
    from runner import cli_checks
    from runner.run.targets import ALL_TARGETS
    path = tmp_path / "hosts"
    path.write_text("node1:2\nnode2:1\n")
    uneven = hosts.parse_hostfile(str(path))
    for target in ("pytorch", "keras-torch"):
        line = cli_checks.hosts_error(uneven, 3, cli_checks._launchers([ALL_TARGETS[target]], "sync"), str(path))
        assert "node1:2, node2:1: torchrun, the launcher of %s" % target in line and "\n" not in line
    for target in ("jax", "tensorflow", "cntk"):
        assert cli_checks.hosts_error(uneven, 3, cli_checks._launchers([ALL_TARGETS[target]], "sync"), str(path)) is None
    assert "slots add up to 3" in cli_checks.hosts_error(uneven, 2, {}, str(path))


def test_print_host_commands_prints_each_hosts_lines_and_runs_nothing(tmp_path):
    (tmp_path / "hosts").write_text("node0\nnode1\n")
    out = run_all(["--preset", "smoke", "--device", "cpu", "--frameworks", "jax", "--workers", "2", "--batch-size",
                   "4", "--hosts", str(tmp_path / "hosts"), "--print-host-commands"], tmp_path)
    assert out.returncode == 0, out.output
    lines = [l.split("\t", 1) for l in out.output.splitlines() if "\t" in l]
    assert [host for host, _ in lines] == ["node0", "node1"]
    assert all("DS2_COORDINATOR=node0:" in cmd and "runner/dp/worker.py" in cmd for _, cmd in lines)
    assert not os.path.isdir(tmp_path / "records") or not os.listdir(tmp_path / "records")


def _agent(spec_processes, marker):
    spec = base64.b64encode(json.dumps({"marker": marker, "grace": 2, "route_to": None,
                                        "processes": spec_processes}).encode()).decode()
    return subprocess.Popen([sys.executable, hosts.AGENT, spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def test_the_agent_stops_every_process_of_its_host_when_the_connection_closes(tag):
    # a child that starts a grandchild in a session of its own (as torchrun does with its workers)
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
            "start_new_session=True); time.sleep(300)")
    agent = _agent([{"argv": [sys.executable, "-c", code], "env": {}}], "agent-" + tag)
    deadline = time.time() + 30
    while len(supervisor.marked_processes("agent-" + tag, name=hosts.AGENT_MARKER)) < 2:
        assert time.time() < deadline and agent.poll() is None
        time.sleep(0.1)
    agent.stdin.close()                     # what the runner does at the end, and what its death does
    assert agent.wait(timeout=30) == 143
    assert supervisor.marked_processes("agent-" + tag, name=hosts.AGENT_MARKER) == []
    agent.stdout.close()


def test_the_agent_exits_with_its_processes_status():
    ok = _agent([{"argv": [sys.executable, "-c", "pass"], "env": {}}] * 2, "m1")
    assert ok.wait(timeout=30) == 0
    bad = _agent([{"argv": [sys.executable, "-c", "import sys; sys.exit(3)"], "env": {}},
                  {"argv": [sys.executable, "-c", "import time; time.sleep(300)"], "env": {}}], "m2")
    assert bad.wait(timeout=30) == 3        # the first failure; the other process was stopped
    for p in (ok, bad):
        p.stdin.close()
        p.stdout.close()


def test_the_agents_processes_get_a_temporary_folder_it_removes_when_they_end(tmp_path):
    """Each host's processes share a temporary folder of the agent's, under the host's TMPDIR, removed with what they
    left there (torchrun's `torchelastic_*` logs were left in /tmp by every run on several hosts)."""
    code = "import tempfile; print(tempfile.mkdtemp(prefix='left-'))"
    for argv_code, status in ((code, 0), (code + "; raise SystemExit(3)", 3)):
        spec = base64.b64encode(json.dumps({"marker": "m3", "grace": 2, "route_to": None, "processes": [
            {"argv": [sys.executable, "-c", argv_code], "env": {}}]}).encode()).decode()
        agent = subprocess.Popen([sys.executable, hosts.AGENT, spec], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 universal_newlines=True, env=dict(os.environ, TMPDIR=str(tmp_path)))
        out = agent.stdout.read()                           # until the agent ends (its input open: the connection)
        assert agent.wait(timeout=60) == status, out
        agent.stdin.close()
        agent.stdout.close()
        left = out.split()[-1]                              # the process's folder, in the agent's, in TMPDIR
        assert os.path.basename(left).startswith("left-") and os.path.dirname(os.path.dirname(left)) == str(tmp_path)
        assert os.path.basename(os.path.dirname(left)).startswith("ds2-dp-")
        assert os.listdir(str(tmp_path)) == []


def test_a_preflight_that_never_answers_ends_at_the_join_timeout_with_what_ssh_started(tmp_path, monkeypatch):
    """An ssh that hangs and has started a child holding its output (a ProxyCommand to a silent host): the preflight
    gives up at the join timeout and stops the child too, instead of reading its output until the child ends."""
    fake = tmp_path / "ssh"
    fake.write_text("#!/bin/sh\nsleep 607\n")                # the child holds stdout; ssh itself waits for it
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:%s" % (tmp_path, os.environ["PATH"]))
    t0 = time.time()
    with pytest.raises(hosts.HostsError, match=r"^host ds2-silent did not join within 1 s \(--join-timeout\): no "
                                               r"answer over ssh$"):
        hosts.preflight([hosts.Host("ds2-silent", 1)], [], sys.executable, [ROOT], timeout=1)
    assert time.time() - t0 < 1 + 5 + 5                       # the timeout, then 2 s at most to stop reading
    left = subprocess.run(["pgrep", "-f", "sleep 607"], stdout=subprocess.PIPE, universal_newlines=True).stdout
    assert left == "", "the hung ssh's child survived: %s" % left


def test_join_and_failure_reasons_name_the_host():
    two = [hosts.Host("h0", 1), hosts.Host("h1", 1)]
    assert hosts.not_joined(two, {0: {"ds2_host": "h0"}}) == ["h1"]
    reason = supervisor.host_failure_reason(two, 2, {0: {"ds2_host": "h0", "status": "running"}}, "/nonexistent",
                                             [None, None], None, None, ["h1"], 20)
    assert reason.startswith("host h1 did not join within 20 s (--join-timeout)")
    reason = supervisor.host_failure_reason(two, 2, {1: {"ds2_host": "h1", "status": "failed", "error": "E: x"}},
                                             "/nonexistent", [None, 1], (1, 1), None, None, 20)
    assert reason == "rank 1 (host h1) failed: E: x"


# ---- simulated hosts --------------------------------------------------------------------------------------
def _why_no_simulated_hosts():
    if os.geteuid() != 0:
        return "simulated hosts need root (network namespaces, an sshd per host)"
    if not shutil.which("ip"):
        return "simulated hosts need iproute2 (ip)"
    if not (shutil.which("sshd") or os.path.exists("/usr/sbin/sshd")):
        return "simulated hosts need OpenSSH's server (apt-get install openssh-server)"
    return None


def namespace_pids():
    out = {}
    for ns in ("ds2h0", "ds2h1"):
        text = subprocess.run(["ip", "netns", "pids", ns], stdout=subprocess.PIPE, universal_newlines=True).stdout
        out[ns] = sorted(int(p) for p in text.split())
    return out


def run_processes(pids):
    """Those of ``pids`` that are not an sshd (the hosts' own daemons and their connections)."""
    out = []
    for pid in pids:
        try:
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read().split(b"\0")[0]
        except OSError:
            continue
        if not cmd.endswith(b"sshd") and b"sshd:" not in cmd:
            out.append((pid, cmd))
    return out


def assert_no_process_left(deadline_s=15):
    deadline = time.time() + deadline_s
    while True:
        left = {ns: run_processes(p) for ns, p in namespace_pids().items()}
        if not any(left.values()):
            return
        assert time.time() < deadline, "processes left on the simulated hosts: %s" % left
        time.sleep(0.2)


def assert_only_whole_records(results_dir):
    for root, _, files in os.walk(str(results_dir)):
        for name in files:
            assert ".partial" not in name, os.path.join(root, name)
            if name.endswith(".json") and os.path.basename(root) == "records":
                results.read_record(os.path.join(root, name))        # parses: written whole


@pytest.fixture(scope="module")
def sim_hosts():
    """``tools/simulate_hosts.sh up 2`` for this module; ``down`` after it, which leaves no namespace."""
    why = _why_no_simulated_hosts()
    if why:
        pytest.skip(why)
    env = dict(os.environ, DS2_SIM_DIR=SIM_DIR)
    subprocess.run([SIM, "up", "2"], env=env, check=True, stdout=subprocess.PIPE)
    try:
        yield {"hostfile": os.path.join(SIM_DIR, "hostfile"), "ssh": "-F %s/ssh_config" % SIM_DIR,
               "ssh_options": ["-F", "%s/ssh_config" % SIM_DIR]}
    finally:
        subprocess.run([SIM, "down"], env=env, check=True, stdout=subprocess.PIPE)
        left = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE, universal_newlines=True).stdout
        assert "ds2h" not in left, left


#: the default tier trains PyTorch on two hosts (the agents, ssh, the hostfile and torchrun's multi-node form); JAX's
#: coordinator launcher on one host is in tests/test_distributed.py, and on two hosts with --full, as TF and Keras
@pytest.mark.parametrize("target", ["pytorch"] + [pytest.param(t, marks=pytest.mark.full)
                                                  for t in ("jax", "tensorflow", "keras-jax")])
def test_two_simulated_hosts_train_like_one_process(sim_hosts, smoke, tmp_path, target):
    if target not in selected_targets():
        pytest.skip("%s is not among DS2_TEST_FRAMEWORKS" % target)
    one = RunAll.reuse(smoke, target, tmp_path)
    single = one.record(target)
    two = run_all(["--preset", "smoke", "--device", "cpu", "--frameworks", target, "--workers", "2", "--batch-size",
                   "4", "--hosts", sim_hosts["hostfile"], "--ssh", sim_hosts["ssh"], "--timeout", "900",
                   "--skip", "forward,onnx"], tmp_path)          # the training is what two hosts change
    rec = two_worker_record(two, target)
    d = rec["distributed"]
    assert d["hosts"] == [{"host": "10.77.0.1", "processes": 1}, {"host": "10.77.0.2", "processes": 1}], d
    assert d["per_worker_batch"] == 4 and d["global_batch"] == 8 and rec["batch_size"] == single["batch_size"] == 8
    ranks = rec["run"]["ranks"]
    assert len(ranks) == 2 and all(r["status"] == "ok" for r in ranks.values())
    assert sorted(r["host"] for r in ranks.values()) == ["ds2h0", "ds2h1"]    # each rank's own hostname
    assert_trains_like(rec, single)
    assert rec["run"]["launch_commands"][0].startswith("10.77.0.1: ")
    assert "10.77.0.1" in two.markdown() and "2 hosts" in two.markdown()
    assert_no_process_left()


def _fixture_on_hosts(tmp_path, sim_hosts, hostfile=None, join_timeout=None, **parameters):
    target = Target("fixture", "Fixture (stdlib)", FIXTURE, "pytorch", parameters=parameters)
    opts = execute.RunOptions(get_preset("smoke").with_overrides(batch_size=4), "fp32", 0, "cpu", str(tmp_path),
                              timeout=300)
    return launch.run_target(target, opts, 2, python=sys.executable, launcher=launchers.LAUNCHERS["python"],
                                  grace=2, hosts=hosts.parse_hostfile(hostfile or sim_hosts["hostfile"]),
                                  ssh_options=sim_hosts["ssh_options"], join_timeout=join_timeout)


@pytest.mark.parametrize("case", ["unreachable", "silent"])
def test_a_host_that_never_joins_ends_the_run_within_the_join_timeout(sim_hosts, tmp_path, case):
    hostfile = tmp_path / "hosts"
    if case == "unreachable":                            # no host has that address
        hostfile.write_text("10.77.0.1\n10.77.0.9\n")
        missing, options = "10.77.0.9", sim_hosts["ssh_options"]
    else:                                                # a host that never answers: its connection hangs
        config = tmp_path / "ssh_config"
        config.write_text("Host 10.77.0.2\n    ProxyCommand sleep 600\nHost *\nInclude %s/ssh_config\n" % SIM_DIR)
        hostfile.write_text("10.77.0.1\n10.77.0.2\n")
        missing, options = "10.77.0.2", ["-F", str(config)]
    t0 = time.time()
    rec = _fixture_on_hosts(tmp_path, dict(sim_hosts, ssh_options=options), str(hostfile), join_timeout=8)
    assert rec["status"] == "failed" and rec["error"].startswith("host %s did not join" % missing), rec["error"]
    if case == "silent":
        assert "within 8 s (--join-timeout)" in rec["error"] and time.time() - t0 >= 8
    assert "\n" not in rec["error"] and time.time() - t0 < 8 + 20
    assert_no_process_left()
    assert_only_whole_records(tmp_path)


def test_a_rank_killed_on_host_1_mid_epoch_stops_every_host(sim_hosts, tmp_path):
    import threading
    out = {}
    runner = threading.Thread(target=lambda: out.update(rec=_fixture_on_hosts(tmp_path, sim_hosts, mode="hang",
                                                                            fail_rank=0, fail_step=5)))
    runner.start()
    log = tmp_path / "logs" / "fixture_smoke_fp32_bs8_cpu_w2_h2.rank1.log"
    deadline = time.time() + 120
    while not (log.exists() and "global batch 8" in log.read_text()):
        assert time.time() < deadline and runner.is_alive(), "rank 1 did not start"
        time.sleep(0.2)
    victims = [pid for pid, cmd in run_processes(namespace_pids()["ds2h1"]) if b"python" in cmd
               and b"host_agent" not in open("/proc/%d/cmdline" % pid, "rb").read()]
    assert victims, namespace_pids()
    for pid in victims:
        os.kill(pid, signal.SIGKILL)                 # rank 1, on host 1, mid-epoch
    runner.join(timeout=60)
    assert not runner.is_alive()
    rec = out["rec"]
    assert rec["status"] == "failed" and "10.77.0.2" in rec["error"], rec["error"]
    assert_no_process_left()
    assert_only_whole_records(tmp_path)


DRIVER = """
import signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, %(root)r)
from common.spec import get_preset
from runner.dp import hosts, launch, launchers
from runner.run import execute
from runner.run.targets import Target
target = Target("fixture", "Fixture", %(fixture)r, "pytorch", parameters=dict(mode="hang", fail_rank=1))
opts = execute.RunOptions(get_preset("smoke").with_overrides(batch_size=4), "fp32", 0, "cpu", %(results)r, timeout=300)
launch.run_target(target, opts, 2, python=sys.executable, launcher=launchers.LAUNCHERS["python"], grace=2,
                  hosts=hosts.parse_hostfile(%(hostfile)r), ssh_options=%(ssh)r)
"""


def test_ctrl_c_on_the_launching_host_stops_every_host(sim_hosts, tmp_path):
    code = DRIVER % dict(root=ROOT, fixture=FIXTURE, results=str(tmp_path), hostfile=sim_hosts["hostfile"],
                         ssh=sim_hosts["ssh_options"])
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True, start_new_session=True)
    logs = [tmp_path / "logs" / ("fixture_smoke_fp32_bs8_cpu_w2_h2.rank%d.log" % r) for r in range(2)]
    try:
        deadline = time.time() + 120
        while not all(p.exists() and "global batch 8" in p.read_text() for p in logs):
            assert time.time() < deadline and driver.poll() is None, "the workers did not start"
            time.sleep(0.2)
        assert all(run_processes(p) for p in namespace_pids().values())      # both hosts run a rank
        os.killpg(driver.pid, signal.SIGINT)
        out, _ = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()
    assert "KeyboardInterrupt" in out, out
    rec = results.read_record(str(tmp_path / "records" / "fixture_smoke_fp32_bs8_cpu_w2_h2.json"))
    assert rec["status"] == "failed" and rec["error"] == "interrupted by the user"
    assert_no_process_left()
    assert_only_whole_records(tmp_path)
