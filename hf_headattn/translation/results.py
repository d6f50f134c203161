"""What :func:`~hf_headattn.translation.translate` returns: a :class:`Translation` per source sentence, holding its
:class:`Hypothesis` list (best first), each with its text, score, Pharaoh alignment and, when asked for, its
:class:`HypothesisAttention`.

Tooling, not model runtime: never copied into a checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Hypothesis", "HypothesisAttention", "Translation"]


@dataclass
class HypothesisAttention:
    """Where the model looked while producing one hypothesis (``translate(..., attention=True)``), read from the
    teacher-forced pass that scores and aligns it; what the web demo (``hf_headattn.app``) draws.

    Tokens as the model read and produced them (the source cut as it was read; the target from its first token
    through its end of sentence); each token's word index (-1: special tokens), words as the alignment counts
    them; ``cross_attentions``, one [heads, target tokens, source tokens] tensor per decoder layer (heads differ
    between layers where some were pruned; the LSTM family: its one source attention); ``alignment_attention``
    [target tokens, source tokens], the reduction the Pharaoh alignment reads; ``head_importances``, the model's
    weights over heads: module name -> [tokens, heads] (DHICM and dependent multi-hop modules; ``"source
    attention"`` for the LSTM's dependent hops), tokens being the source's for encoder modules, else the
    target's."""

    source_tokens: list[str]
    target_tokens: list[str]
    source_words: list[int]
    target_words: list[int]
    cross_attentions: "tuple[torch.Tensor, ...]"  # noqa: F821  (torch is imported where it is used)
    alignment_attention: "torch.Tensor"  # noqa: F821
    head_importances: dict = field(default_factory=dict)


@dataclass
class Hypothesis:
    """One translation of a sentence: its text, its score (None unless asked for), its Pharaoh alignment and,
    with ``translate(..., attention=True)``, its attention (:class:`HypothesisAttention`; never written out)."""

    text: str
    score: float | None = None
    alignment: str | None = None
    attention: HypothesisAttention | None = field(default=None, repr=False, compare=False)


@dataclass
class Translation:
    """A source sentence and its hypotheses, best first (none for a blank line)."""

    source: str
    hypotheses: list[Hypothesis] = field(default_factory=list)

    @property
    def text(self) -> str:
        """The best hypothesis' text ("" for a blank line)."""
        return self.hypotheses[0].text if self.hypotheses else ""
