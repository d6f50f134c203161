"""The web demo in a real browser (slow): `hf-headattn-app` serves two variants, the demo's softmax and csparsemax
Transformers, and headless Chromium, driven by Playwright, types two sentences, presses Translate, and finds each
model's translation, a heat map with one cell per (target word, source word), and csparsemax's fertility bars;
choosing a head redraws the map. The page's screenshot is saved as a test artifact ($HF_HEADATTN_TEST_ARTIFACTS,
default test-artifacts/), the one docs/translating.md shows."""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from helpers import REPO, free_port

ARTIFACTS = Path(os.environ.get("HF_HEADATTN_TEST_ARTIFACTS", REPO / "test-artifacts"))
SENTENCES = ["der kleine hund sieht die katze .", "eine frau liest ein buch ."]
# Debian's chromium; Playwright only drives it (its own browser downloads are not used)
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str | None:
    for candidate in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def wait_for_page(url: str, server: subprocess.Popen, log: Path, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            urllib.request.urlopen(url, timeout=5)
            return
        except OSError:
            assert server.poll() is None, f"the app exited:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the app did not answer within {seconds:.0f} s"
            time.sleep(1)


def choose(page, dropdown_id: str, option: str) -> None:
    """Pick `option` in a Gradio dropdown, as a person does: open it and click the option."""
    page.locator(f"#{dropdown_id} input").click()
    page.get_by_role("option", name=option, exact=True).click()


@pytest.mark.slow
def test_two_variants_side_by_side_in_a_real_browser(tmp_path):
    pytest.importorskip("gradio", reason="the web demo needs gradio: pip install -e .[app]")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs Playwright: pip install "
                                                                  "playwright")
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium to drive: apt-get install chromium (Debian's package)")
    from hf_headattn import demo
    from hf_headattn.loading import load_model_and_tokenizer
    from hf_headattn.translation import translate

    folders = []
    for variant in ("softmax", "csparsemax"):  # the demo's recipe: about a minute each on 2 cores
        demo.run(tmp_path / variant, cross_attention=variant)
        folders.append(tmp_path / variant / "model")

    port, log = free_port(), tmp_path / "app.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False"}
    with log.open("w") as output:
        # folders named as a user names them, relative to where the command runs: the page shows them so
        server = subprocess.Popen([sys.executable, "-m", "hf_headattn.commands.app", "--model", "softmax/model", "--model",
                                   "csparsemax/model", "--port", str(port)], cwd=tmp_path, env=env, stdout=output,
                                  stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}/"
        wait_for_page(url, server, log)
        with sync_api.sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                tempfile.mkdtemp(dir=tmp_path, prefix="chromium-profile-"), executable_path=executable,
                headless=True, args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000})
            try:
                page = context.new_page()
                page.goto(url)
                page.locator("#source-text textarea").fill("\n".join(SENTENCES))
                page.locator("#translate").click()
                for panel in (0, 1):
                    page.locator(f"#translations-{panel} .translation-text").first.wait_for(timeout=120_000)
                shown = [page.locator(f"#translations-{panel} .translation-text").all_inner_texts() for panel in (0, 1)]
                rows = [page.locator(f"#heatmap-{panel} tbody tr").count() for panel in (0, 1)]
                columns = [page.locator(f"#heatmap-{panel} thead th.hm-source").count() for panel in (0, 1)]
                heatmap_cells = [page.locator(f"#heatmap-{panel} td.hm-cell").count() for panel in (0, 1)]
                fertility_bars = page.locator("#fertility-1 .fert-bar").count()
                links = page.locator("#links-0 line.link").count()
                caption = page.locator("#heatmap-0 caption").inner_text()
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "app_side_by_side.png"), full_page=True)

                choose(page, "heads-0", "head 1")  # interactive: another head, another map
                page.locator("#heatmap-0 caption", has_text="head 1").wait_for(timeout=60_000)
                page.locator("#source-text textarea").fill("   ")  # empty input: a message, not an error
                page.locator("#translate").click()
                page.locator("#page-notice", has_text="Nothing to translate").wait_for(timeout=60_000)
            finally:
                context.close()
    finally:
        server.terminate()
        server.wait(timeout=60)

    for panel, folder in enumerate(folders):
        model, tokenizer = load_model_and_tokenizer(folder)
        expected = translate(model, tokenizer, SENTENCES, num_beams=4, max_new_tokens=64, alignments=True)
        if panel == 0:
            softmax_links = len(expected[0].hypotheses[0].alignment.split())
        assert shown[panel] == [translation.text for translation in expected]
        # the first sentence's best translation: one row per target word and </s>, one column per source word and
        # </s>, plus csparsemax's sink column where its rows sum below one
        assert rows[panel] == len(expected[0].text.split()) + 1
        assert columns[panel] - (len(SENTENCES[0].split()) + 1) in ((0,) if panel == 0 else (0, 1))
        assert heatmap_cells[panel] == rows[panel] * columns[panel]
    assert links == softmax_links > 0
    heads, layers = model.config.decoder_attention_heads, model.config.decoder_layers
    source_tokens = len(tokenizer(SENTENCES[0])["input_ids"])
    assert fertility_bars == heads * layers * source_tokens  # csparsemax in every layer: a bar per head and token
    assert caption.startswith("what the alignment reads")
    assert (ARTIFACTS / "app_side_by_side.png").stat().st_size > 10_000
    assert "Traceback" not in log.read_text()
