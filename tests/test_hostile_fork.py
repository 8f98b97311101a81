"""Issue 18, class 5: fork() while another thread is inside load().

The loader's locks (loading's load lock, verify's image lock) are replaced in the child
by os.register_at_fork handlers: a child forked while a thread of the parent holds one
loads at once instead of waiting forever.
"""

from __future__ import annotations

import json

import pytest

from conftest import clean_env, env_for, needs_wheels, run_py

FORK_DURING_LOAD = r"""
import json, os, signal, threading, time, cuplug
stop = False
def loader():
    while not stop:
        cuplug.load().close()
t = threading.Thread(target=loader, daemon=True)
t.start()
time.sleep(0.2)
results = []
for i in range(10):
    pid = os.fork()
    if pid == 0:
        signal.alarm(15)  # a deadlocked child dies of SIGALRM instead of hanging the test
        b = cuplug.load()
        r = b.run("sum", memoryview(bytearray(b"\0\0\x80?" * 4)).cast("f"))
        os._exit(0 if r == 4.0 else 3)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            results.append(os.waitstatus_to_exitcode(status))
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            results.append("hung")
            break
        time.sleep(0.01)
stop = True
t.join(10)
print(json.dumps(results))
"""


@pytest.mark.reliability(
    case="fork() while another thread is inside load()",
    how="a thread calls cuplug.load() in a loop; the main thread forks 10 children, each of which loads and runs "
    "a sum (CPU only, and with the real artifacts on the fake driver)",
    expect="all 10 children load and answer (exit 0), none deadlocks on a lock copied in its locked state",
)
@pytest.mark.parametrize("where", ["cpu", pytest.param("artifacts", marks=needs_wheels)])
def test_fork_during_load_does_not_deadlock(where, request):
    if where == "artifacts":
        env = env_for(request.getfixturevalue("site"), request.getfixturevalue("fake_driver_dir"))
    else:
        env = clean_env()
    proc = run_py(FORK_DURING_LOAD, env, timeout=400)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [0] * 10
