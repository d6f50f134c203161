import pytest

from hf_headattn.toy_corpus import LEXICON, make_toy_corpus, translate, write_toy_corpus


def test_same_seed_same_corpus_and_different_seed_differs():
    assert make_toy_corpus(300, seed=7) == make_toy_corpus(300, seed=7)
    assert make_toy_corpus(300, seed=7) != make_toy_corpus(300, seed=8)


def test_prefix_is_stable_when_asking_for_more_pairs():
    assert make_toy_corpus(500, seed=1)[:100] == make_toy_corpus(100, seed=1)


def test_pairs_shape_lengths_and_distinct_sources():
    pairs = make_toy_corpus(2000, seed=0)
    assert len(pairs) == 2000
    assert len({src for src, _ in pairs}) == 2000
    for src, tgt in pairs:
        assert 3 <= len(src.split()) <= 12
        assert 3 <= len(tgt.split()) <= 12
        assert "\n" not in src and "\n" not in tgt
        assert src.endswith(" .") and tgt.endswith(" .")


def test_every_target_word_comes_from_the_lexicon():
    targets = set(LEXICON.values())
    for src, tgt in make_toy_corpus(2000, seed=3):
        assert all(w in LEXICON for w in src.split()), src
        assert all(w in targets for w in tgt.split()), tgt


def test_target_is_the_reference_translation():
    for src, tgt in make_toy_corpus(2000, seed=5):
        assert translate(src) == tgt


def test_dass_clause_is_verb_final_in_source_and_svo_in_target():
    assert (
        translate("ich weiß dass der kleine hund den roten ball sieht .")
        == "i know that the small dog sees the red ball ."
    )
    assert translate("sie glaubt dass er schläft .") == "she believes that he sleeps ."
    assert translate("eine junge frau findet ein buch .") == "a young woman finds a book ."
    pairs = [p for p in make_toy_corpus(1000, seed=0) if " dass " in p[0]]
    assert pairs, "the corpus should contain subordinate clauses"
    assert any(src.split()[-2] != tgt.split()[-2] for src, tgt in pairs if len(src.split()) > 7)


def test_corpus_has_variety():
    pairs = make_toy_corpus(2000, seed=0)
    source_words = {w for src, _ in pairs for w in src.split()}
    assert len(source_words) >= 60
    assert any("ß" in src or "ä" in src or "ü" in src for src, _ in pairs)


def test_translate_rejects_unknown_words():
    with pytest.raises(ValueError, match="not in the toy lexicon.*'katzen'"):
        translate("die katzen schlafen .")


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_make_toy_corpus_rejects_bad_sizes(bad):
    with pytest.raises(ValueError, match="n_pairs must be a positive int"):
        make_toy_corpus(bad)


def test_write_toy_corpus(tmp_path):
    out = tmp_path / "nested" / "toy"
    paths = write_toy_corpus(out, n_train=120, n_valid=30, seed=2, n_test=10)
    assert set(paths) == {"train.src", "train.tgt", "valid.src", "valid.tgt", "test.src", "test.tgt"}
    lines = {name: path.read_text(encoding="utf-8").splitlines() for name, path in paths.items()}
    assert [len(lines[f"{s}.src"]) for s in ("train", "valid", "test")] == [120, 30, 10]
    for split in ("train", "valid", "test"):
        assert len(lines[f"{split}.src"]) == len(lines[f"{split}.tgt"])
        assert [translate(s) for s in lines[f"{split}.src"]] == lines[f"{split}.tgt"]
    assert not set(lines["train.src"]) & set(lines["valid.src"])
    assert not set(lines["test.src"]) & (set(lines["train.src"]) | set(lines["valid.src"]))
    pairs = make_toy_corpus(160, seed=2)
    assert list(zip(lines["train.src"], lines["train.tgt"])) == pairs[:120]


def test_write_toy_corpus_without_test_split_and_validation(tmp_path):
    paths = write_toy_corpus(tmp_path, n_train=10, n_valid=5)
    assert sorted(paths) == ["train.src", "train.tgt", "valid.src", "valid.tgt"]
    assert not (tmp_path / "test.src").exists()
    with pytest.raises(ValueError, match="n_valid must be an int >= 0"):
        write_toy_corpus(tmp_path, n_train=10, n_valid=-1)
