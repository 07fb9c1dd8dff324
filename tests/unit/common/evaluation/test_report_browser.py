"""report.html as a reader sees it: a real run's page opened in headless Chromium (Debian's chromium and
chromedriver, which `make test` installs), where every figure decodes and the privacy statement shows.

The run goes through secure sums, so the page also carries the figure beside the headline that a
reader once saw called "amplified" (issue 43): the browser reads the captions the way a reader does.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from common.evaluation import plots
from common.evaluation.report import write_report
from tests.helpers import tiny_flags

pytestmark = pytest.mark.slow
PAGE_WIDTH_PX = 1200


def _tool(name: str) -> str:
    """Path of a Debian tool; a missing one fails (the check must not silently vanish)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed; `make test` installs it (or run `apt-get install chromium chromium-driver`)"
        )
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """report.html of a tiny secure-sum run with the figures `fedgan evaluate` draws (no evaluation)."""
    from simulations.cli import main

    run = tmp_path_factory.mktemp("browser") / "run"
    flags = tiny_flags(
        steps=3, synthetic_samples_per_writer=24, log_every=1, clients_per_step=3, secure_aggregation=True, out=run
    )
    assert main(["simulate", *flags]) == 0
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    kind = summary["epsilon_amplified"]["kind"]
    figs = {
        "epsilon_per_client": plots.plot_epsilon_per_client(summary, run / "plots" / "eps.png"),
        "training_curves": plots.plot_training_curves(rows, run / "plots" / "curves.png", beside_kind=kind),
        "bytes_per_step": plots.plot_bytes_per_step([summary], run / "plots" / "bytes.png"),
    }
    return write_report(run, {}, figs)


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    """Headless Chromium driven by Debian's chromedriver (named, so Selenium Manager downloads nothing)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = _tool("chromium")
    # as root Chromium refuses its sandbox; /dev/shm in containers is too small for its renderers
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", f"--window-size={PAGE_WIDTH_PX},900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(_tool("chromedriver")), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_report_opens_in_a_browser_with_every_figure_and_the_privacy_statement(report: Path, browser) -> None:
    from selenium.webdriver.common.by import By

    browser.get(report.as_uri())
    images = browser.execute_script(
        "return Array.from(document.images).map(i => [i.alt, i.complete, i.naturalWidth, i.naturalHeight])"
    )
    # three plots and the run's latest sample grid, each decoded by the browser
    assert len(images) == 4, images
    assert all(complete and width > 0 and height > 0 for _, complete, width, height in images), images

    heading = browser.find_element(By.XPATH, "//h2[normalize-space()='Privacy statement']")
    statement = heading.find_element(By.XPATH, "following-sibling::p[1]")
    assert heading.is_displayed() and statement.is_displayed()
    assert statement.get_attribute("class") == "statement"
    assert statement.size["height"] > 0 and "ε" in statement.text and "No privacy statement" not in statement.text

    caption = browser.find_element(By.CSS_SELECTOR, "figure#epsilon_per_client figcaption").text
    assert "server deviates from the secure sum" in caption and "amplified" not in caption
