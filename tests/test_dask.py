"""Layer 7, sensitivity beyond one machine: the units as tasks on a real Dask cluster on
loopback, a ``distributed.LocalCluster`` of worker processes and ``dask scheduler`` / ``dask
worker`` started as processes. The answer is ``--jobs 1``'s byte for byte; the scheduler sees
one task finish per unit; each worker process opens its study once; a worker killed mid-run
changes nothing; a dead address, a missing ``distributed`` and a worker that cannot read the
models are one line each."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import models
import pytest
from conftest import IMPORT_EPRUN, run_eprun

import eprun as tool

distributed = pytest.importorskip("distributed", reason="Dask's distributed is a dev "
                                  "requirement (make test installs it)")


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    """A chain of eight layers and its QDQ twin (sixteen units), by absolute path."""
    folder = tmp_path_factory.mktemp("dask")
    fp32 = models.save(models.chain(features=8, widths=[12, 10, 10, 8, 8, 8, 8, 6], seed=3),
                       folder / "fp32.onnx")
    return fp32.resolve(), models.quantize(fp32, folder / "int8.onnx", seed=4).resolve()


@pytest.fixture(scope="module")
def alone(pair) -> str:
    """The answer of ``sensitivity`` on the pair in one process (``--jobs 1``): stdout."""
    fp32, int8 = pair
    result = run_eprun("sensitivity", fp32, int8, "5", "--jobs", "1")
    assert result.code == 0, result.stderr
    assert len(result.answer["units"]) == 16  # a MatMul and an Add each layer
    return result.stdout


@pytest.fixture
def local_cluster():
    """Two worker processes of one thread each, on loopback; closed after the test that asked
    for it (idle, its scheduler, nannies and workers still take a sixth of a core from the
    tests beside it)."""
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  host="127.0.0.1", dashboard_address=":0",
                                  silence_logs=logging.CRITICAL) as cluster:
        yield cluster


def finished_units(address: str) -> int:
    """How many of eprun's unit tasks the scheduler saw finish (its transition log)."""
    with distributed.Client(address, timeout=10, set_as_default=False) as monitor:
        return monitor.run_on_scheduler(lambda dask_scheduler: sum(
            1 for transition in dask_scheduler.transition_log
            if str(transition.key).startswith("eprun-unit-") and transition.finish == "memory"))


def opened_per_worker(address: str) -> dict:
    """Each worker process's count of the studies it opened."""
    with distributed.Client(address, timeout=10, set_as_default=False) as monitor:
        return monitor.run(lambda: getattr(sys.modules.get("_eprun_dask_state"), "opened", 0))


def test_a_local_cluster_gives_the_answer_of_one_process(pair, alone, local_cluster):
    fp32, int8 = pair
    argv = ["sensitivity", fp32, int8, "5"]
    units = 16
    before = finished_units(local_cluster.scheduler_address)
    opened = sum(opened_per_worker(local_cluster.scheduler_address).values())
    spread = run_eprun(*argv, "--dask-scheduler", local_cluster.scheduler_address)
    assert spread.code == 0, spread.stderr
    assert spread.stdout == alone
    assert finished_units(local_cluster.scheduler_address) - before == units
    said = f"the units run as tasks on the Dask cluster at {local_cluster.scheduler_address}"
    assert f"{said} (2 workers)" in spread.stderr
    now = opened_per_worker(local_cluster.scheduler_address)
    assert 1 <= sum(now.values()) - opened <= len(now)  # once per worker process, not per task
    with distributed.Client(local_cluster.scheduler_address, timeout=10,
                            set_as_default=False) as monitor:
        left = monitor.run_on_scheduler(lambda dask_scheduler: (
            len(dask_scheduler.clients), len(dask_scheduler.tasks)))
    assert left == (2, 0)  # this monitor and the scheduler's fire-and-forget: eprun's is gone


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dask_command(*words) -> list[str]:
    """``dask ...`` of this interpreter's environment."""
    return [sys.executable, "-m", "distributed.cli.dask_" + words[0], *words[1:]]


