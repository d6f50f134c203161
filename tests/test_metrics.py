"""Tests for hf_headattn.metrics: REP, DROP, corpus BLEU/chrF/TER, BLEU by length and the shipped evaluate modules."""

import os
import warnings
from pathlib import Path

import numpy as np
import pytest
import sacrebleu

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import hf_headattn  # noqa: E402
from hf_headattn.metrics import (  # noqa: E402
    METRIC_MODULES,
    align_for_drop,
    all_metrics,
    bleu_by_length,
    corpus_scores,
    drop_counts,
    drop_details,
    drop_score,
    length_bucket,
    length_bucket_labels,
    load_metric,
    metric_path,
    paired_bootstrap_p,
    rep_score,
    rep_sentence_counts,
    rep_sentence_score,
)


# ---------------------------------------------------------------------------------------------------------------
# REP
# ---------------------------------------------------------------------------------------------------------------


def sigma(hypothesis, reference, **kwargs):
    return rep_sentence_score(hypothesis.split(), reference.split(), **kwargs)


def test_rep_repeated_bigram_partly_in_reference():
    # Output bigrams: (the, cat) x2, (cat, sat) x2, (sat, on), (on, the); the reference has each once.
    # Term 1: (2 - 1) + (2 - 1) = 2; no (w, w) bigram.
    assert sigma("the cat sat on the cat sat", "the cat sat on the mat") == 2
    assert rep_score(["the cat sat on the cat sat"], ["the cat sat on the mat"]) == pytest.approx(100 * 2 / 6)


def test_rep_repeated_bigram_absent_from_reference_counts_fully():
    # (a, b) x2 absent from the reference: its full count 2; (b, a) occurs once: ignored.
    assert sigma("a b a b", "x y") == 2
    # Three times, absent: 3 (every other bigram of "a b x a b y a b" occurs once).
    assert sigma("a b x a b y a b", "p q") == 3
    # "a b a b a b": (a, b) x3 and (b, a) x2, both absent: 3 + 2.
    assert sigma("a b a b a b", "p q") == 5


def test_rep_repetition_licensed_by_reference():
    # The reference has (a, b) twice: max(0, 2 - 2) = 0; three times in the output: 3 - 2 = 1.
    assert sigma("a b a b", "a b c a b") == 0
    assert sigma("a b x a b y a b", "a b c a b") == 1


def test_rep_bigrams_seen_once_are_ignored():
    assert sigma("a b c d", "x y") == 0


def test_rep_repeated_word_bigram_counts_at_any_count():
    # (dog, dog) occurs once: term 1 ignores it (count < 2), term 2 adds 2 * max(0, 1 - 0) = 2.
    assert sigma("a dog dog", "a dog") == 2
    assert rep_score(["a dog dog"], ["a dog"]) == pytest.approx(100.0)
    # Twice ("dog dog dog"): term 1 adds 2, term 2 adds 2 * 2 -> 6.
    assert sigma("dog dog dog", "dog") == 6
    # The reference's own (very, very) licenses one occurrence.
    assert sigma("very very good", "very very good") == 0
    # (very, very) x2 against 1 in the reference: term 1 (2 - 1) = 1, term 2 2 * (2 - 1) = 2.
    assert sigma("very very very good", "very very good") == 3


def test_rep_weights_and_order():
    assert sigma("dog dog dog", "dog", lambda2=0.0) == 2
    assert sigma("dog dog dog", "dog", lambda1=0.0) == 4
    assert sigma("dog dog dog", "dog", lambda1=0.5, lambda2=3.0) == pytest.approx(0.5 * 2 + 3 * 2)
    # n = 3: (a, b, c) x2 absent from the reference -> 2; the (w, w) term still uses bigrams (none here).
    assert sigma("a b c a b c", "x", n=3) == 2
    assert sigma("a a a a", "x", n=3) == 2 + 2 * 3  # (a, a, a) x2 -> 2; (a, a) x3 -> 2 * 3
    with pytest.raises(ValueError, match="n must be"):
        sigma("a b", "a b", n=0)


