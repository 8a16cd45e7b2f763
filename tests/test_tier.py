"""The default tier's time budget: no single test outside the ``full`` tier takes longer than
``TEST_LIMIT_S`` (5 minutes).  ``test_no_default_test_is_over_the_limit`` runs after every other test
(marked ``last``) and reads what tests/conftest.py timed in this session: each test's own setup, call and
teardown, less the shared session and module fixtures it happened to set up first (those serve many tests
and are listed apart in the summary).  A slow test belongs in ``python -m tests --full`` (mark it
``full``), or should share a run with others (a session fixture)."""
import os
import subprocess
import sys
import threading

import pytest

from tests import conftest
from tests.conftest import Durations, TEST_LIMIT_S


class _Report:
    def __init__(self, nodeid, when, duration):
        self.nodeid, self.when, self.duration = nodeid, when, duration


class _Item:
    def __init__(self, nodeid, full=False, fixturenames=(), last=False):
        self.nodeid, self._full, self.fixturenames, self._last = nodeid, full, fixturenames, last

    def get_closest_marker(self, name):
        return object() if (name == "full" and self._full) or (name == "last" and self._last) else None


def budget_message(over):
    return "; ".join("%s took %.0f s (limit %.0f s: mark it full or share its run)" % (n, s, TEST_LIMIT_S)
                     for n, s in over)


def test_the_limit_finds_a_slow_default_test_and_names_it():
    d = Durations()
    for nodeid, full, phases in [("tests/test_a.py::test_quick", False, (0.1, 2.0, 0.1)),
                                 ("tests/test_b.py::test_slow[x]", False, (1.0, 299.5, 0.5)),
                                 ("tests/test_c.py::test_heavy", True, (0.0, 900.0, 0.0))]:
        d.pytest_runtest_setup(_Item(nodeid, full))
        for when, s in zip(("setup", "call", "teardown"), phases):
            d.pytest_runtest_logreport(_Report(nodeid, when, s))
    assert d.over_limit() == [("tests/test_b.py::test_slow[x]", 301.0)]   # the full test is not held to it
    assert "tests/test_b.py::test_slow[x] took 301 s" in budget_message(d.over_limit())
    assert d.over_limit(limit=1000) == []


def test_shared_fixture_setup_is_not_charged_to_the_test_that_came_first():
    d = Durations()
    d.pytest_runtest_setup(_Item("tests/test_a.py::test_first"))
    d._shared_in_setup = 400.0        # what pytest_fixture_setup measured for a session fixture in this setup
    d.pytest_runtest_logreport(_Report("tests/test_a.py::test_first", "setup", 401.0))
    d.pytest_runtest_logreport(_Report("tests/test_a.py::test_first", "call", 2.0))
    assert d.tests["tests/test_a.py::test_first"] == pytest.approx(3.0)
    assert d.over_limit() == []


def test_the_modules_that_read_the_runs_made_ahead_run_whole_after_the_others_then_the_last_test():
    items = [_Item("tests/test_a.py::one"), _Item("tests/test_b.py::uses", fixturenames=("tmp_path", "lane_runs")),
             _Item("tests/test_b.py::other"), _Item("tests/test_t.py::limit", last=True), _Item("tests/test_c.py::x"),
             _Item("tests/test_d.py::short", fixturenames=("short", "lane_runs")), _Item("tests/test_d.py::y")]
    assert [i.nodeid for i in conftest.session_order(items)] == [
        "tests/test_a.py::one", "tests/test_c.py::x", "tests/test_b.py::uses", "tests/test_b.py::other",
        "tests/test_d.py::short", "tests/test_d.py::y", "tests/test_t.py::limit"]
    plain = [i for i in items if not i.fixturenames and not i.get_closest_marker("last")]
    assert conftest.session_order(plain) == plain


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="no SCHED_IDLE here (Linux has it): nothing is made ahead")
def test_idle_priority_holds_for_what_the_thread_starts_and_leaves_the_others_alone():
    out = {}

    def lane():
        out["set"] = conftest.idle_priority()
        out["child"] = subprocess.run([sys.executable, "-c", "import os; print(os.sched_getscheduler(0))"],
                                      stdout=subprocess.PIPE, universal_newlines=True, check=True).stdout.strip()
    t = threading.Thread(target=lane)
    t.start()
    t.join()
    assert out == {"set": True, "child": str(os.SCHED_IDLE)}
    assert os.sched_getscheduler(0) != os.SCHED_IDLE          # this thread (the tests') keeps its priority


#: the runs made ahead need a thread that may leave SCHED_IDLE again (tests/conftest.py idle_undoable)
NEEDS_IDLE_UNDO = pytest.mark.skipif(not conftest.idle_undoable(), reason="this user may not leave SCHED_IDLE "
                                     "(RLIMIT_NICE), or no SCHED_IDLE here: nothing is made ahead")

CHILD = """
import os, sys, threading, time
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
print(os.getpid(), flush=True)
sys.stdin.readline()
"""


def _policies(pid):
    return sorted(set(os.sched_getscheduler(int(t)) for t in os.listdir("/proc/%d/task" % pid)))


