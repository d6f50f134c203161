"""Run an `nn.LSTM` over padded batches exactly: a sentence gets the same outputs and final states alone and
inside a padded batch, wherever its padding sits. Shared by the fertility tagger and the LSTM encoder."""

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence


def run_packed_lstm(
    lstm: nn.LSTM, inputs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """inputs [batch, length, features] (batch-first LSTM), mask [batch, length] bool (True = real token).

    Returns the outputs [batch, length, directions * hidden] at the real tokens' positions (zeros at padding)
    and the final states (h_n, c_n), [layers * directions, batch, hidden], after each sentence's last real token
    (for the backward direction: after its first). A sentence without real tokens gets zero outputs; its final
    states are those of one padding step and should not be used."""
    length = inputs.shape[1]
    # Move each row's real tokens to the front (in order), so that padding may sit anywhere in the row.
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    compact = torch.gather(inputs, 1, order[:, :, None].expand_as(inputs))
    lengths = mask.sum(dim=1)
    # pack_padded_sequence rejects empty rows: run them on one (discarded) step.
    packed = pack_padded_sequence(compact, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
    packed_outputs, final_states = lstm(packed)
    compact_outputs, _ = pad_packed_sequence(packed_outputs, batch_first=True, total_length=length)
    # Put every position back where it came from and zero the padding.
    outputs = torch.empty_like(compact_outputs)
    outputs.scatter_(1, order[:, :, None].expand_as(compact_outputs), compact_outputs)
    return outputs.masked_fill(~mask[:, :, None], 0.0), final_states