def test_rep_corpus_normalisation_and_empty_hypothesis():
    hypotheses = ["a dog dog", "", "the cat sat on the cat sat"]
    references = ["a dog", "one two three", "the cat sat on the mat"]
    # sigma = 2, 0 (empty hypothesis: no bigrams), 2; reference words = 2 + 3 + 6 = 11.
    assert sigma("", "one two three") == 0
    assert rep_score(hypotheses, references) == pytest.approx(100 * 4 / 11)
    assert rep_score(["", ""], ["a b", "c"]) == 0.0
    assert rep_score(references, references) == 0.0


def test_rep_tokenisation():
    hypothesis, reference = "the dog. the dog.", "the dog."
    # Whitespace words: (the, dog.) x2 against 1 -> 1. Reference words: 2.
    assert rep_score([hypothesis], [reference]) == pytest.approx(100 * 1 / 2)
    # 13a splits off the full stops: (the, dog) x2 and (dog, .) x2, each against 1 -> 2. Reference words: 3.
    assert rep_score([hypothesis], [reference], tokenize="13a") == pytest.approx(100 * 2 / 3)
    assert rep_score([hypothesis], [reference], tokenize=lambda s: s.replace(".", " .").split()) == pytest.approx(
        100 * 2 / 3
    )
    with pytest.raises(ValueError, match="Unknown tokenize"):
        rep_score([hypothesis], [reference], tokenize="moses")


def test_rep_sentence_counts_are_what_rep_score_sums():
    hypotheses, references = ["the dog dog barks", "a cat"], ["the dog barks", "a black cat"]
    assert rep_sentence_counts(hypotheses, references) == [(2.0, 3), (0.0, 3)]  # "dog dog" absent: lambda2 * 1
    assert rep_score(hypotheses, references) == pytest.approx(100 * 2 / 6)


def test_rep_input_errors():
    with pytest.raises(ValueError, match="Mismatched"):
        rep_score(["a"], ["a", "b"])
    with pytest.raises(ValueError, match="Empty input"):
        rep_score([], [])
    with pytest.raises(ValueError, match="reference words"):
        rep_score(["a a"], [""])
    with pytest.raises(TypeError, match="single string"):
        rep_score("a b", "a b")
    with pytest.raises(TypeError, match="one reference per sentence"):
        rep_score(["a b"], [["a b", "a c"]])


# ---------------------------------------------------------------------------------------------------------------
# DROP with hand-made alignments
# ---------------------------------------------------------------------------------------------------------------

SOURCES = ["a b c", "d e", "f g"]
REFERENCES = ["x y z", "u v", "w"]
HYPOTHESES = ["x z", "u", ""]
# Sentence 0: R = {0, 1, 2}, H = {0, 2}: word 1 dropped.
# Sentence 1: no reference links at all: R = {} (nothing to drop, not counted), whatever H is.
# Sentence 2: R = {0} (two links of source word 0, one link of the same pair repeated); empty hypothesis: H = {}.
REFERENCE_ALIGNMENTS = [[(0, 0), (1, 1), (2, 2)], [], [(0, 0), (0, 0)]]
HYPOTHESIS_ALIGNMENTS = [[(0, 0), (2, 1)], [(0, 0)], []]


def test_drop_hand_made_alignments():
    assert drop_counts(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS) == (2, 4)
    details = drop_details(SOURCES, HYPOTHESES, REFERENCES, alignments=(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS))
    assert (details["drop"], details["dropped_words"], details["reference_aligned_words"]) == (50.0, 2, 4)
    assert details["reference_alignments"] == [[(0, 0), (1, 1), (2, 2)], [], [(0, 0), (0, 0)]]
    score = drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS))
    assert score == pytest.approx(100 * 2 / 4)  # 2 dropped of 4 reference-aligned source words (not of 7 words)
    as_mapping = {"reference_alignments": REFERENCE_ALIGNMENTS, "hypothesis_alignments": HYPOTHESIS_ALIGNMENTS}
    assert drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=as_mapping) == score
    pharaoh = (["0-0 1-1 2-2", "", "0-0 0-0"], ["0-0 2-1", "0-0", ""])
    assert drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=pharaoh) == score


