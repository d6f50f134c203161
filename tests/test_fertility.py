"""Fertility bounds (Malaviya et al., 2018, Sec. 4): alignments, GUIDED table, PREDICTED tagger, source_fertility."""

import importlib.util
import os
import random
import warnings

import pytest
import torch

from hf_headattn import train_tokenizer
from hf_headattn.alignment import (
    align_corpus,
    corpus_token_fertilities,
    fertilities_from_alignments,
    grow_diag_final_and,
    guided_fertility_table,
    symmetrize,
    train_fertility_predictor,
)
from hf_headattn.runtime.fertility import FERTILITY_STRATEGIES, FertilityPredictor, source_fertility
from hf_headattn.toy_corpus import make_toy_corpus


needs_eflomal = pytest.mark.skipif(importlib.util.find_spec("eflomal") is None, reason="needs `pip install eflomal`")


# --------------------------------------------------------------------------------------------------------------
# Fertilities and the GUIDED table from hand-made alignments
# --------------------------------------------------------------------------------------------------------------


def test_fertilities_from_alignments_count_linked_target_tokens():
    alignments = [[(0, 0), (1, 1), (1, 2), (3, 3)], [], [(0, 1), (0, 1), (0, 0)]]
    assert fertilities_from_alignments(alignments, [4, 2, 1]) == [[1, 2, 0, 1], [0, 0], [2]]
    with pytest.raises(ValueError, match="out of range"):
        fertilities_from_alignments([[(2, 0)]], [2])
    with pytest.raises(ValueError, match="2 alignments but 1 source lengths"):
        fertilities_from_alignments([[], []], [3])


def test_guided_table_takes_the_max_and_gives_unaligned_or_unseen_ids_one():
    source_ids = [[5, 6, 7, 1], [5, 8, 1], [6, 6, 1]]
    fertilities = [[1, 3, 0, 1], [2, 0, 1], [1, 2, 1]]
    table = guided_fertility_table(source_ids, fertilities, vocab_size=10)
    assert table.dtype == torch.float32 and table.shape == (10,)
    # 5: max(1, 2); 6: max(3, 1, 2); 7 and 8 only ever had fertility 0 -> 1; the other ids are unseen -> 1.
    expected = [1, 1, 1, 1, 1, 2, 3, 1, 1, 1]
    assert table.tolist() == expected
    with pytest.raises(ValueError, match=r"in \[0, 10\)"):
        guided_fertility_table([[10]], [[1]], vocab_size=10)
    with pytest.raises(ValueError, match="2 tokens but 1 fertilities"):
        guided_fertility_table([[3, 4]], [[1]], vocab_size=10)


# --------------------------------------------------------------------------------------------------------------
# Symmetrization
# --------------------------------------------------------------------------------------------------------------


def test_grow_diag_adds_union_neighbours_of_the_intersection():
    # Forward gives source 1 two targets; reverse links source 2 to target 2. Intersection: (0,0), (1,1).
    # (1,2) neighbours (1,1) and target 2 is unaligned; (2,2) is a diagonal neighbour and source 2 is unaligned.
    forward = [(0, 0), (1, 1), (1, 2)]
    reverse = [(0, 0), (1, 1), (2, 2)]
    assert grow_diag_final_and(forward, reverse, 3, 3) == [(0, 0), (1, 1), (1, 2), (2, 2)]


def test_final_and_adds_isolated_links_only_between_two_unaligned_tokens():
    forward = [(0, 0), (1, 1), (3, 2), (1, 3)]
    reverse = [(0, 0), (1, 1), (2, 3)]
    # No union point touches the intersection {(0,0), (1,1)}, so GROW-DIAG adds nothing. FINAL-AND(forward) adds
    # (3,2) (both ends unaligned) but not (1,3) (source 1 is aligned; plain grow-diag-final would add it);
    # FINAL-AND(reverse) then adds (2,3).
    assert grow_diag_final_and(forward, reverse, 4, 4) == [(0, 0), (1, 1), (2, 3), (3, 2)]
    assert symmetrize(forward, reverse, 4, 4, "intersection") == [(0, 0), (1, 1)]
    assert symmetrize(forward, reverse, 4, 4, "union") == [(0, 0), (1, 1), (1, 3), (2, 3), (3, 2)]
    with pytest.raises(ValueError, match="accepted: grow-diag-final-and, intersection, union"):
        symmetrize(forward, reverse, 4, 4, "grow-diag")
    with pytest.raises(ValueError, match="out of range"):
        grow_diag_final_and([(4, 0)], [], 4, 4)


