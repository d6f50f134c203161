"""Word alignment and fertility tooling for the GUIDED and PREDICTED fertility bounds (Malaviya et al., 2018, Sec. 4).

The paper aligns the training data with fast_align and derives per-word fertilities from the alignments. Here the
aligner is eflomal (fast_align's successor: a Bayesian IBM/HMM/fertility model with Gibbs sampling), run in both
directions and symmetrized with grow-diag-final-and, the usual recipe for both tools.

The pipeline, over the subword tokens exactly as the NMT model sees them:

1. :func:`corpus_token_fertilities`: tokenize the parallel corpus with the model's tokenizer, align the token
   sequences (:func:`align_corpus`) and count, for every source token, how many target tokens are linked to it
   (:func:`fertilities_from_alignments`).
2. GUIDED: :func:`guided_fertility_table` keeps, per token id, the largest fertility seen (1 if none); the model
   looks the table up at run time (``hf_headattn.runtime.fertility.source_fertility``).
3. PREDICTED: :func:`train_fertility_predictor` trains the bi-LSTM tagger
   (``hf_headattn.runtime.fertility.FertilityPredictor``) on those fertilities plus one slack.

Special tokens. Every sequence ends in ``</s>`` on both sides, and both ``</s>`` take part in the alignment like
any other token: they co-occur in every sentence pair at the same relative (final) position, so the aligner links
them to each other and the source ``</s>`` ends up with fertility 1 (tested). This matches the model, whose
decoder spends one step (and one unit of attention) on generating the target ``</s>``, and keeps the sum of the
fertilities close to the number of decoder steps. No special case is needed at run time either.

The package's modules: ``symmetrization`` (grow-diag-final-and, intersection, union), ``eflomal_binary`` (eflomal's
binary run as a child process, its messages followed by a progress bar), ``aligner`` (:func:`align_corpus`,
:func:`alignment_priors`) and ``fertility`` (fertilities, the GUIDED table, the PREDICTED tagger's training). Every
name is imported from the package itself: what replaces one here (a test's monkeypatch of ``align_corpus``) is what
the package's callers, which look their names up here when they run, get.

Tooling, not model runtime: never copied into a checkpoint; it may import eflomal, numpy, tqdm and transformers.
"""

from .aligner import align_corpus, alignment_priors
from .fertility import (corpus_token_fertilities, fertilities_from_alignments, guided_fertility_table,
                        train_fertility_predictor)
from .symmetrization import SYMMETRIZATIONS, grow_diag_final_and, symmetrize

__all__ = [
    "SYMMETRIZATIONS",
    "align_corpus",
    "alignment_priors",
    "corpus_token_fertilities",
    "fertilities_from_alignments",
    "grow_diag_final_and",
    "guided_fertility_table",
    "symmetrize",
    "train_fertility_predictor",
]