def test_drop_sentence_counts_sum_to_the_score_pooled_over_runs(monkeypatch):
    details = drop_details(SOURCES, HYPOTHESES, REFERENCES, alignments=(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS))
    assert details["sentence_counts"] == [(1, 3), (0, 0), (1, 1)]
    # Two alignment runs: per sentence, the mean of the runs' counts, and DROP the ratio of their sums.
    all_dropped = [[(0, 0), (1, 1), (2, 2)], [], [(0, 0)]]
    runs = [(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS), (all_dropped, [[], [], []])]
    monkeypatch.setattr(hf_headattn.metrics.drop, "drop_alignment_runs", lambda *args, **kwargs: (runs, {"runs": 2}))
    details = drop_details(SOURCES, HYPOTHESES, REFERENCES, train_sources=SOURCES, train_targets=REFERENCES)
    assert details["sentence_counts"] == [(2.0, 3.0), (0.0, 0.0), (1.0, 1.0)]
    assert details["drop"] == pytest.approx(100 * 6 / 8) and details["drop_runs"] == [50.0, 100.0]


def test_drop_identical_alignments_and_one_to_many_links():
    assert drop_score(SOURCES, REFERENCES, REFERENCES, alignments=(REFERENCE_ALIGNMENTS, REFERENCE_ALIGNMENTS)) == 0
    # A source word linked to any hypothesis word is not dropped, even if it links to fewer words than before.
    assert drop_counts([[(0, 0), (0, 1), (1, 2)]], [[(0, 2)]]) == (1, 2)
    # Hypothesis links of source words without reference links change nothing.
    assert drop_counts([[(0, 0)]], [[(0, 0), (1, 0), (2, 0)]]) == (0, 1)


def test_drop_no_links_anywhere():
    empty = [[], [], []]
    with pytest.warns(UserWarning, match="No source word is aligned"):
        assert drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=(empty, empty)) == 0.0
    # Reference links but an entirely unaligned output: everything reference-aligned is dropped.
    assert drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=(REFERENCE_ALIGNMENTS, empty)) == 100.0


def test_drop_alignment_errors():
    with pytest.raises(ValueError, match="out of range"):  # source "d e" has 2 words
        drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=([[], [(2, 0)], []], [[], [], []]))
    with pytest.raises(ValueError, match="out of range"):  # hypothesis "u" has 1 word
        drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=([[], [], []], [[], [(0, 1)], []]))
    with pytest.raises(ValueError, match="entries for 3 sentences"):
        drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=([[], []], [[], [], []]))
    with pytest.raises(ValueError, match="cannot parse"):
        drop_score(SOURCES, HYPOTHESES, REFERENCES, alignments=(["0:0", "", ""], ["", "", ""]))
    with pytest.raises(ValueError, match="not both"):
        drop_score(
            SOURCES, HYPOTHESES, REFERENCES, alignments=(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS), train_sources=[]
        )
    with pytest.raises(ValueError, match="Mismatched"):
        drop_score(SOURCES, HYPOTHESES[:2], REFERENCES, alignments=(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS))
    with pytest.raises(ValueError, match="Empty input"):
        drop_score([], [], [], alignments=([], []))
    with pytest.raises(ValueError, match="both train_sources and train_targets"):
        drop_score(SOURCES, HYPOTHESES, REFERENCES, train_sources=["a"])


# ---------------------------------------------------------------------------------------------------------------
# DROP with eflomal on a synthetic corpus
# ---------------------------------------------------------------------------------------------------------------


