"""The web demo in a real browser (slow): `hf-headattn-app` serves two variants, the demo's softmax and csparsemax
Transformers, and headless Chromium, driven by Playwright, finds the card's example as the text box's hint, types two
sentences, presses Translate, and finds each model's translation, a heat map with one cell per (target word, source
word, "katze." split into "katze" and ".") and its colour bar, every head's small map and statistics (csparsemax's
exact zeros hatched), the difference of the two maps, and csparsemax's fertility bars; the panels stay level and
the dropdowns' text clear of their arrows; one heads choice redraws both panels' maps. The page's screenshot is
saved as a test artifact ($HF_HEADATTN_TEST_ARTIFACTS, default test-artifacts/), the one docs/translating.md
shows."""

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
SENTENCES = ["der kleine hund sieht die katze.", "eine frau liest ein buch ."]  # the first's full stop attached
CARD_EXAMPLE = "ein mann sieht den hund ."
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


def text_clear_of_arrow(page, dropdown_id: str) -> bool:
    """Whether a dropdown shows its whole value, and ends it before the arrow drawn over the input's right end."""
    return page.locator(f"#{dropdown_id}").evaluate("""element => {
        const input = element.querySelector("input"), arrow = element.querySelector(".icon-wrap");
        const textEnd = input.getBoundingClientRect().right - parseFloat(getComputedStyle(input).paddingRight);
        return input.value.length > 0 && input.scrollWidth <= input.clientWidth
            && textEnd <= arrow.getBoundingClientRect().left;
    }""")


def tops(page, selector: str) -> list[float]:
    """The top of the first element `selector` finds in each panel (`{panel}` stands for the panel's number)."""
    return [page.locator(selector.format(panel=panel)).first.bounding_box()["y"] for panel in (0, 1)]


def write_card(model_dir: Path) -> None:
    """The part of a model card (hf-headattn-hub card) the page reads its examples from."""
    (model_dir / "README.md").write_text(
        "# demo\n\nThe first test sentences:\n\n| source | this model | reference |\n|---|---|---|\n"
        f"| {CARD_EXAMPLE} | a man sees the dog . | a man sees the dog . |\n", encoding="utf-8")