@NEEDS_IDLE_UNDO
def test_normal_priority_brings_back_every_thread_of_a_process_started_at_idle_priority():
    procs = []

    def lane():
        conftest.idle_priority()
        procs.append(subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      universal_newlines=True))
    t = threading.Thread(target=lane)
    t.start()
    t.join()
    child = procs[0]
    try:
        assert int(child.stdout.readline()) == child.pid
        assert len(os.listdir("/proc/%d/task" % child.pid)) == 2
        assert _policies(child.pid) == [os.SCHED_IDLE]         # both of its threads
        conftest.normal_priority([child.pid])
        assert _policies(child.pid) == [os.SCHED_OTHER]
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def test_what_the_tier_starts_waits_for_openmp_asleep_unless_the_user_chose():
    """A kernel started by a run_all.py that the tier starts inherits OMP_WAIT_POLICY=PASSIVE (tests/conftest.py):
    side by side on 2 cores, a spinning OpenMP thread held PyTorch's smoke steps 55 times as long."""
    child = "import os; print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", child], stdout=subprocess.PIPE, universal_newlines=True, check=True)
    assert out.stdout.strip() == os.environ["OMP_WAIT_POLICY"]
    user = subprocess.run([sys.executable, "-c", "import os; os.environ['OMP_WAIT_POLICY'] = 'ACTIVE'; "
                           "from tests import conftest; print(os.environ['OMP_WAIT_POLICY'])"],
                          stdout=subprocess.PIPE, universal_newlines=True, check=True, cwd=conftest.ROOT)
    assert user.stdout.strip() == "ACTIVE"                              # what the user set is kept
    fresh = subprocess.run([sys.executable, "-c", "from tests import conftest; import os; "
                            "print(os.environ['OMP_WAIT_POLICY'])"], stdout=subprocess.PIPE, universal_newlines=True,
                           check=True, cwd=conftest.ROOT, env={k: v for k, v in os.environ.items()
                                                               if k != "OMP_WAIT_POLICY"})
    assert fresh.stdout.strip() == "PASSIVE"


@NEEDS_IDLE_UNDO
def test_a_run_made_after_the_smoke_run_waits_runs_idle_with_the_starting_environment_and_hands_over_its_value(
        monkeypatch):
    seen = []

    def make(smoke, env, idle, tids):
        seen.append((smoke, env["OMP_NUM_THREADS"], env.get("AT_START"), "DS2_TEST_TAG" in env, idle,
                     os.sched_getscheduler(0) == os.SCHED_IDLE))
        if smoke == "no rows":
            pytest.skip("fewer than two rows ran")
        return "made from %s" % smoke

    for smoke, expected in [("the smoke run", "made from the smoke run"), (None, None), ("no rows", "skip")]:
        monkeypatch.setitem(conftest.AFTER_SMOKE, "after", make)
        ahead = conftest.LanesAhead()
        ahead.start([], {}, after=("after",), env={"AT_START": "yes"})
        monkeypatch.setenv("DS2_TEST_TAG", "a test's marker")        # set after the start: not theirs
        assert ahead.get("not made ahead") is None
        assert ahead.get("lane_runs") == {} and not ahead.done["after"].wait(0.5)     # waits for the smoke run
        ahead.smoke_made(smoke)
        if expected == "skip":
            with pytest.raises(pytest.skip.Exception, match="fewer than two rows ran"):
                ahead.get("after")
        else:
            assert ahead.get("after") == expected           # None: the fixture makes it itself
        ahead.thread.join(timeout=10)
        assert not ahead.thread.is_alive()
    assert seen == [("the smoke run", "1", "yes", False, True, True), ("no rows", "1", "yes", False, True, True)]


@NEEDS_IDLE_UNDO
def test_the_runs_made_ahead_wait_for_the_smoke_run_or_for_a_test_that_asks_for_them():
    ahead = conftest.LanesAhead()
    ahead.start([], {}, after_smoke=True)
    assert not ahead.done["lane_runs"].wait(1.5)              # the smoke run's halves have the cores
    ahead.smoke_made("the smoke run")
    assert ahead.done["lane_runs"].wait(10) and ahead.get("lane_runs") == {}
    asked = conftest.LanesAhead()
    asked.start([], {}, after_smoke=True)
    assert not asked.done["lane_runs"].wait(1.5)
    assert asked.get("lane_runs") == {}                         # asked before any smoke run: made at once
    stopped = conftest.LanesAhead()
    stopped.start([], {}, after_smoke=True)
    stopped.stop()
    assert not stopped.thread.is_alive() and stopped.get("lane_runs") is None     # the fixture makes them itself
    for lanes in (ahead, asked):
        lanes.thread.join(timeout=10)
        assert not lanes.thread.is_alive()


@pytest.mark.last
def test_no_default_test_is_over_the_limit():
    over = conftest.DURATIONS.over_limit()
    assert not over, budget_message(over)


@pytest.mark.parametrize("value, says", [
    ("bogus", "DS2_TEST_FRAMEWORKS=bogus: unknown framework 'bogus'; choose from: pytorch,"),
    ("pytorch,,jax", "DS2_TEST_FRAMEWORKS=pytorch,,jax: 'pytorch,,jax' has an empty item"),
    ("jax,jax", "DS2_TEST_FRAMEWORKS=jax,jax: 'jax,jax' names jax twice"),
    ("", "DS2_TEST_FRAMEWORKS=: no framework given"),
], ids=["unknown", "empty-item", "twice", "empty"])
def test_a_test_session_with_rows_it_cannot_select_stops_before_any_test(value, says):
    """A typo in DS2_TEST_FRAMEWORKS would select no row, and every row's test would skip: the session stops at its
    start with one line instead (pytest's usage error, exit status 4); ``all`` and real rows are taken."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only",
                           os.path.join(conftest.ROOT, "tests", "test_spec.py")], cwd=conftest.ROOT,
                          env=dict(os.environ, DS2_TEST_FRAMEWORKS=value), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, universal_newlines=True, timeout=120)
    assert proc.returncode == 4, proc
    assert proc.stderr.strip().startswith("ERROR: " + says) and proc.stderr.strip().endswith("(unset: every row)")
    assert len(proc.stderr.strip().splitlines()) == 1 and "collected" not in proc.stdout, proc.stdout
    assert conftest.selection_error("all") is conftest.selection_error("pytorch,jax+hoist") is None