# --------------------------------------------------------------------------------------------------------------
# eflomal
# --------------------------------------------------------------------------------------------------------------


def _synthetic_corpus(n_sentences=300, seed=0):
    """Monotone word-for-word corpus: s0-s9 and s25-s29 -> 1 target word, s10-s19 -> 2, s20-s24 -> dropped."""
    rng = random.Random(seed)
    lexicon = {}
    for k in range(30):
        n_targets = 2 if 10 <= k < 20 else 0 if 20 <= k < 25 else 1
        lexicon[f"s{k}"] = [f"t{k}_{m}" for m in range(n_targets)]
    sources, targets, gold = [], [], []
    for _ in range(n_sentences):
        source = [f"s{rng.randrange(30)}" for _ in range(rng.randint(3, 10))]
        target, links = [], []
        for i, word in enumerate(source):
            for translation in lexicon[word]:
                links.append((i, len(target)))
                target.append(translation)
        sources.append(source)
        targets.append(target)
        gold.append(links)
    return sources, targets, gold


@needs_eflomal
def test_eflomal_recovers_one_to_one_and_one_to_two_links():
    sources, targets, gold = _synthetic_corpus()
    alignments = align_corpus(sources, targets)
    assert len(alignments) == len(sources)
    predicted = {(k, i, j) for k, links in enumerate(alignments) for i, j in links}
    reference = {(k, i, j) for k, links in enumerate(gold) for i, j in links}
    precision = len(predicted & reference) / len(predicted)
    recall = len(predicted & reference) / len(reference)
    lengths = [len(s) for s in sources]
    found, expected = fertilities_from_alignments(alignments, lengths), fertilities_from_alignments(gold, lengths)
    accuracy = sum(a == b for x, y in zip(found, expected) for a, b in zip(x, y)) / sum(lengths)
    # Measured over 80 runs (eflomal cannot be seeded): precision 0.974-1.0, recall 0.959-1.0, fertility accuracy
    # 0.932-0.998 (the misses: a 1:2 word getting one link, a dropped word getting one).
    assert precision >= 0.95 and recall >= 0.9 and accuracy >= 0.9, (precision, recall, accuracy)
    # Intersection caps every fertility at 1.
    intersection = align_corpus(sources, targets, symmetrization="intersection")
    assert max(f for row in fertilities_from_alignments(intersection, lengths) for f in row) == 1


@needs_eflomal
def test_align_corpus_edge_cases():
    sources = [["a", "b"], [], ["a"], ["B", "b"]] * 10
    targets = [["x", "y"], ["x"], [], ["Y", "y"]] * 10
    alignments = align_corpus(sources, targets, n_iterations=(2, 2, 2))
    assert alignments[1] == [] and alignments[2] == []
    for links, source, target in zip(alignments, sources, targets):
        assert all(0 <= i < len(source) and 0 <= j < len(target) for i, j in links)
    assert align_corpus([], []) == []
    with pytest.raises(ValueError, match="2 source and 1 target"):
        align_corpus([["a"], ["b"]], [["x"]])
    with pytest.raises(TypeError, match="list of tokens"):
        align_corpus(["a b"], [["x"]])
    with pytest.raises(ValueError, match="accepted: grow-diag-final-and"):
        align_corpus([["a"]], [["x"]], symmetrization="grow")
    # eflomal cannot be seeded: a log line, not a warning the user cannot act on
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        align_corpus([["a"]] * 4, [["x"]] * 4, seed=0, n_iterations=(2, 2, 2))


@needs_eflomal
def test_the_progress_bar_follows_eflomals_own_stderr_not_the_processs(monkeypatch, capsys):
    redirections, dup2 = [], os.dup2
    monkeypatch.setattr(os, "dup2", lambda *args: redirections.append(args) or dup2(*args))
    sources, targets = [["a", "b"], ["b"]] * 10, [["x", "y"], ["y"]] * 10
    assert len(align_corpus(sources, targets, n_iterations=(2, 3, 4), progress="aligning")) == 20
    assert redirections == []  # no file descriptor of this process redirected (other threads write to them)
    bar = capsys.readouterr().err
    assert "aligning: 9/9 iterations (100%)" in bar  # every model's iterations counted
    assert "Aligning with model" not in bar  # eflomal's own messages swallowed, as its quiet mode does


