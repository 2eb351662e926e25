"""The demo as a user meets it: demo/app.py served on 127.0.0.1, driven by a real headless Chromium (Selenium).

Marked `browser` (deselected by default; `.ci/run` runs it as its own step): it needs Debian's chromium and
chromium-driver, gradio and selenium, and skips cleanly without them. Chromium resolves no host but 127.0.0.1.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    pytest.skip("needs Debian's chromium and chromium-driver", allow_module_level=True)
pytest.importorskip("gradio")
pytest.importorskip("selenium")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402
from test_demo import TESTER, app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STARTUP_S = 300  # a busy 2-core machine needs a minute to import gradio and torch


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """(url, checkpoint): the demo on a tiny fresh checkpoint, in a subprocess."""
    tmp = tmp_path_factory.mktemp("demo")
    ckpt = TESTER.save_image_classifier(tmp / "ckpt")
    port = free_port()
    env = {
        **os.environ,
        "GRADIO_ANALYTICS_ENABLED": "False",
        "OMP_NUM_THREADS": "1",
        "NI_DEMO_MODEL": str(ckpt),
    }
    log = open(tmp / "app.log", "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "demo" / "app.py"), "--host", "127.0.0.1", "--port", str(port)],
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + STARTUP_S
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"the demo exited: {(tmp / 'app.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"the demo did not start in {STARTUP_S} s: {(tmp / 'app.log').read_text()[-3000:]}"
                )
            time.sleep(1)
        yield url, ckpt
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--window-size=1400,1100",
        "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    yield driver
    driver.quit()


def summary_text(driver) -> str:
    return driver.find_element(By.ID, "summary").text.strip()


def picture(driver) -> tuple[str, int]:
    """(src, natural height) of the computational path picture, once it has loaded."""
    image = driver.find_element(By.CSS_SELECTOR, "#path img")
    height = driver.execute_script("return arguments[0].complete ? arguments[0].naturalHeight : 0;", image)
    return image.get_attribute("src"), int(height)


def wait_for(driver, expected_summary: str, old_src: str | None = None) -> tuple[str, int]:
    """Wait until the page shows `expected_summary` and a loaded picture other than old_src; return the picture."""

    def ready(d):
        try:
            if summary_text(d) != expected_summary:
                return False
            src, height = picture(d)
        except Exception:  # noqa: BLE001 - the elements are being re-rendered
            return False
        return (src, height) if height and src != old_src else False

    try:
        return WebDriverWait(driver, 120, poll_frequency=0.5).until(ready)
    except Exception:
        pytest.fail(f"expected {expected_summary!r}, the page shows {summary_text(driver)!r}")


def test_demo_in_a_browser(served, browser, tmp_path):
    url, ckpt = served
    digit = np.zeros((28, 28), dtype=np.uint8)
    digit[5:23, 12:16] = 255
    digit[5:9, 8:16] = 255  # a "1" with a flag, light on dark
    path = tmp_path / "digit.png"
    Image.fromarray(digit).save(path)
    # What the page must show, computed here from the same checkpoint.
    demo = app.InterpreterDemo(str(ckpt))
    full, short, off = (
        demo.run(Image.open(path).convert("RGB"), "mnistm", n, functions_off)
        for n, functions_off in [(2, []), (1, []), (1, ["function 1"])]
    )
    summaries = [full[2], short[2], off[2]]
    assert len(set(summaries)) == 3, summaries  # each control changes the prediction's probability

    browser.get(url)
    WebDriverWait(browser, 120).until(lambda d: d.find_elements(By.CSS_SELECTOR, "#upload input[type=file]"))
    task = browser.find_element(By.CSS_SELECTOR, "#task input")
    task.click()
    task.send_keys(Keys.CONTROL, "a")
    task.send_keys("mnistm", Keys.ENTER)
    browser.find_element(By.CSS_SELECTOR, "#upload input[type=file]").send_keys(str(path))
    src, height = wait_for(browser, summaries[0])
    label = browser.find_element(By.ID, "prediction").text
    top = max(full[0].items(), key=lambda item: item[1])[0]
    assert top in label
    browser.save_screenshot(str(tmp_path / "demo_uploaded.png"))

    number = browser.find_element(By.CSS_SELECTOR, "#iterations input[type=number]")
    number.send_keys(Keys.CONTROL, "a")
    number.send_keys("1", Keys.ENTER)
    src_short, height_short = wait_for(browser, summaries[1], old_src=src)
    assert height_short < height  # one row of panels per function iteration
    expected_picture = short[1]
    assert abs(height_short - expected_picture.height) <= 2

    browser.find_element(By.CSS_SELECTOR, "#off input[name='function 1']").click()
    src_off, height_off = wait_for(browser, summaries[2], old_src=src_short)
    assert src_off != src_short and height_off == height_short
    # the picture shown is the one the demo drew for these settings
    with urllib.request.urlopen(src_off, timeout=30) as response:
        shown = Image.open(response).convert("RGB")
    assert shown.size == off[1].size
    browser.save_screenshot(str(tmp_path / "demo_function_off.png"))
    print(f"screenshots in {tmp_path}")


def test_drawing_a_digit(served, browser, tmp_path):
    url, _ = served
    browser.get(url)
    # the Draw tab's content is rendered once the tab is opened
    tab = WebDriverWait(browser, 120).until(
        lambda d: next(
            (b for b in d.find_elements(By.XPATH, "//button[normalize-space()='Draw']") if b.is_displayed()),
            None,
        )
    )
    tab.click()
    brush = WebDriverWait(browser, 30).until(
        lambda d: d.find_element(By.CSS_SELECTOR, "#sketch button[title='Brush']")
    )
    brush.click()
    canvas = [c for c in browser.find_elements(By.CSS_SELECTOR, "#sketch canvas") if c.is_displayed()][-1]
    width, height = canvas.size["width"], canvas.size["height"]
    stroke = ActionChains(browser).move_to_element_with_offset(canvas, 0, -height // 4).click_and_hold()
    for _ in range(10):
        stroke.move_by_offset(0, height // 20)  # a vertical bar: a "1"
    stroke.release().perform()
    WebDriverWait(browser, 120, poll_frequency=0.5).until(lambda d: summary_text(d).startswith("Prediction:"))
    assert summary_text(browser).endswith("after 2 of 2 function iterations; functions off: none")
    WebDriverWait(browser, 60).until(lambda d: picture(d)[1] > 0)
    assert width > 100
    browser.save_screenshot(str(tmp_path / "demo_drawn.png"))