@pytest.mark.slow
def test_two_variants_side_by_side_in_a_real_browser(tmp_path):
    pytest.importorskip("gradio", reason="the web demo needs gradio: pip install -e .[app]")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the browser test needs Playwright: pip install "
                                                                  "playwright")
    executable = chromium()
    if executable is None:
        pytest.skip("no Chromium to drive: apt-get install chromium (Debian's package)")
    from hf_headattn import demo
    from hf_headattn.app.views import split_word
    from hf_headattn.loading import load_model_and_tokenizer
    from hf_headattn.translation import translate

    folders = []
    for variant in ("softmax", "csparsemax"):  # the demo's recipe: about a minute each on 2 cores
        demo.run(tmp_path / variant, cross_attention=variant)
        folders.append(tmp_path / variant / "model")
    write_card(folders[0])

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
                hint = page.locator("#source-text textarea").get_attribute("placeholder")
                page.get_by_text(CARD_EXAMPLE, exact=True).first.wait_for(timeout=60_000)
                example_buttons = page.get_by_text(CARD_EXAMPLE, exact=True).count()
                page.locator("#source-text textarea").fill("\n".join(SENTENCES))
                page.locator("#translate").click()
                for panel in (0, 1):
                    page.locator(f"#translations-{panel} .translation-text").first.wait_for(timeout=120_000)
                page.locator("#difference .map-caption").wait_for(timeout=60_000)
                shown = [page.locator(f"#translations-{panel} .translation-text").all_inner_texts() for panel in (0, 1)]
                rows = [page.locator(f"#heatmap-{panel} tbody tr").count() for panel in (0, 1)]
                source_labels = [page.locator(f"#heatmap-{panel} thead th.hm-source").all_inner_texts()
                                 for panel in (0, 1)]
                heatmap_cells = [page.locator(f"#heatmap-{panel} td.hm-cell").count() for panel in (0, 1)]
                colour_bars = [page.locator(f"#heatmap-{panel} .colour-bar").count() for panel in (0, 1)]
                small_maps = [page.locator(f"#grid-{panel} figure.small-map").count() for panel in (0, 1)]
                statistics = [page.locator(f"#statistics-{panel} td.sparsity").all_inner_texts() for panel in (0, 1)]
                hatched = [page.locator(f"#grid-{panel} td.hm-zero").count() for panel in (0, 1)]
                difference_cells = page.locator("#difference table.hm-difference td.hm-cell").count()
                difference_caption = page.locator("#difference .map-caption").inner_text()
                fertility_bars = page.locator("#fertility-1 .fert-bar").count()
                links = page.locator("#links-0 line.link").count()
                caption = page.locator("#heatmap-0 .map-caption").inner_text()
                clear_of_arrows = {dropdown: text_clear_of_arrow(page, dropdown)
                                   for dropdown in ("model-0", "model-1", "show-0", "layer", "heads")}
                level = {section: tops(page, f"#{section}-{{panel}}") for section in
                         ("translations", "heatmap", "grid", "links", "fertility")}
                level["map"] = tops(page, "#heatmap-{panel} table")
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=str(ARTIFACTS / "app_side_by_side.png"), full_page=True)

                choose(page, "heads", "head 1")  # one choice, both panels: another head, other maps
                for panel in (0, 1):
                    page.locator(f"#heatmap-{panel} .map-caption", has_text="head 1").wait_for(timeout=60_000)
                page.locator("#difference .map-caption", has_text="head 1").wait_for(timeout=60_000)
                chosen_rows = [page.locator(f"#statistics-{panel} tr.chosen").inner_text() for panel in (0, 1)]
                page.set_viewport_size({"width": 900, "height": 1000})  # narrower: captions wrap, panels stay level
                narrow_map_tops = tops(page, "#heatmap-{panel} table")
                page.locator("#source-text textarea").fill("   ")  # empty input: a message, not an error
                page.locator("#translate").click()
                page.locator("#page-notice", has_text="Nothing to translate").wait_for(timeout=60_000)
            finally:
                context.close()
    finally:
        server.terminate()
        server.wait(timeout=60)

    assert hint == CARD_EXAMPLE and example_buttons == 1  # the card's examples, not a fixed sentence
    people_words = [piece for word in SENTENCES[0].split() for piece in split_word(word)]
    assert people_words[-2:] == ["katze", "."]
    for panel, folder in enumerate(folders):
        model, tokenizer = load_model_and_tokenizer(folder)
        expected = translate(model, tokenizer, SENTENCES, num_beams=4, max_new_tokens=64, alignments=True)
        if panel == 0:
            softmax_links = len(expected[0].hypotheses[0].alignment.split())
        assert shown[panel] == [translation.text for translation in expected]
        # the first sentence's best translation: one row per target word and </s>, one column per source word
        # ("katze." two: "katze" and ".") and </s>, plus csparsemax's sink column where its rows sum below one
        target_words = expected[0].text.split()
        assert len(target_words) + 1 <= rows[panel] <= sum(len(split_word(word)) for word in target_words) + 1
        sink = source_labels[panel][len(people_words) + 1:]
        assert source_labels[panel][:len(people_words) + 1] == [*people_words, "</s>"]
        assert sink in ([[]] if panel == 0 else [[], ["sink"]])
        assert heatmap_cells[panel] == rows[panel] * len(source_labels[panel]) and colour_bars[panel] == 1
    assert links == softmax_links > 0
    heads, layers = model.config.decoder_attention_heads, model.config.decoder_layers
    assert small_maps == [heads, heads] and [len(shares) for shares in statistics] == [heads, heads]
    def largest_share(shares):
        return max(int(share.removesuffix("%")) for share in shares)

    assert largest_share(statistics[1]) > largest_share(statistics[0])  # csparsemax's exact zeros, hatched
    assert hatched[1] > hatched[0]
    assert difference_cells > 0 and difference_caption.startswith("A − B")
    assert [row.split()[:2] for row in chosen_rows] == [["head", "1"], ["head", "1"]]
    source_tokens = len(tokenizer(SENTENCES[0])["input_ids"])
    assert fertility_bars == heads * layers * source_tokens  # csparsemax in every layer: a bar per head and token
    assert caption.startswith("what the alignment reads")
    assert clear_of_arrows == dict.fromkeys(clear_of_arrows, True)
    for section, (left, right) in {**level, "narrow map": narrow_map_tops}.items():
        assert abs(left - right) <= 1, f"the panels' {section} sections are not level: {left} and {right}"
    assert (ARTIFACTS / "app_side_by_side.png").stat().st_size > 10_000
    assert "Traceback" not in log.read_text()