@needs_eflomal
def test_corpus_token_fertilities_on_subword_tokens_with_final_eos():
    pairs = make_toy_corpus(300, seed=1)
    sources, targets = [s for s, _ in pairs], [t for _, t in pairs]
    tokenizer = train_tokenizer(texts=sources + targets, vocab_size=400, model="bpe")
    eos = tokenizer.eos_token_id
    # eflomal cannot be seeded, and about 1 run in 40 on this corpus settles in a mode that crosses the source's
    # final "." and </s> (every sentence ends in both, on both sides) with the target's, giving one of them
    # fertility 2 in about half the sentences. The first of three runs outside that mode is checked.
    for _ in range(3):
        source_ids, fertilities = corpus_token_fertilities(tokenizer, sources, targets)
        flat = [f for row in fertilities for f in row]
        eos_share = sum(f[-1] == 1 for f in fertilities) / len(fertilities)
        one_share = sum(f == 1 for f in flat) / len(flat)
        if eos_share >= 0.95 and one_share >= 0.9:
            break
    assert source_ids == tokenizer(sources)["input_ids"]
    assert [len(f) for f in fertilities] == [len(ids) for ids in source_ids]
    assert all(ids[-1] == eos for ids in source_ids)
    # The source </s> aligns to the target </s>: measured 1.0 of sentences outside the crossed mode.
    assert eos_share >= 0.95, eos_share
    # About one piece per word, one translation per word: measured 0.954-0.998 of tokens with fertility 1 outside
    # the crossed mode (the verbs moved by the dass clauses account for most of the rest), 0.87 in it.
    assert one_share >= 0.9, one_share
    table = guided_fertility_table(source_ids, fertilities, len(tokenizer))
    # The table keeps the maximum over sentences, so one stray link (eflomal cannot be seeded) can make it 2.
    assert table[eos] <= 2
    assert table.min() >= 1 and table.max() <= 3


# --------------------------------------------------------------------------------------------------------------
# PREDICTED: the bi-LSTM tagger
# --------------------------------------------------------------------------------------------------------------


def test_predictor_is_exact_under_padding():
    torch.manual_seed(0)
    predictor = FertilityPredictor(20, embedding_size=8, hidden_size=8, max_fertility=4, pad_token_id=0)
    sentences = [[5, 6, 7, 1], [8, 9, 1], [3, 4, 5, 6, 7, 1], [11]]
    width = 7
    right = torch.zeros(len(sentences), width, dtype=torch.long)
    left = torch.full((len(sentences), width), -100, dtype=torch.long)  # padding ids outside the vocabulary
    for row, ids in enumerate(sentences):
        right[row, : len(ids)] = torch.tensor(ids)
        left[row, width - len(ids) :] = torch.tensor(ids)
    right_mask, left_mask = (right != 0).long(), (left != -100).long()
    logits_right = predictor(right, attention_mask=right_mask)
    logits_left = predictor(left, attention_mask=left_mask)
    assert logits_right.shape == (4, width, 5)
    for row, ids in enumerate(sentences):
        alone = predictor(torch.tensor([ids]))[0]
        torch.testing.assert_close(logits_right[row, : len(ids)], alone, rtol=0, atol=1e-6)
        torch.testing.assert_close(logits_left[row, width - len(ids) :], alone, rtol=0, atol=1e-6)
    assert logits_right[right_mask == 0].abs().max() == 0
    expected = predictor.expected_fertility(right, attention_mask=right_mask)
    assert expected.shape == (4, width) and expected.dtype == torch.float32
    assert (expected[right_mask == 0] == 0).all()
    real = expected[right_mask == 1]
    assert (real >= 0).all() and (real <= predictor.max_fertility).all()
    # An all-padding row is allowed and gives zeros.
    empty = predictor.expected_fertility(torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 3, dtype=torch.long))
    assert (empty == 0).all()


def _fertility_task(n_sentences, rng):
    """Token ids 3..19 with fertility id % 3, sentences ending in </s> (id 1, fertility 1)."""
    source_ids = [[rng.randrange(3, 20) for _ in range(rng.randint(3, 8))] + [1] for _ in range(n_sentences)]
    fertilities = [[1 if i == 1 else i % 3 for i in ids] for ids in source_ids]
    return source_ids, fertilities