def test_drop_with_eflomal_on_toy_corpus():
    from hf_headattn.toy_corpus import make_toy_corpus

    pairs = make_toy_corpus(1540, seed=3)
    train, test = pairs[:1500], pairs[1500:]
    train_sources, train_targets = [s for s, _ in train], [t for _, t in train]
    sources, references = [s for s, _ in test], [t for _, t in test]
    # Each hypothesis drops the reference's second word (a subject noun, verb or "that" clause word).
    dropped = [" ".join(w for i, w in enumerate(t.split()) if i != 1) for t in references]

    reference_links, hypothesis_links = align_for_drop(
        sources, dropped, references, train_sources=train_sources, train_targets=train_targets
    )
    assert len(reference_links) == len(hypothesis_links) == len(sources)
    for source, reference, hypothesis, ref_links, hyp_links in zip(
        sources, references, dropped, reference_links, hypothesis_links
    ):
        assert all(i < len(source.split()) and j < len(reference.split()) for i, j in ref_links)
        assert all(i < len(source.split()) and j < len(hypothesis.split()) for i, j in hyp_links)
    score = drop_score(sources, dropped, references, alignments=(reference_links, hypothesis_links))
    assert 3.0 < score < 40.0  # about one of the ~7 source words of every sentence

    same = drop_details(sources, references, references, train_sources=train_sources, train_targets=train_targets)
    assert same["reference_aligned_words"] > 5 * len(sources)
    assert same["drop"] == pytest.approx(100 * same["dropped_words"] / same["reference_aligned_words"])
    assert same["drop"] < 2.0
    assert score > same["drop"] + 3.0

    everything = all_metrics(sources, dropped, references, train_sources=train_sources, train_targets=train_targets)
    assert 3.0 < everything["drop"] < 40.0

    with pytest.warns(UserWarning, match="No training corpus"):
        align_for_drop(sources[:5], references[:5], references[:5])


# ---------------------------------------------------------------------------------------------------------------
# BLEU / chrF / TER and BLEU by length
# ---------------------------------------------------------------------------------------------------------------

HYPS = ["the cat sat on the mat .", "a dog runs in the park", "hello world", "it is raining today"]
REFS = ["the cat sat on a mat .", "the dog runs in the park", "hello there world", "it rains today"]


def test_corpus_scores_match_sacrebleu():
    scores = corpus_scores(HYPS, REFS)
    assert set(scores) == {"bleu", "chrf", "ter"}
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPS, [REFS]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPS, [REFS]).score)
    assert scores["ter"] == pytest.approx(sacrebleu.corpus_ter(HYPS, [REFS]).score)
    perfect = corpus_scores(REFS, REFS)
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)
    assert perfect["ter"] == 0.0
    with pytest.raises(ValueError, match="Mismatched"):
        corpus_scores(HYPS, REFS[:2])
    with pytest.raises(ValueError, match="Empty input"):
        corpus_scores([], [])


# ---------------------------------------------------------------------------------------------------------------
# Paired bootstrap
# ---------------------------------------------------------------------------------------------------------------


def test_paired_bootstrap_reproduces_sacrebleus_test_on_bleu():
    """Given BLEU's per-sentence statistics and score, the p-value is sacrebleu's own paired bootstrap's."""
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    references = [f"a man number {i} rides a red bike down the hill" for i in range(40)]
    baseline = [f"a man number {i} rides a bike down a hill" for i in range(40)]
    system = [f"a man number {i} rides a red bike down hill" if i % 3 else f"man {i} on a bike" for i in range(40)]
    test = PairedTest([("baseline", baseline), ("system", system)], {"BLEU": BLEU()}, [references], test_type="bs",
                      n_samples=200)
    expected = test()[1]["BLEU"][1].p_value
    bleu = BLEU()
    statistics_of = lambda hypotheses: bleu._extract_corpus_statistics(hypotheses, [references])  # noqa: E731
    p = paired_bootstrap_p(statistics_of(system), statistics_of(baseline),
                           lambda totals: bleu._compute_score_from_stats(list(totals)).score, n_samples=200)
    assert p == pytest.approx(expected)


