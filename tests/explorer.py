"""Model Explorer's own server and headless Chromium, for tests/test_viz.py and
docs/make_images.py (both in make test-viz's venv, with Debian's chromium and chromedriver)."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def explorer(model, node_data) -> Iterator[str]:
    """Model Explorer's server on 127.0.0.1 with ``model`` and its ``node_data`` file; yield
    the URL it prints, stop it after the block."""
    port = free_port()
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "model-explorer"), str(model),
         "--extensions=model_explorer_onnx", f"--node_data_paths={node_data}",
         "--no_open_in_browser", "--host=127.0.0.1", f"--port={port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        deadline = time.monotonic() + 60
        while url is None and time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            if f"http://127.0.0.1:{port}/" in line:
                url = line.strip()
        if url is None:
            raise RuntimeError("Model Explorer's server did not start")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


@contextlib.contextmanager
def browser() -> Iterator:
    """Headless Debian chromium driven by selenium; a missing browser is an error naming what
    to install, never a skip."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for program in (CHROMIUM, CHROMEDRIVER):
        if not os.path.exists(program):
            raise RuntimeError(f"{program} is missing: make test-viz and make docs-images need "
                               "Debian's chromium and chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--enable-unsafe-swiftshader",
                 "--disable-gpu", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--no-first-run", "--disable-quic",
                 "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def page_text_with(driver, words: str, seconds: float = 60) -> str:
    """The page's text once it holds ``words`` (an error after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        text = driver.find_element("tag name", "body").text
        if words in text:
            return text
        time.sleep(0.5)
    raise RuntimeError(f"the page never showed {words!r}")