def test_trained_predictor_expects_aligner_fertility_plus_slack():
    rng = random.Random(0)
    source_ids, fertilities = _fertility_task(400, rng)
    torch.manual_seed(0)
    predictor = FertilityPredictor(20, embedding_size=16, hidden_size=16, max_fertility=4, pad_token_id=0)
    losses = train_fertility_predictor(
        predictor, source_ids, fertilities, epochs=5, learning_rate=1e-2, slack=1, progress=False
    )
    assert len(losses) == 5 and losses[-1] < 0.05 < losses[0]
    assert predictor.training  # a new module is in train mode and stays there

    test_ids, test_fertilities = _fertility_task(100, rng)
    width = max(len(ids) for ids in test_ids)
    input_ids = torch.zeros(len(test_ids), width, dtype=torch.long)
    target = torch.zeros(len(test_ids), width)
    for row, (ids, ferts) in enumerate(zip(test_ids, test_fertilities)):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        target[row, : len(ids)] = torch.tensor([min(f + 1, 4) for f in ferts], dtype=torch.float)
    mask = input_ids != 0
    expected = predictor.expected_fertility(input_ids, attention_mask=mask.long())
    error = (expected - target).abs()[mask]
    # Measured over 3 seeds: mean absolute error 0.003-0.005, max 0.018-0.031.
    assert error.mean() < 0.05 and error.max() < 0.25, (error.mean(), error.max())

    with pytest.raises(ValueError, match="2 tokens but 1 fertilities"):
        train_fertility_predictor(predictor, [[3, 1]], [[1]], progress=False)


# --------------------------------------------------------------------------------------------------------------
# source_fertility
# --------------------------------------------------------------------------------------------------------------


def test_source_fertility_strategies():
    assert FERTILITY_STRATEGIES == ("constant", "guided", "predicted")
    input_ids = torch.tensor([[4, 5, 1, 0], [6, 1, 0, 0]])
    mask = (input_ids != 0).long()

    constant = source_fertility("constant", input_ids, mask, constant=3.0)
    assert constant.dtype == torch.float32
    assert constant.tolist() == [[3, 3, 3, 0], [3, 3, 0, 0]]
    assert (source_fertility("constant", input_ids) == 2.0).all()  # no mask: every position is real

    table = torch.tensor([7.0, 1.0, 1.0, 1.0, 2.0, 4.0, 1.0])
    guided = source_fertility("guided", input_ids, mask, guided_table=table)
    assert guided.tolist() == [[2, 4, 1, 0], [1, 1, 0, 0]]
    padded_with_ignore = input_ids.masked_fill(mask == 0, -100)
    assert source_fertility("guided", padded_with_ignore, mask, guided_table=table).tolist() == guided.tolist()

    torch.manual_seed(0)
    predictor = FertilityPredictor(7, embedding_size=8, hidden_size=8, max_fertility=3)
    predicted = source_fertility("predicted", input_ids, mask, predictor=predictor)
    assert not predicted.requires_grad
    torch.testing.assert_close(predicted, predictor.expected_fertility(input_ids, mask).detach())
    assert (predicted[mask == 0] == 0).all() and (predicted[mask == 1] > 0).all()


def test_source_fertility_errors():
    input_ids = torch.tensor([[4, 5, 1]])
    with pytest.raises(ValueError, match="Unknown fertility strategy 'learned'; accepted: constant, guided, predicted"):
        source_fertility("learned", input_ids)
    with pytest.raises(ValueError, match="needs `guided_table`"):
        source_fertility("guided", input_ids)
    with pytest.raises(ValueError, match="needs `predictor`"):
        source_fertility("predicted", input_ids)
    with pytest.raises(ValueError, match="positive number"):
        source_fertility("constant", input_ids, constant=0)
    with pytest.raises(ValueError, match=r"in \[0, 3\)"):
        source_fertility("guided", input_ids, guided_table=torch.ones(3))
    with pytest.raises(ValueError, match="1-D"):
        source_fertility("guided", input_ids, guided_table=torch.ones(3, 3))
    with pytest.raises(ValueError, match="attention_mask has shape"):
        source_fertility("constant", input_ids, torch.ones(1, 2))
