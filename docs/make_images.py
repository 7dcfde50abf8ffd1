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
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EPRUN = [sys.executable, str(ROOT / "eprun.py")]
sys.path.insert(0, str(ROOT / "tests"))  # the server and browser test_viz.py uses
from explorer import browser, explorer, page_text_with  # noqa: E402


def eprun(*argv: str) -> None:
    subprocess.run([*EPRUN, *argv], check=True, stdout=subprocess.DEVNULL, cwd=ROOT)


def screenshot(model: Path, node_data: Path, out: Path) -> None:
    """Model Explorer's own server with the model and the node data, every layer expanded,
    captured by headless chromium."""
    from selenium import webdriver

    with explorer(model, node_data) as url, browser() as driver:
        driver.get(url)
        page_text_with(driver, "Aggregated stats")
        for icon in driver.find_elements("tag name", "mat-icon"):
            if icon.text == "unfold_more_double":  # "expand all layers"
                icon.click()
                break
        legend = driver.find_elements("xpath", "//*[normalize-space(text())='Zoom']")
        if legend:  # off the toolbar, so that no tooltip is shown
            webdriver.ActionChains(driver).move_to_element(legend[0]).perform()
        time.sleep(3)
        driver.save_screenshot(str(out))


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