@pytest.fixture
def processes(tmp_path):
    """``dask scheduler`` and ``dask worker`` started as processes in a folder of their own;
    every one killed at the end."""
    started: list[subprocess.Popen] = []

    def start(*words, prefix: list[str] = ()) -> subprocess.Popen:
        log = open(tmp_path / f"{words[0]}-{len(started)}.log", "wb")
        process = subprocess.Popen([*prefix, *dask_command(*words)], stdout=log,
                                   stderr=subprocess.STDOUT, cwd=tmp_path,
                                   start_new_session=True)
        started.append(process)
        return process

    yield start
    for process in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)


def scheduler_and_workers(processes, tmp_path, workers: int = 2, prefix=()) -> tuple[str, Path]:
    """A scheduler (with its scheduler file) and ``workers`` worker processes, joined."""
    port = free_port()
    schedule = tmp_path / "scheduler.json"
    processes("scheduler", "--host", "127.0.0.1", "--port", str(port), "--dashboard-address",
              "127.0.0.1:0", "--scheduler-file", str(schedule))
    address = f"tcp://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not schedule.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    for k in range(workers):
        add_worker(processes, address, f"w{k}", tmp_path, prefix)
    if workers:
        with distributed.Client(address, timeout=30, set_as_default=False) as client:
            client.wait_for_workers(workers, timeout=60)
    return address, schedule


def add_worker(processes, address: str, name: str, tmp_path, prefix=()) -> subprocess.Popen:
    """One ``dask worker`` process of one thread, named ``name``."""
    return processes("worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--name",
                     name, "--no-dashboard", "--no-nanny", "--local-directory",
                     str(tmp_path / name), prefix=prefix)


def busy_with_a_unit(address: str, name: str) -> bool:
    """Is worker ``name`` computing one of eprun's unit tasks now?"""
    with distributed.Client(address, timeout=10, set_as_default=False) as monitor:
        return monitor.run_on_scheduler(lambda dask_scheduler, name=name: any(
            worker.name == name and any(str(task.key).startswith("eprun-unit-")
                                        for task in worker.processing)
            for worker in dask_scheduler.workers.values()))


# The ``eprun`` command pip installs: ``cli()`` of the module named eprun, whose records the
# scheduler and the workers cannot import (``python eprun.py``'s are ``__main__``'s, which
# Dask's pickles carry whole).
COMMAND = [sys.executable, "-c", IMPORT_EPRUN + "eprun.cli()"]


