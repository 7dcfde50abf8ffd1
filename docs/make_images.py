"""Make the README's two pictures (``make docs-images``): Model Explorer showing eprun's
per-boundary error on the lab's quantized model, and the growth plot of the same pair.

Runs in make test-viz's venv (Model Explorer, its ONNX adapter, matplotlib, selenium) with
Debian's chromium and chromium-driver. Everything it shows comes from eprun commands run here:

    eprun.py layers fp32.onnx int8.onnx 2026 --node-data DIR      (the overlay)
    eprun.py growth fp32.onnx int8.onnx 2026 --local --save-plots DIR    (the plot)

Usage: python docs/make_images.py [--out docs/images]
"""
from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EPRUN = [sys.executable, str(ROOT / "eprun.py")]


def eprun(*argv: str) -> None:
    subprocess.run([*EPRUN, *argv], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def screenshot(model: Path, node_data: Path, out: Path) -> None:
    """Model Explorer's own server with the model and the node data, every layer expanded,
    captured by headless chromium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    port = free_port()
    server = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "model-explorer"), str(model),
         "--extensions=model_explorer_onnx", f"--node_data_paths={node_data}",
         "--no_open_in_browser", "--host=127.0.0.1", f"--port={port}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for flag in ("--headless=new", "--no-sandbox", "--enable-unsafe-swiftshader",
                 "--disable-gpu", "--disable-background-networking", "--disable-sync",
                 "--disable-component-update", "--no-first-run", "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = None
    try:
        url = None
        while url is None:
            line = server.stdout.readline()
            if not line:
                raise SystemExit("Model Explorer's server did not start")
            if f"http://127.0.0.1:{port}/" in line:
                url = line.strip()
        driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        driver.get(url)
        deadline = time.monotonic() + 60
        while "Aggregated stats" not in driver.find_element("tag name", "body").text:
            if time.monotonic() > deadline:
                raise SystemExit("the page never showed the node data")
            time.sleep(0.5)
        for icon in driver.find_elements("tag name", "mat-icon"):
            if icon.text == "unfold_more_double":  # "expand all layers"
                icon.click()
                break
        legend = driver.find_elements("xpath", "//*[normalize-space(text())='Zoom']")
        if legend:  # off the toolbar, so that no tooltip is shown
            webdriver.ActionChains(driver).move_to_element(legend[0]).perform()
        time.sleep(3)
        driver.save_screenshot(str(out))
    finally:
        if driver is not None:
            driver.quit()
        server.terminate()
        server.wait(timeout=30)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "images"))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="eprun-images-") as work:
        eprun("layers", "fp32.onnx", "int8.onnx", "2026", "--node-data", work)
        screenshot(ROOT / "int8.onnx", Path(work) / "int8.rel_error.json",
                   out / "model_explorer_rel_error.png")
        eprun("growth", "fp32.onnx", "int8.onnx", "2026", "--local", "--save-plots", work)
        shutil.copyfile(Path(work) / "int8.growth.rel_error.png", out / "growth_rel_error.png")
    print(f"wrote {out / 'model_explorer_rel_error.png'} and {out / 'growth_rel_error.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