def test_paired_bootstrap_on_ratio_scores():
    rng = np.random.default_rng(0)
    words = rng.integers(5, 20, size=300)
    baseline = [(float(w // 4), w) for w in words]  # REP 25
    # sacrebleu's rule counts resamples whose centred difference exceeds the real one strictly: a system against
    # itself gets the smallest p, (0 + 1) / 1001 (sacrebleu's PairedTest gives the same)
    assert paired_bootstrap_p(baseline, baseline) == pytest.approx(1 / 1001)
    clearly_lower = [(float(w // 10), w) for w in words]
    assert paired_bootstrap_p(clearly_lower, baseline) < 0.01
    noise = [(float(w // 4 + rng.integers(-1, 2)), w) for w in words]
    assert paired_bootstrap_p(noise, baseline) > 0.05
    with pytest.raises(ValueError, match="one shape"):
        paired_bootstrap_p(baseline[:-1], baseline)
    with pytest.raises(ValueError, match="n_samples"):
        paired_bootstrap_p(baseline, baseline, n_samples=0)


def test_length_buckets():
    assert length_bucket_labels() == ["<10", "10-19", "20-29", "30-39", "40-49", ">=50"]
    assert length_bucket_labels((5, 6, 8)) == ["<5", "5", "6-7", ">=8"]
    assert [length_bucket(n) for n in (0, 9, 10, 19, 20, 49, 50, 300)] == [0, 0, 1, 1, 2, 4, 5, 5]
    for bad in [(), (10, 10), (20, 10), (0, 10), (1.5,), "10"]:
        with pytest.raises((ValueError, TypeError)):
            length_bucket_labels(bad)


def test_bleu_by_length():
    lengths = [3, 9, 10, 19, 25, 55]
    sources = [" ".join(["w"] * n) for n in lengths]
    hypotheses = HYPS + ["a b c d e", "the end of it all"]
    references = REFS + ["a b c d e", "the end of this"]
    result = bleu_by_length(sources, hypotheses, references)
    assert list(result) == ["<10", "10-19", "20-29", "30-39", "40-49", ">=50"]
    assert [result[label]["count"] for label in result] == [2, 2, 1, 0, 0, 1]
    groups = {"<10": [0, 1], "10-19": [2, 3], "20-29": [4], ">=50": [5]}
    for label, indices in groups.items():
        expected = sacrebleu.corpus_bleu([hypotheses[k] for k in indices], [[references[k] for k in indices]]).score
        assert result[label]["bleu"] == pytest.approx(expected)
    assert result["30-39"]["bleu"] is None and result["40-49"]["bleu"] is None
    # MMA's right-closed (0, 10] grouping: a 10-word source falls in the first bucket.
    right_closed = bleu_by_length(sources, hypotheses, references, buckets=(11, 21))
    assert list(right_closed) == ["<11", "11-20", ">=21"]
    assert [v["count"] for v in right_closed.values()] == [3, 1, 2]


def test_all_metrics():
    sources = ["a b c", "d e", "f g"]
    result = all_metrics(sources, HYPOTHESES, REFERENCES)
    assert set(result) == {"bleu", "chrf", "ter", "rep", "bleu_by_length"}  # no DROP without alignments
    assert result["rep"] == rep_score(HYPOTHESES, REFERENCES)
    assert {k: result[k] for k in ("bleu", "chrf", "ter")} == corpus_scores(HYPOTHESES, REFERENCES)
    result = all_metrics(sources, HYPOTHESES, REFERENCES, alignments=(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS))
    assert result["drop"] == pytest.approx(50.0)
    assert result["bleu_by_length"] == bleu_by_length(sources, HYPOTHESES, REFERENCES)
    with pytest.raises(ValueError, match="Mismatched"):
        all_metrics(sources, HYPOTHESES, REFERENCES[:1])


# ---------------------------------------------------------------------------------------------------------------
# evaluate modules
# ---------------------------------------------------------------------------------------------------------------


def test_metric_modules_ship_inside_the_package():
    package_dir = Path(hf_headattn.__file__).resolve().parent
    for name in METRIC_MODULES:
        folder = Path(metric_path(name))
        assert folder == package_dir / "evaluate_modules" / name
        assert (folder / f"{name}.py").is_file()
        assert (folder / "__init__.py").is_file()  # a package, so setuptools ships the script
    with pytest.raises(ValueError, match="Unknown metric module"):
        metric_path("bleu")


@pytest.fixture(scope="module")
def modules():
    import evaluate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: evaluate.load(metric_path(name)) for name in METRIC_MODULES}


def test_evaluate_rep_module(modules):
    rep = modules["rep"]
    assert "Malaviya" in rep.citation and "REP" in rep.description
    hypotheses = ["a dog dog", "", "the cat sat on the cat sat"]
    references = ["a dog", "one two three", "the cat sat on the mat"]
    assert rep.compute(predictions=hypotheses, references=references) == {
        "rep": pytest.approx(rep_score(hypotheses, references))
    }
    assert rep.compute(predictions=hypotheses, references=references, lambda2=0.0)["rep"] == pytest.approx(
        rep_score(hypotheses, references, lambda2=0.0)
    )
    assert load_metric("rep").compute(predictions=hypotheses, references=references)["rep"] == pytest.approx(
        100 * 4 / 11
    )


def test_evaluate_drop_module(modules):
    drop = modules["drop"]
    assert "Malaviya" in drop.citation
    result = drop.compute(
        sources=SOURCES,
        predictions=HYPOTHESES,
        references=REFERENCES,
        alignments=(REFERENCE_ALIGNMENTS, HYPOTHESIS_ALIGNMENTS),
    )
    assert result == {"drop": pytest.approx(50.0), "dropped_words": 2, "reference_aligned_words": 4, "drop_std": 0.0}


def test_evaluate_bleu_by_length_module(modules):
    metric = modules["bleu_by_length"]
    assert "Cui" in metric.citation
    sources = [" ".join(["w"] * n) for n in (3, 12, 12, 60)]
    expected = bleu_by_length(sources, HYPS, REFS, buckets=(10, 20))
    assert metric.compute(sources=sources, predictions=HYPS, references=REFS, buckets=[10, 20]) == {
        "bleu_by_length": expected
    }
    default = metric.compute(sources=sources, predictions=HYPS, references=REFS)["bleu_by_length"]
    assert default == bleu_by_length(sources, HYPS, REFS)


# ---------------------------------------------------------------------------------------------------------------
# DROP is repeatable: pooled alignment runs, the trained aligner and the alignments cached (issue 17, item 6)
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def eflomal_runs(monkeypatch):
    """Counts the eflomal runs (training the aligner on the corpus, or aligning test pairs)."""
    from hf_headattn.alignment import eflomal_binary

    calls = []
    run = eflomal_binary.run_eflomal

    def counted(aligner, source_lines, target_lines, *, priors=None, **options):
        calls.append("test pairs" if priors is not None else "corpus")
        return run(aligner, source_lines, target_lines, priors=priors, **options)

    monkeypatch.setattr(eflomal_binary, "run_eflomal", counted)
    return calls


def _drop_case():
    from hf_headattn.toy_corpus import make_toy_corpus

    pairs = make_toy_corpus(330, seed=5)
    train, test = pairs[:300], pairs[300:]
    references = [t for _, t in test]
    dropped = [" ".join(w for i, w in enumerate(t.split()) if i != 1) for t in references]
    return dict(train_sources=[s for s, _ in train], train_targets=[t for _, t in train]), [s for s, _ in test], \
        references, dropped


def test_drop_twice_gives_the_same_number_and_reuses_the_aligner(eflomal_runs, tmp_path):
    corpus, sources, references, hypotheses = _drop_case()
    first = drop_details(sources, hypotheses, references, **corpus, runs=3, cache_dir=tmp_path)
    assert eflomal_runs == ["corpus"] + ["test pairs"] * 3  # trained once, three alignment runs
    assert first["alignment"] == {"runs": 3, "aligner": "trained", "aligner_training_pairs": 300,
                                  "alignments": "aligned", "cache_dir": str(tmp_path)}
    assert len(first["drop_runs"]) == 3 and first["drop_std"] >= 0.0
    assert min(first["drop_runs"]) <= first["drop"] <= max(first["drop_runs"])
    assert 3.0 < first["drop"] < 40.0

    second = drop_details(sources, hypotheses, references, **corpus, runs=3, cache_dir=tmp_path)
    assert second["drop"] == first["drop"] and second["drop_runs"] == first["drop_runs"]
    assert eflomal_runs == ["corpus"] + ["test pairs"] * 3  # nothing ran again
    assert second["alignment"]["aligner"] == "cached" and second["alignment"]["alignments"] == "cached"

    # Another system's hypotheses: the aligner trained on the corpus is reused, only the test pairs are aligned.
    other = drop_details(sources, references, references, **corpus, runs=3, cache_dir=tmp_path)
    assert eflomal_runs == ["corpus"] + ["test pairs"] * 6
    assert other["alignment"]["aligner"] == "cached" and other["alignment"]["alignments"] == "aligned"
    assert other["drop"] < first["drop"]
    # drop_score and all_metrics read the same cache
    assert drop_score(sources, hypotheses, references, **corpus, runs=3, cache_dir=tmp_path) == first["drop"]
    everything = all_metrics(sources, hypotheses, references, **corpus, runs=3, cache_dir=tmp_path)
    assert everything["drop"] == first["drop"] and everything["drop_alignment"]["drop_runs"] == first["drop_runs"]
    assert eflomal_runs == ["corpus"] + ["test pairs"] * 6


def test_drop_cache_is_keyed_by_content(eflomal_runs, tmp_path):
    corpus, sources, references, hypotheses = _drop_case()
    drop_details(sources, hypotheses, references, **corpus, runs=1, cache_dir=tmp_path)
    changed = dict(corpus, train_targets=[*corpus["train_targets"][:-1], "a different last sentence ."])
    details = drop_details(sources, hypotheses, references, **changed, runs=1, cache_dir=tmp_path)
    assert details["alignment"]["aligner"] == "trained"  # another corpus: another aligner
    assert eflomal_runs == ["corpus", "test pairs"] * 2
    # Other options or another number of runs: aligned afresh (the eflomal options retrain the aligner too).
    drop_details(sources, hypotheses, references, **corpus, runs=2, cache_dir=tmp_path)
    assert eflomal_runs[4:] == ["test pairs"] * 2
    drop_details(sources, hypotheses, references, **corpus, runs=1, cache_dir=tmp_path, model=2)
    assert eflomal_runs[6:] == ["corpus", "test pairs"]
    assert sorted(path.name.split("-")[0] for path in tmp_path.iterdir()) == ["aligner"] * 3 + ["alignments"] * 4


def test_drop_without_cache_aligns_every_time(eflomal_runs, tmp_path, monkeypatch):
    corpus, sources, references, hypotheses = _drop_case()
    monkeypatch.setenv("HF_HEADATTN_CACHE", str(tmp_path / "default"))
    details = drop_details(sources, hypotheses, references, **corpus, runs=1, cache=False)
    drop_details(sources, hypotheses, references, **corpus, runs=1, cache=False)
    assert eflomal_runs == ["corpus", "test pairs"] * 2 and details["alignment"]["cache_dir"] is None
    assert not (tmp_path / "default").exists()
    drop_details(sources, hypotheses, references, **corpus, runs=1)  # the default folder, under HF_HEADATTN_CACHE
    assert len(list((tmp_path / "default" / "drop").iterdir())) == 2
    with pytest.raises(ValueError, match=r"`runs` \(eflomal alignment runs\) must be a positive integer, got 0"):
        drop_details(sources, hypotheses, references, **corpus, runs=0)
