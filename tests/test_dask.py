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
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import models
import pytest
from conftest import PROGRAM, run_eprun

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


def test_a_scheduler_file_of_dask_processes_and_a_killed_worker(pair, alone, processes,
                                                               tmp_path):
    """The scheduler file names the cluster; a worker killed (SIGKILL) while it computes a
    unit is the cluster's business: its task runs again on the other, the answer is the same."""
    fp32, int8 = pair
    address, schedule = scheduler_and_workers(processes, tmp_path, workers=1)
    victim = add_worker(processes, address, "victim", tmp_path)
    with distributed.Client(address, timeout=30, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
    running = subprocess.Popen([*PROGRAM, "sensitivity", str(fp32), str(int8), "5",
                                "--dask-scheduler-file", str(schedule)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not busy_with_a_unit(address, "victim") and running.poll() is None \
            and time.monotonic() < deadline:
        time.sleep(0.02)
    assert running.poll() is None, "the run ended before the victim took a unit"
    os.killpg(victim.pid, signal.SIGKILL)
    out, err = running.communicate(timeout=300)
    assert running.returncode == 0, err
    assert out == alone


def test_a_dead_address_is_one_line_within_a_bounded_time(run_eprun_here, pair, monkeypatch):
    fp32, int8 = pair
    monkeypatch.setattr(tool, "DASK_TIMEOUT", 0.3)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts, never answers: distributed's own client would wait for ever
    silent = f"tcp://127.0.0.1:{listener.getsockname()[1]}"
    closed = f"tcp://127.0.0.1:{free_port()}"
    try:
        for address in (closed, silent):
            started = time.monotonic()
            result = run_eprun_here("sensitivity", fp32, int8, "5", "--dask-scheduler",
                                    address)
            assert result.code == 4, result.stderr
            (line,) = result.stderr.splitlines()
            assert line.startswith(f"eprun: error: cannot reach the Dask scheduler at {address}")
            assert time.monotonic() - started < 10
    finally:
        listener.close()


def test_without_distributed_it_is_usage_naming_the_extra(run_eprun_here, pair, monkeypatch):
    fp32, int8 = pair
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed: ImportError
    result = run_eprun_here("sensitivity", fp32, int8, "5", "--dask-scheduler",
                            "tcp://127.0.0.1:1")
    assert result.code == 2
    assert result.stderr.splitlines() == [
        (f"eprun: error: --dask-scheduler needs Dask's distributed, which {sys.executable} does "
        "not have: pip install 'eprun[dask]'")]


def test_a_worker_that_cannot_read_the_models_fails_the_run_naming_both(pair, processes,
                                                                         tmp_path):
    """A worker on a machine without the shared folder: here, one in a mount namespace of its
    own where the models' folder is an empty tmpfs."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root to give a worker its own view of the files")
    fp32, int8 = pair
    hidden = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
              f"mount -t tmpfs none {fp32.parent} && exec \"$0\" \"$@\""]
    address, _ = scheduler_and_workers(processes, tmp_path, workers=1, prefix=hidden)
    result = run_eprun("sensitivity", fp32, int8, "5", "--dask-scheduler", address)
    assert result.code == 4, result.stderr
    line = result.stderr.splitlines()[-1]
    assert line.startswith("eprun: error: on Dask worker tcp://127.0.0.1:")
    assert str(fp32) in line


@pytest.mark.parametrize("address", ["garbage", "tcp://", "", "tcp://host"])
def test_an_address_that_is_none_is_usage(run_eprun_here, pair, address):
    fp32, int8 = pair
    result = run_eprun_here("sensitivity", fp32, int8, "5", "--dask-scheduler", address)
    assert result.code == 2 and "is not a scheduler's address" in result.stderr


def test_jobs_and_a_cluster_together_are_usage(run_eprun_here, pair):
    fp32, int8 = pair
    result = run_eprun_here("sensitivity", fp32, int8, "5", "--jobs", "2", "--dask-scheduler",
                            "tcp://127.0.0.1:1")
    assert result.code == 2 and "give one or the other" in result.stderr
