"""`pip install .` gives a package of one module, eprun.py, with a working `eprun` command.

The wheel is built offline from a copy of the repository (the build backend, flit_core, is
pinned in the dev requirements, hence --no-build-isolation), then installed into a fresh venv
that sees the test interpreter's packages (onnx, onnxruntime, numpy, pip) through a .pth file:
nothing is downloaded, and pip still checks the wheel's dependencies against that stack.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import zipfile
from importlib import metadata
from pathlib import Path

import models
import pytest
from conftest import ROOT

import eprun

# No pip configuration file (a machine's index or constraints), no prompt, no version check.
PIP_ENV = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INPUT": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
# Never copied: environments, caches and build leftovers.
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info",
                                    "__pycache__", ".pytest_cache", ".hypothesis")
COPY = "eprun-src"  # the copy's folder, next to the wheel's


def run(*command, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                          timeout=180, env=PIP_ENV, **kwargs)
    assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from a copy of the repository (the checkout is never written to)."""
    backend = metadata.version("flit_core")
    assert int(backend.split(".")[0]) >= 3, \
        f"flit_core {backend} cannot build eprun; install the pinned dev requirements"
    work = tmp_path_factory.mktemp("build")
    source = work / COPY
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    run(sys.executable, "-m", "pip", "wheel", source, "--no-deps", "--no-index",
        "--no-build-isolation", "--wheel-dir", work / "dist")
    (built,) = (work / "dist").glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """A fresh venv with the wheel installed; returns its scripts folder."""
    venv = tmp_path_factory.mktemp("install") / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    scripts = venv / "bin"
    python = scripts / "python"
    # The venv's own site-packages comes first on its path; the test interpreter's follow.
    own = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
               .stdout.strip())
    stack = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
                          + ([site.getusersitepackages()] if site.ENABLE_USER_SITE else []))
    (own / "test-stack.pth").write_text("".join(f"{path}\n" for path in stack))
    # The venv's Python runs that pip and installs into the venv. Without --no-deps, pip must find
    # the wheel's requirements satisfied by the stack; --no-index forbids fetching anything.
    run(python, "-m", "pip", "install", "--no-index", wheel)
    return scripts


def test_the_wheel_holds_eprun_py_and_nothing_else(wheel):
    assert wheel.name == f"eprun-{eprun.__version__}-py3-none-any.whl"
    info = f"eprun-{eprun.__version__}.dist-info/"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        module = archive.read("eprun.py")
        metadata = archive.read(info + "METADATA").decode()
        entry_points = archive.read(info + "entry_points.txt").decode()
    # No gen_ep.py, bench/, tests/, models or deliverables: the module and its metadata only.
    assert [name for name in names if not name.startswith(info)] == ["eprun.py"]
    assert module == (wheel.parent.parent / COPY / "eprun.py").read_bytes()
    assert f"Version: {eprun.__version__}\n" in metadata
    assert "Requires-Python: >=3.9\n" in metadata
    for requirement in ("onnx>=1.15", "onnxruntime>=1.16", "numpy>=1.24"):
        assert f"Requires-Dist: {requirement}\n" in metadata
    assert re.search(r"\[console_scripts\]\neprun ?= ?eprun:cli\n", entry_points)


def test_the_installed_command_runs_the_installed_module(installed, tmp_path):
    python = installed / "python"
    where = run(python, "-c", "import eprun; print(eprun.__file__)", cwd=tmp_path).stdout.strip()
    assert Path(where).parent.name == "site-packages"
    assert Path(installed.parent) in Path(where).parents

    # (eprun prints its version through argparse's exit, to stderr)
    proc = run(installed / "eprun", "--version", cwd=tmp_path)
    version = proc.stdout + proc.stderr
    assert version.startswith(f"eprun {eprun.__version__} (onnx ")

    model = models.save(models.ops_graph(["MatMul", "Relu", "MatMul"]), tmp_path / "m.onnx")
    answer = json.loads(run(installed / "eprun", "partition", model.name, "MatMul",
                            cwd=tmp_path).stdout)
    assert (answer["nodes"], answer["claimed"], answer["partition_count"]) == (3, 2, 3)


def test_a_failing_command_keeps_its_exit_code(installed, tmp_path):
    proc = subprocess.run([str(installed / "eprun"), "partition", "nope.onnx", "MatMul"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert (proc.returncode, proc.stdout) == (3, "")
    assert proc.stderr.startswith("eprun: error: ")
