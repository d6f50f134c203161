"""Run an `nn.LSTM` over padded batches exactly: a sentence gets the same outputs and final states alone and
inside a padded batch, wherever its padding sits. Shared by the fertility tagger and the LSTM encoder."""

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from .attention_base import unrolled_length


def run_packed_lstm(
    lstm: nn.LSTM, inputs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """inputs [batch, length, features] (batch-first LSTM), mask [batch, length] bool (True = real token).

    Returns the outputs [batch, length, directions * hidden] at the real tokens' positions (zeros at padding)
    and the final states (h_n, c_n), [layers * directions, batch, hidden], after each sentence's last real token
    (for the backward direction: after its first). A sentence without real tokens gets zero outputs; its final
    states are those of one padding step and should not be used. Under autocast the LSTM runs in its own
    dtype (see `_without_autocast`)."""
    if torch.is_autocast_enabled(inputs.device.type):
        return _without_autocast(run_packed_lstm, lstm, inputs, mask)
    if torch.compiler.is_exporting():
        layer_outputs, final_states = _run_masked(lstm, inputs, mask)
        return layer_outputs[-1], final_states
    return _run_packed(lstm, inputs, mask)


def run_packed_lstm_layers(
    lstm: nn.LSTM, inputs: torch.Tensor, mask: torch.Tensor
) -> tuple[list[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """`run_packed_lstm` one layer at a time: returns every layer's outputs [batch, length, directions * hidden]
    (zeros at padding) and the same final states. Each layer's outputs are the tensor the next layer reads (through
    the LSTM's inter-layer dropout), so gradients reach them; the numbers are those of the fused multi-layer run."""
    if torch.is_autocast_enabled(inputs.device.type):
        return _without_autocast(run_packed_lstm_layers, lstm, inputs, mask)
    if torch.compiler.is_exporting():
        return _run_masked(lstm, inputs, mask)
    layer_outputs, hidden, cell = [], [], []
    layer_input = inputs
    for layer in range(lstm.num_layers):
        if layer:  # nn.LSTM's dropout on the outputs of every layer but the last
            layer_input = nn.functional.dropout(layer_outputs[-1], p=lstm.dropout, training=lstm.training)
        outputs, (layer_hidden, layer_cell) = _run_packed(lambda packed: _lstm_layer(lstm, layer, packed),
                                                          layer_input, mask)
        layer_outputs.append(outputs)
        hidden.append(layer_hidden)
        cell.append(layer_cell)
    return layer_outputs, (torch.cat(hidden), torch.cat(cell))


def _without_autocast(run, lstm: nn.LSTM, inputs: torch.Tensor, mask: torch.Tensor):
    """`run(lstm, inputs, mask)` with autocast off and the inputs in the LSTM's parameter dtype (float32 for a
    float32 model under bf16/fp16 autocast). Autocast runs `nn.LSTM` in reduced precision, and oneDNN has no CPU
    LSTM primitive for some of those calls ("could not create a primitive descriptor for the LSTM forward
    propagation primitive": every batch whose sentences have equal lengths, batch 1 included; in float16, and in
    bfloat16 on CPUs without AVX512-BF16); a bare `nn.LSTM` fails the same way. The recurrence is a small share of
    the model's work, and float32 keeps its numbers those of the float32 model; the outputs come back in float32 and
    autocast casts them where they are read."""
    with torch.autocast(inputs.device.type, enabled=False):
        return run(lstm, inputs.to(lstm.weight_ih_l0.dtype), mask)


def _lstm_layer(lstm: nn.LSTM, layer: int, packed):
    """Layer `layer` of `lstm` over a PackedSequence, with that layer's own parameters (what nn.LSTM runs for it)."""
    directions = 2 if lstm.bidirectional else 1
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if lstm.bias else ("weight_ih", "weight_hh")
    weights = [getattr(lstm, f"{name}_l{layer}{suffix}") for suffix in ("", "_reverse")[:directions] for name in names]
    zeros = packed.data.new_zeros(directions, packed.batch_sizes[0], lstm.hidden_size)
    outputs, hidden, cell = torch.lstm(packed.data, packed.batch_sizes, (zeros, zeros), weights, lstm.bias, 1, 0.0,
                                       lstm.training, lstm.bidirectional)
    # the states come out in the packed (length-sorted) order; put them back in the batch's order
    unsort = packed.unsorted_indices
    final_states = (hidden.index_select(1, unsort), cell.index_select(1, unsort))
    return packed._replace(data=outputs), final_states


def _run_packed(run, inputs: torch.Tensor, mask: torch.Tensor):
    """`run_packed_lstm` with `run` (PackedSequence -> (PackedSequence, final states)) in place of the LSTM."""
    length = inputs.shape[1]
    # Move each row's real tokens to the front (in order), so that padding may sit anywhere in the row.
    order = torch.sort((~mask).to(torch.int8), dim=1, stable=True).indices
    compact = torch.gather(inputs, 1, order[:, :, None].expand_as(inputs))
    lengths = mask.sum(dim=1)
    # pack_padded_sequence rejects empty rows: run them on one (discarded) step.
    packed = pack_padded_sequence(compact, lengths.clamp(min=1).cpu(), batch_first=True, enforce_sorted=False)
    packed_outputs, final_states = run(packed)
    compact_outputs, _ = pad_packed_sequence(packed_outputs, batch_first=True, total_length=length)
    # Put every position back where it came from and zero the padding.
    outputs = torch.empty_like(compact_outputs)
    outputs.scatter_(1, order[:, :, None].expand_as(compact_outputs), compact_outputs)
    return outputs.masked_fill(~mask[:, :, None], 0.0), final_states


def _run_masked(lstm: nn.LSTM, inputs: torch.Tensor, mask: torch.Tensor):
    """`run_packed_lstm_layers` for torch.export, which cannot pack: the lengths, hence the packed shapes, depend on
    the data. Each direction of each layer runs `torch.lstm_cell` over the positions (backwards for the reverse
    direction), and a padding position leaves the state as it was and outputs zeros, so each direction reads a
    sentence's real tokens in order from a zero state: the numbers of packing, up to rounding. (A sentence without
    real tokens keeps zero final states.) The exported program unrolls the loop: the source length must be static."""
    batch, length = mask.shape
    length = unrolled_length(length, "an LSTM's loop over source positions (the LSTM encoder's or the PREDICTED fertility tagger's)")
    names = ("weight_ih", "weight_hh", "bias_ih", "bias_hh") if lstm.bias else ("weight_ih", "weight_hh")
    real = mask[:, :, None]
    layer_outputs, hidden, cell = [], [], []
    layer_input = inputs
    for layer in range(lstm.num_layers):
        if layer:  # nn.LSTM's dropout on the outputs of every layer but the last
            layer_input = nn.functional.dropout(layer_outputs[-1], p=lstm.dropout, training=lstm.training)
        direction_outputs = []
        for suffix in ("", "_reverse")[: 2 if lstm.bidirectional else 1]:
            weights = [getattr(lstm, f"{name}_l{layer}{suffix}") for name in names]
            h = c = layer_input.new_zeros(batch, lstm.hidden_size)
            outputs = [None] * length
            for t in (range(length) if not suffix else reversed(range(length))):
                h_t, c_t = torch.lstm_cell(layer_input[:, t], (h, c), *weights)
                h, c = torch.where(real[:, t], h_t, h), torch.where(real[:, t], c_t, c)
                outputs[t] = torch.where(real[:, t], h_t, 0.0)
            direction_outputs.append(torch.stack(outputs, dim=1))
            hidden.append(h)
            cell.append(c)
        layer_outputs.append(torch.cat(direction_outputs, dim=-1))
    return layer_outputs, (torch.stack(hidden), torch.stack(cell))