def started_on(address: str, worker: str, schedule: Path,
               command: list[str] = COMMAND) -> subprocess.Popen:
    """``eprun sensitivity`` of the pair on the cluster of ``schedule``, once ``worker`` is
    computing one of its units."""
    running = subprocess.Popen([*command, "sensitivity", *map(str, started_on.pair), "5",
                                "--dask-scheduler-file", str(schedule)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not busy_with_a_unit(address, worker) and running.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running.poll() is None, f"the run ended before {worker} took a unit"
    return running


def left_behind(address: str, workers: list[Path]) -> dict:
    """What runs leave on the cluster: clients, eprun's tasks and uploads on the scheduler and
    the workers, the workers' open studies, tasks still executing and scratch folders."""
    with distributed.Client(address, timeout=10, set_as_default=False) as monitor:
        on_scheduler = monitor.run_on_scheduler(lambda dask_scheduler: (
            len(dask_scheduler.clients),
            sorted(str(key) for key in dask_scheduler.tasks if "eprun" in str(key)),
            sorted(name for name in dask_scheduler.plugins if "eprun" in name)))
        on_workers = monitor.run(lambda dask_worker: (
            sorted(name for name in dask_worker.plugins if "eprun" in name),
            len(getattr(sys.modules.get("_eprun_dask_state"), "runs", {})),
            len(dask_worker.state.executing)))
    scratch = sorted(path.name for folder in workers for path in folder.rglob("eprun-worker-*"))
    return {"clients": on_scheduler[0], "tasks": on_scheduler[1], "uploads": on_scheduler[2],
            "on workers": sorted(on_workers.values()), "scratch": scratch}


# What ``left_behind`` sees of a run that is over on a cluster of two workers: two clients (the
# monitor asking, and the scheduler's own for fire-and-forget tasks), and nothing of eprun's.
NOTHING_LEFT = {"clients": 2, "tasks": [], "uploads": [], "scratch": [],
                "on workers": [([], 0, 0), ([], 0, 0)]}


def left_once_settled(address: str, workers: list[Path]) -> dict:
    """``left_behind`` once it is ``NOTHING_LEFT``, or after 30 s: a unit a worker was
    computing when the run ended runs to its end first, then removes what it opened."""
    deadline = time.monotonic() + 30
    while left_behind(address, workers) != NOTHING_LEFT and time.monotonic() < deadline:
        time.sleep(0.1)
    return left_behind(address, workers)


def test_the_installed_command_on_dask_processes_a_sigterm_and_a_killed_worker(
        pair, alone, processes, tmp_path):
    """The scheduler file names the cluster, and the command pip installs runs there. SIGTERM
    while the units run ends eprun (exit 143) and everything it started on the cluster; a
    worker killed (SIGKILL) while it computes a unit is the cluster's business: its task runs
    again on the other, the answer is the same."""
    started_on.pair = pair
    address, schedule = scheduler_and_workers(processes, tmp_path, workers=1)
    victim = add_worker(processes, address, "victim", tmp_path)
    with distributed.Client(address, timeout=30, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
    ended = started_on(address, "victim", schedule)
    ended.send_signal(signal.SIGTERM)
    ended.communicate(timeout=60)
    assert ended.returncode == 128 + signal.SIGTERM
    assert left_once_settled(address, [tmp_path / "w0", tmp_path / "victim"]) == NOTHING_LEFT
    running = started_on(address, "victim", schedule)
    os.killpg(victim.pid, signal.SIGKILL)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 0, err
    assert out == alone


def test_a_scheduler_that_stops_answering_ends_the_run_in_one_line(pair, processes, tmp_path):
    """A scheduler that hangs (SIGSTOP: its connections stay open, nothing answers) ends the
    run once it has been silent for DASK_SILENCE, exit 4, in one line (eprun waited for
    ever)."""
    started_on.pair = pair
    address, schedule = scheduler_and_workers(processes, tmp_path)
    with distributed.Client(address, timeout=30, set_as_default=False) as monitor:
        scheduler = monitor.run_on_scheduler(os.getpid)
    command = [sys.executable, "-c", IMPORT_EPRUN + "eprun.DASK_TIMEOUT = 1.0\n"
               "eprun.DASK_SILENCE = 2.0\neprun.cli()"]
    running = started_on(address, "w0", schedule, command)
    os.kill(scheduler, signal.SIGSTOP)
    try:
        out, err = running.communicate(timeout=60)
    finally:
        os.kill(scheduler, signal.SIGCONT)
        if running.poll() is None:
            running.kill()
    assert running.returncode == 4
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith(f"eprun: error: the Dask scheduler at {address} stopped answering "
                           "(not a word within 2 s; "), line


def test_a_scheduler_that_fails_the_upload_is_one_line(run_eprun_here, pair, local_cluster,
                                                       monkeypatch):
    """The connection lost while eprun uploads its code (as distributed says it after a
    scheduler hung for TCP's timeout) is one line naming the scheduler, not an internal
    error."""
    def lost(*args, **kwargs):
        raise distributed.comm.CommClosedError("in <TCP (closed)>: Stream is closed")

    monkeypatch.setattr(distributed.Client, "register_plugin", lost)
    result = run_eprun_here("sensitivity", *pair, "5", "--dask-scheduler",
                            local_cluster.scheduler_address)
    assert result.code == 4
    assert result.stderr.splitlines()[-1] == (
        f"eprun: error: the Dask scheduler at {local_cluster.scheduler_address} did not take "
        "eprun's code (in <TCP (closed)>: Stream is closed)")


# ``as_completed`` made with a signal landing while it holds its lock (the callbacks it gives
# distributed's event loop take that lock once a future is done: the undo cancels them all).
SIGNAL_IN_AS_COMPLETED = """
import os, signal, time
import distributed.client

def update(self, futures):
    with self.lock:
        for future in futures:
            self.futures[future] += 1
            self.loop.add_callback(self._track_future, future)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)

distributed.client.as_completed.update = update
"""


def test_a_signal_while_distributed_holds_a_lock_still_undoes_the_run_at_once(
        pair, processes, tmp_path):
    """Whatever code of distributed's runs when a signal lands, the signal's undo does not
    wait for it: it ends eprun within a second or two, and leaves nothing on the cluster."""
    address, _ = scheduler_and_workers(processes, tmp_path)
    started = time.monotonic()
    ended = run_eprun("sensitivity", *pair, "5", "--dask-scheduler", address, prefix=[
        sys.executable, "-c", IMPORT_EPRUN + SIGNAL_IN_AS_COMPLETED + "eprun.cli()"])
    assert ended.code == 128 + signal.SIGTERM, ended.stderr
    assert time.monotonic() - started < tool.DASK_TIMEOUT
    assert left_once_settled(address, [tmp_path / "w0", tmp_path / "w1"]) == NOTHING_LEFT


def test_a_dead_address_is_one_line_within_a_bounded_time(run_eprun_here, pair, monkeypatch):
    fp32, int8 = pair
    monkeypatch.setattr(tool, "DASK_TIMEOUT", 0.3)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts, never answers: distributed's own client would wait for ever
    silent = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    closed = f"tcp://127.0.0.1:{free_port()}"
    talker = socket.socket()  # speaks first, and not Dask's protocol: an SSH server
    talker.bind(("127.0.0.1", 0))
    talker.listen(1)
    threading.Thread(target=lambda: talker.accept()[0].sendall(b"SSH-2.0-OpenSSH_9.6\r\n"),
                     daemon=True).start()
    garbage = f"tcp://127.0.0.1:{talker.getsockname()[1]}"
    why = {closed: " within 0.3 s", silent: " within 0.3 s",
           garbage: ": what answers there does not speak Dask's protocol"}
    try:
        for address in (closed, silent, garbage):
            started = time.monotonic()
            result = run_eprun_here("sensitivity", fp32, int8, "5", "--dask-scheduler",
                                    address)
            assert result.code == 4, result.stderr
            (line,) = result.stderr.splitlines()
            assert line.startswith(f"eprun: error: cannot reach the Dask scheduler at {address}"
                                   f"{why[address]}"), line
            assert time.monotonic() - started < 10
    finally:
        listener.close()
        talker.close()


def test_distributed_says_nothing_on_stderr():
    """distributed's logging stays off eprun's stderr, from every logger its configuration
    keeps from passing records up (a rescheduled task's warning, said by distributed.client,
    reached Python's last resort: stderr). In a process of its own: under pytest, whose
    logging is set up first, distributed leaves its loggers passing records up."""
    script = IMPORT_EPRUN + (
        "import logging\n"
        "eprun._import_distributed(eprun.DaskFlags('tcp://127.0.0.1:1', None))\n"
        "names = [name for name in logging.root.manager.loggerDict\n"
        "         if name.split('.')[0] in ('distributed', 'tornado')]\n"
        "for name in names:\n"
        "    logging.getLogger(name).warning(\"Couldn't gather 1 keys, rescheduling\")\n"
        "print(' '.join(names))\n")
    said = run_eprun(prefix=[sys.executable, "-c", script])
    assert said.code == 0, said.stderr
    assert "distributed.client" in said.stdout.split()
    assert said.stderr == ""


def test_without_distributed_it_is_usage_naming_the_extra(run_eprun_here, pair, monkeypatch):
    fp32, int8 = pair
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed: ImportError
    for flag, value in (("--dask-scheduler", "tcp://127.0.0.1:1"),
                        ("--dask-scheduler-file", fp32)):
        result = run_eprun_here("sensitivity", fp32, int8, "5", flag, value)
        assert result.code == 2
        assert result.stderr.splitlines() == [
            (f"eprun: error: {flag} needs Dask's distributed, which {sys.executable} does "
             "not have: pip install 'eprun[dask]'")]


def test_a_worker_that_cannot_read_the_models_or_reads_others_fails_the_run_naming_both(
        pair, processes, tmp_path, run_eprun_here, monkeypatch):
    """A worker on a machine without the shared folder: here, one in a mount namespace of its
    own where the models' folder is an empty tmpfs; then one with other models at those paths
    (written through the worker's own view of the files), whose numbers would differ; then
    one with the models but another build of an ``--ep-library`` given by a relative path
    (the workers read it by its absolute path, as the models)."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root to give a worker its own view of the files")
    fp32, int8 = pair
    hidden = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
              f"mount -t tmpfs none {fp32.parent} && exec \"$0\" \"$@\""]
    address, _ = scheduler_and_workers(processes, tmp_path, workers=0)
    worker = add_worker(processes, address, "elsewhere", tmp_path, prefix=hidden)
    with distributed.Client(address, timeout=30, set_as_default=False) as client:
        client.wait_for_workers(1, timeout=60)
    result = run_eprun("sensitivity", fp32, int8, "5", "--dask-scheduler", address)
    assert result.code == 4, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith("eprun: error: on Dask worker tcp://127.0.0.1:")
    assert f"cannot read {fp32}" in line
    seen = Path(f"/proc/{worker.pid}/root{fp32.parent}")  # its files, as it sees them
    shutil.copyfile(int8, seen / int8.name)
    models.save(models.chain(features=8, widths=[12, 10, 10, 8, 8, 8, 8, 6], seed=5),
                seen / fp32.name)
    result = run_eprun("sensitivity", fp32, int8, "5", "--dask-scheduler", address)
    assert result.code == 4, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith("eprun: error: on Dask worker tcp://127.0.0.1:")
    assert f"{fp32} holds other bytes there than where eprun runs" in line
    shutil.copyfile(fp32, seen / fp32.name)
    (fp32.parent / "libplugin.so").write_bytes(b"the build eprun registers")
    (seen / "libplugin.so").write_bytes(b"another build")
    monkeypatch.setattr(tool, "prepare_providers", lambda *args, **kwargs: None)  # (no EP here)
    result = run_eprun_here("sensitivity", fp32, int8, "5", "--dask-scheduler", address,
                            "--ep-library", "libplugin.so", cwd=fp32.parent)
    assert result.code == 4, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith("eprun: error: on Dask worker tcp://127.0.0.1:")
    assert (f"{fp32.parent / 'libplugin.so'} holds other bytes there than where eprun runs "
            "(workers read the files by this path") in line


def test_a_cluster_that_loses_its_last_worker_is_one_line(run_eprun_here, pair, processes,
                                                          tmp_path, monkeypatch):
    """The only worker killed while it computes a unit: no worker joins again, so eprun ends
    with one line (distributed would wait for one for ever) within about DASK_TIMEOUT."""
    fp32, int8 = pair
    monkeypatch.setattr(tool, "DASK_TIMEOUT", 1.0)
    address, _ = scheduler_and_workers(processes, tmp_path, workers=0)
    only = add_worker(processes, address, "only", tmp_path)
    with distributed.Client(address, timeout=30, set_as_default=False) as client:
        client.wait_for_workers(1, timeout=60)

    def kill_when_busy() -> None:
        deadline = time.monotonic() + 60
        while not busy_with_a_unit(address, "only") and time.monotonic() < deadline:
            time.sleep(0.02)
        os.killpg(only.pid, signal.SIGKILL)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    result = run_eprun_here("sensitivity", fp32, int8, "5", "--dask-scheduler", address)
    killer.join()
    assert result.code == 4, result.stderr
    (line,) = result.stderr.splitlines()
    assert re.fullmatch(rf"eprun: error: the Dask cluster at {address} lost its last worker, "
                        r"and none joined again within 1 s \([0-9]+ of 16 units done\)", line)


@pytest.mark.parametrize("address", ["garbage", "tcp://", "", "tcp://host",
                                     "tcp://127.0.0.1:99999", "tcp://127.0.0.1:0",
                                     "http://127.0.0.1:8786"])
def test_an_address_that_is_none_is_usage(run_eprun_here, pair, address):
    fp32, int8 = pair
    result = run_eprun_here("sensitivity", fp32, int8, "5", "--dask-scheduler", address)
    assert result.code == 2 and "is not a scheduler's address" in result.stderr


def test_jobs_and_a_cluster_together_are_usage(run_eprun_here, pair):
    fp32, int8 = pair
    result = run_eprun_here("sensitivity", fp32, int8, "5", "--jobs", "2", "--dask-scheduler",
                            "tcp://127.0.0.1:1")
    assert result.code == 2 and "give one or the other" in result.stderr
