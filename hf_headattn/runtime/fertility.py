"""Fertility upper bounds for the constrained attention variants (Malaviya et al., 2018, Section 4).

Constrained softmax and constrained sparsemax bound the total attention that a source token can receive over
all decoding steps by its *fertility* ``f_j`` (Eq. 5: ``u_t = f - beta_{t-1}``). Section 4 of the paper,
"Fertility Bounds", gives three ways to set these bounds, all three implemented by :func:`source_fertility`:

- ``"constant"``: every source token gets the same fertility ``f``.
- ``"guided"``: a word aligner is run on the training data and every vocabulary entry gets the largest number
  of target words aligned to it anywhere in the training data, or 1 if no alignment was observed. The per-id
  table is built offline by ``hf_headattn.alignment.guided_fertility_table`` and looked up here.
- ``"predicted"``: a separate bi-LSTM tagger (:class:`FertilityPredictor`) trained on the aligner's fertilities
  plus one slack (``hf_headattn.alignment.train_fertility_predictor``); at test time the *expected* fertility
  under the tagger is the bound.

Source positions are the model's subword tokens (the final ``</s>`` included). This file is runtime code:
``save_pretrained`` copies it next to the checkpoint, so it imports only torch and the runtime's own modules.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention_base import ConfigFieldError
from .rnn_packing import run_packed_lstm
from .seq2seq_common import inputs_checked_elsewhere


__all__ = ["FERTILITY_STRATEGIES", "FertilityPredictor", "SourceFertility", "check_fertility_config", "source_fertility"]

FERTILITY_STRATEGIES = ("constant", "guided", "predicted")
_FERTILITY_DESCRIPTIONS = {
    "constant": "CONSTANT (every source token may receive {constant_fertility:g} units of attention)",
    "guided": "GUIDED (per token, the largest fertility in word alignments of the training data)",
    "predicted": "PREDICTED (a bi-LSTM tagger inside the model, trained on word-alignment fertilities)",
}


def _real_token_mask(input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Boolean [batch, src_len] mask of the real (non-padding) positions; no mask means every position is real."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [batch, src_len], got {tuple(input_ids.shape)}")
    if attention_mask is None:
        return torch.ones_like(input_ids, dtype=torch.bool)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but input_ids has {tuple(input_ids.shape)}"
        )
    return attention_mask.bool()


class FertilityPredictor(nn.Module):
    """Bi-LSTM tagger that predicts each source token's fertility (the PREDICTED strategy, Section 4).

    Embedding -> one bidirectional LSTM layer -> linear layer over the fertility classes ``0..max_fertility``.
    The paper trains it with the word aligner's fertilities plus a constant slack of 1 as supervision (see
    ``hf_headattn.alignment.train_fertility_predictor``) and uses the *expected* fertility under the model as
    the upper bound at test time (:meth:`expected_fertility`).

    Padding is exact: real tokens are packed (``run_packed_lstm``), so a sentence gets the same outputs
    alone and inside a padded batch, whatever side the padding is on.

    Args:
        vocab_size: Number of token ids (the NMT model's vocabulary).
        embedding_size: Size of the token embeddings.
        hidden_size: Hidden size of each LSTM direction.
        max_fertility: Largest fertility the tagger can output; there are ``max_fertility + 1`` classes.
        pad_token_id: Id of the padding token (its embedding is kept at zero).
    """

    def __init__(
        self,
        vocab_size: int,
        embedding_size: int = 128,
        hidden_size: int = 128,
        max_fertility: int = 10,
        pad_token_id: int | None = 0,
    ):
        super().__init__()
        for name, value, minimum in (
            ("vocab_size", vocab_size, 1),
            ("embedding_size", embedding_size, 1),
            ("hidden_size", hidden_size, 1),
            ("max_fertility", max_fertility, 1),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        if pad_token_id is not None and not 0 <= pad_token_id < vocab_size:
            raise ValueError(f"pad_token_id must be in [0, {vocab_size}), got {pad_token_id!r}")
        self.vocab_size = vocab_size
        self.max_fertility = max_fertility
        self.pad_token_id = pad_token_id
        self.embed_tokens = nn.Embedding(vocab_size, embedding_size, padding_idx=pad_token_id)
        self.lstm = nn.LSTM(embedding_size, hidden_size, num_layers=1, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(2 * hidden_size, max_fertility + 1)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Return logits ``[batch, src_len, max_fertility + 1]`` over fertilities ``0..max_fertility``.

        Positions where ``attention_mask`` is 0 are left out of the LSTM and get all-zero logits.
        """
        mask = _real_token_mask(input_ids, attention_mask)
        if input_ids.numel() == 0:
            return self.classifier.weight.new_zeros(*input_ids.shape, self.max_fertility + 1)
        # Padding ids are replaced by the pad id, so that e.g. -100 never reaches the embedding.
        fill_id = self.pad_token_id if self.pad_token_id is not None else 0
        embeddings = self.embed_tokens(input_ids.masked_fill(~mask, fill_id))
        states, _ = run_packed_lstm(self.lstm, embeddings, mask)
        return self.classifier(states).masked_fill(~mask[:, :, None], 0.0)

    def expected_fertility(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Expected fertility ``sum_k k * p(k | x)`` per token, ``[batch, src_len]`` float; 0 at padding.

        This is the PREDICTED strategy's upper bound at test time (Section 4: "At test time, we use the
        expected fertilities according to our model").
        """
        mask = _real_token_mask(input_ids, attention_mask)
        logits = self(input_ids, attention_mask=mask)
        probabilities = logits.float().softmax(dim=-1)
        classes = torch.arange(self.max_fertility + 1, device=logits.device, dtype=probabilities.dtype)
        return (probabilities * classes).sum(dim=-1) * mask


def source_fertility(
    strategy: str,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    constant: float = 2.0,
    guided_table: torch.Tensor | None = None,
    predictor: FertilityPredictor | None = None,
    check_ids: bool = True,
) -> torch.Tensor:
    """Fertility upper bound of every source token, following one of the strategies of Section 4.

    Args:
        strategy: ``"constant"`` (every token gets ``constant``), ``"guided"`` (per token id,
            ``guided_table[id]``: the largest number of target tokens a word aligner linked to that id in the
            training data, 1 if none) or ``"predicted"`` (the expected fertility under ``predictor``).
        input_ids: ``[batch, src_len]`` source token ids, as the encoder sees them.
        attention_mask: ``[batch, src_len]``, 1 for real tokens and 0 for padding; None means no padding.
        constant: The fertility of the ``"constant"`` strategy (the paper's ``f``).
        guided_table: ``[vocab_size]`` float tensor for ``"guided"``, e.g. from
            ``hf_headattn.alignment.guided_fertility_table``.
        predictor: The trained :class:`FertilityPredictor` for ``"predicted"``. It is run without gradients:
            as in the paper, the tagger is trained separately and its output is a fixed input of the NMT model.
        check_ids: For ``"guided"``, check that the real tokens' ids index ``guided_table`` (ValueError if not),
            which reads them (a host sync on a GPU); the encoder skips it when the model's input checks covered the
            ids (`SourceFertility.forward`).

    Returns:
        ``[batch, src_len]`` float32 fertilities, 0 at padding positions.
    """
    if strategy not in FERTILITY_STRATEGIES:
        raise ValueError(f"Unknown fertility strategy {strategy!r}; accepted: {', '.join(FERTILITY_STRATEGIES)}")
    mask = _real_token_mask(input_ids, attention_mask)

    if strategy == "constant":
        if isinstance(constant, bool) or not isinstance(constant, (int, float)) or not constant > 0:
            raise ValueError(f"The constant fertility must be a positive number, got {constant!r}")
        fertility = torch.full(input_ids.shape, float(constant), dtype=torch.float32, device=input_ids.device)

    elif strategy == "guided":
        if guided_table is None:
            raise ValueError(
                "The 'guided' fertility strategy needs `guided_table`, a [vocab_size] tensor of per-token-id "
                "fertilities (see hf_headattn.alignment.guided_fertility_table)"
            )
        if guided_table.dim() != 1:
            raise ValueError(f"guided_table must be a 1-D [vocab_size] tensor, got shape {tuple(guided_table.shape)}")
        if guided_table.numel() == 0:
            raise ValueError("guided_table is empty; it needs one fertility per token id")
        if check_ids and input_ids.numel() > 0 and not torch.compiler.is_exporting():  # (data-dependent: not exported)
            real_ids = input_ids[mask]
            if real_ids.numel() > 0 and (int(real_ids.min()) < 0 or int(real_ids.max()) >= guided_table.numel()):
                raise ValueError(
                    f"input_ids must lie in [0, {guided_table.numel()}) to index guided_table, got ids in "
                    f"[{int(real_ids.min())}, {int(real_ids.max())}]"
                )
        table = guided_table.to(device=input_ids.device, dtype=torch.float32)
        # Padding ids may lie outside the table (e.g. -100): look up a valid id there and zero it below.
        fertility = table[input_ids.masked_fill(~mask, 0)]

    else:  # "predicted"
        if predictor is None:
            raise ValueError(
                "The 'predicted' fertility strategy needs `predictor`, a trained FertilityPredictor "
                "(see hf_headattn.alignment.train_fertility_predictor)"
            )
        with torch.no_grad():
            fertility = predictor.expected_fertility(input_ids, attention_mask=mask).float()

    return fertility * mask


def check_fertility_config(config) -> None:
    """Raise ConfigFieldError, naming the bad value, for a config's fertility fields (`fertility`,
    `constant_fertility`, `fertility_predictor_size`, `max_fertility`); shared by both model families."""
    if config.fertility not in FERTILITY_STRATEGIES:
        raise ConfigFieldError(f"Unknown fertility {config.fertility!r}; accepted: {', '.join(FERTILITY_STRATEGIES)}",
                               "fertility")
    constant = config.constant_fertility
    if not isinstance(constant, (int, float)) or isinstance(constant, bool) or not constant > 0:
        raise ConfigFieldError(f"`constant_fertility` must be a number > 0, got {constant!r}", "constant_fertility")
    for field in ("fertility_predictor_size", "max_fertility"):
        value = getattr(config, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigFieldError(f"`{field}` must be a positive integer, got {value!r}", field)


class SourceFertility(nn.Module):
    """The fertility strategy a config names, as an encoder submodule that maps source ids to bounds.

    It owns what the strategy learns from the training data, so that it is saved with the model: the
    ``guided_fertility`` buffer (GUIDED, filled by ``hf_headattn.alignment.guided_fertility_table``) or the
    ``fertility_predictor`` tagger (PREDICTED, trained by ``hf_headattn.alignment.train_fertility_predictor``).
    """

    def __init__(self, config):
        super().__init__()
        self.strategy = config.fertility
        self.constant = config.constant_fertility
        self.fertility_predictor = None
        if self.strategy == "guided":
            self.register_buffer("guided_fertility", torch.ones(config.vocab_size))
        if self.strategy == "predicted":
            self.fertility_predictor = FertilityPredictor(
                config.vocab_size,
                embedding_size=config.fertility_predictor_size,
                hidden_size=config.fertility_predictor_size,
                max_fertility=config.max_fertility,
                pad_token_id=config.pad_token_id,
            )

    def forward(
        self,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[batch, source_len] fertility upper bounds, 0 at padding. A constant fertility needs only the source
        positions, so it also works from `inputs_embeds` [batch, source_len, d]; the others read the token ids."""
        if input_ids is None:
            if self.strategy != "constant" or inputs_embeds is None:
                raise ValueError(f"The {self.strategy!r} fertility strategy computes source fertilities from "
                                 "`input_ids`; pass input_ids rather than inputs_embeds (only 'constant' needs no ids)")
            mask = _real_token_mask(inputs_embeds[..., 0], attention_mask)
            return torch.full(mask.shape, float(self.constant), dtype=torch.float32, device=mask.device) * mask
        return source_fertility(
            self.strategy,
            input_ids,
            attention_mask,
            constant=self.constant,
            guided_table=getattr(self, "guided_fertility", None),
            predictor=self.fertility_predictor,
            # Inside a model's checked forward (or generate) the ids were checked against the source vocabulary, the
            # table's size: checking them again would read them at every forward.
            check_ids=not inputs_checked_elsewhere(),
        )


def describe_fertility(config) -> str:
    """The config's fertility strategy in words, for model cards."""
    return _FERTILITY_DESCRIPTIONS[config.fertility].format(constant_fertility=config.constant_fertility)
