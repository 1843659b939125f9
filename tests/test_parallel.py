"""Executors: the same study gives the same JSON on local processes and on Ray;
a failing unit is named, never a hang; Ray missing is a clean exit 2."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from splitplan import api
from splitplan.base.errors import SpecError
from splitplan.base.parallel import WorkUnitError, run_units
from splitplan.cli import app
from splitplan.workflows.simulation import Setup, _simulate_unit
from splitplan.workload.trace import default_trace_path, load_trace

TRACE = load_trace(default_trace_path())


def _ray():
    """Ray (the integration extra; CI installs it), or the test is skipped."""
    return pytest.importorskip("ray", reason="needs the integration extra: pip install '.[integration]'")


@pytest.fixture(scope="module")
def local_ray():
    ray = _ray()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.integration
def test_compare_and_sweep_same_json_on_ray_and_local(local_ray):
    runner = CliRunner()
    compare = ["compare", "--scenario", "iso-throughput-cost", "--rate", "6", "--duration", "30", "--format", "json"]
    local = runner.invoke(app, compare + ["--executor", "local", "--jobs", "2"])
    remote = runner.invoke(app, compare + ["--executor", "ray"])
    assert local.exit_code == 0 and remote.exit_code == 0, remote.output
    assert json.loads(local.stdout) == json.loads(remote.stdout)
    sweep = ["sweep", "--rates", "2,6", "--designs", "splitwise-designs", "--design", "Splitwise-HA", "--duration", "30"]
    assert runner.invoke(app, sweep + ["--executor", "local"]).stdout == runner.invoke(app, sweep + ["--executor", "ray"]).stdout


@pytest.mark.slow
@pytest.mark.integration
def test_windows_same_on_ray_and_local(local_ray):
    options = dict(hardware=["h100-80gb"], tp=8)
    a = api.plan_windows(1200, TRACE, "llama2-70b", "splitwise", jobs=2, **options).to_json()
    b = api.plan_windows(1200, TRACE, "llama2-70b", "splitwise", executor="ray", **options).to_json()
    assert a == b and len(a["windows"]) == 3


@pytest.mark.parametrize("executor", ["local", pytest.param("ray", marks=[pytest.mark.slow, pytest.mark.integration])])
def test_failing_unit_is_named(executor, request):
    if executor == "ray":
        request.getfixturevalue("local_ray")
    good = [("prompt", "h100-80gb", 8, 1), ("token", "h100-80gb", 8, 1)]
    shared = (TRACE, Setup("llama2-70b", "splitwise", "lean", None, 2048))
    with pytest.raises(WorkUnitError, match=r"work unit 2 of 2 \(plan None\) failed: TypeError"):
        run_units(_simulate_unit, [good, None], shared, jobs=2, executor=executor,
                  describe=lambda pools: f"plan {pools!r}")


def _pid_after(parent: int, item: float) -> int:
    time.sleep(item)
    return os.getpid()


def _die_in_a_worker(parent: int, item: int) -> int:
    if os.getpid() != parent:
        os._exit(3)  # (a worker killed mid-unit: out of memory, say)
    time.sleep(0.2)
    return item


def test_this_process_takes_units_beside_its_workers_and_results_keep_their_order():
    """jobs=2: one forked worker and this process, each taking the next unit left, so neither
    waits while units remain; the results come back in input order whoever ran them."""
    pids = run_units(_pid_after, [0.05] * 12, os.getpid(), jobs=2)
    assert os.getpid() in pids and len(set(pids)) == 2
    assert run_units(pow, [2, 3, 4, 5], 2, jobs=2) == [4, 8, 16, 32]


def test_a_worker_that_dies_loses_its_units_loudly_not_silently():
    with pytest.raises(WorkUnitError, match="its worker process ended before it finished"):
        run_units(_die_in_a_worker, list(range(10)), os.getpid(), jobs=2)


def test_user_errors_in_units_keep_their_kind():
    shared = (TRACE, Setup("llama2-70b", "splitwise", "lean", None, 2048))
    with pytest.raises(SpecError, match=r"work unit 1 of 1 .*unknown hardware 'h100'"):
        run_units(_simulate_unit, [[("prompt", "h100", 8, 1), ("token", "h100-80gb", 8, 1)]], shared)


def test_missing_ray_exits_2_with_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    result = CliRunner().invoke(app, ["compare", "--scenario", "iso-throughput-cost", "--rate", "3", "--duration", "20",
                                      "--executor", "ray"])
    assert result.exit_code == 2 and "pip install '.[ray]'" in result.stderr


@pytest.mark.integration
def test_unreachable_ray_cluster_is_a_clean_error():
    ray = _ray()
    if ray.is_initialized():
        ray.shutdown()
    result = CliRunner().invoke(app, ["compare", "--scenario", "iso-throughput-cost", "--rate", "3", "--duration", "20",
                                      "--executor", "ray", "--ray-address", "auto"])
    assert result.exit_code == 2 and "cannot start or reach --ray-address auto" in result.stderr, result.output


@pytest.mark.integration
def test_ray_that_cannot_start_is_a_clean_error(monkeypatch):
    """However ray.init fails (here a timeout, as when its processes cannot start), exit 2 at once."""
    ray = _ray()
    def fails(**kwargs):
        raise TimeoutError("Timed out after 30 seconds waiting for the raylet")
    monkeypatch.setattr(ray, "init", fails)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    result = CliRunner().invoke(app, ["compare", "--scenario", "iso-throughput-cost", "--rate", "3", "--duration", "20",
                                      "--executor", "ray"])
    assert result.exit_code == 2 and "cannot start or reach a local Ray instance: Timed out" in result.stderr, result.output


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal is Linux's")
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_forked_workers_end_when_the_parent_is_killed(tmp_path, how):
    script = tmp_path / "busy.py"
    script.write_text("import time\nfrom splitplan.base.parallel import run_units\n\n"
                      "def slow(shared, item):\n    time.sleep(120)\n\n"
                      "if __name__ == '__main__':\n    run_units(slow, list(range(4)), None, jobs=3)\n")  # (2 workers beside it)
    parent = subprocess.Popen([sys.executable, str(script)])
    workers = _wait_for_children(parent.pid, 2)
    assert len(workers) >= 2
    parent.send_signal(getattr(signal, how))
    parent.wait()
    deadline = time.monotonic() + 10
    alive = workers
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [w for w in workers if _running(w)]
    for w in alive:  # leave nothing behind, pass or fail
        os.kill(w, signal.SIGKILL)
    assert not alive, f"workers {alive} outlived their parent"


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def _wait_for_children(pid: int, count: int, timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while len(_children(pid)) < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return _children(pid)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_ctrl_c_ends_the_workers_at_once_with_one_line():
    """Ctrl-C reaches the whole process group: the workers leave it to the parent, which ends
    them at once (it used to wait about 12 s for their units) and prints one line."""
    # (Ctrl-C handled as a terminal's command has it, even where this suite runs in the background,
    # whose commands start with SIGINT ignored)
    command = [sys.executable, "-c", "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
               "from splitplan.cli import main; main()", "compare", "--scenario", "iso-power",
               "--budget-machines", "h100-80gb=40", "--duration", "60", "--jobs", "3"]  # (2 workers beside it)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    workers = _wait_for_children(process.pid, 2, 60)
    assert len(workers) >= 2
    time.sleep(1)
    os.killpg(process.pid, signal.SIGINT)
    start = time.monotonic()
    _, err = process.communicate(timeout=30)
    took = time.monotonic() - start
    assert (process.returncode, err.decode()) == (130, "error: interrupted\n"), f"after {took:.1f} s"
    assert took < 5
    time.sleep(0.5)
    assert not [w for w in workers if _running(w)]


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_pool_ctrl_c_ended_is_recorded_for_the_exit():
    """Ctrl-C in a parallel map ends its pool and records it, so that the console script exits without the
    interpreter's exit hooks (cli.common.main); in a process of its own, as the record lasts the process."""
    script = ("from splitplan.base import parallel\n"
              "def stop():\n    raise KeyboardInterrupt\n"
              "assert not parallel.pool_torn_down()\n"
              "try:\n    parallel.run_units(pow, [2, 3, 4], 2, jobs=2, progress=stop)\n"
              "except KeyboardInterrupt:\n    print(parallel.pool_torn_down())\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.stdout == "True\n", done.stderr
