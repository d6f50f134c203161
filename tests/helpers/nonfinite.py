"""The rows of scores with NaN and +inf that every normaliser's kernel is held to (issue 17): what torch.softmax
makes NaN, the kernels make NaN, output and gradients; masked keys are ignored whatever their score."""

import torch

INF, NAN = float("inf"), float("nan")

NONFINITE_ROWS = [  # (scores, mask) of 5 keys
    ([0.3, 1.0, -0.5, 2.0, 0.1], [1, 1, 1, 1, 1]),  # finite
    ([NAN, 1.0, 2.0, 0.5, 0.0], [1, 1, 1, 1, 1]),  # issue 17's sparsemax([nan, 1, 2, .5]) with one more key
    ([INF, 0.0, 0.0, 0.0, 0.0], [1, 1, 1, 1, 1]),  # issue 17's sparsemax([inf, 0, 0, 0])
    ([INF, INF, 0.0, 1.0, 0.0], [1, 1, 1, 1, 1]),
    ([INF, -INF, 0.0, 1.0, 0.0], [1, 1, 1, 1, 1]),
    ([NAN, -INF, -INF, -INF, -INF], [1, 1, 1, 1, 1]),  # NaN beside masked keys
    ([0.5, -INF, 1.5, -INF, 0.0], [1, 1, 1, 1, 1]),  # finite with -inf: exact zeros
    ([0.5, NAN, 1.5, INF, 0.0], [1, 0, 1, 0, 1]),  # NaN and +inf under mask=False: ignored
    ([NAN, INF, 1.0, 2.0, 3.0], [1, 0, 0, 1, 1]),  # NaN on an allowed key
    ([-INF, -INF, -INF, -INF, -INF], [1, 1, 1, 1, 1]),  # all masked: zeros (torch.softmax: NaN)
    ([1.0, 2.0, 3.0, INF, 0.0], [0, 0, 0, 0, 0]),  # all masked by mask: zeros
]


def nonfinite_batch(dtype):
    """`NONFINITE_ROWS` as (z, mask) and which rows torch.softmax(z.masked_fill(~mask, -inf)) makes NaN, leaving out
    the all-masked rows (NaN there, all zeros in the kernels: documented), and those all-masked rows."""
    z = torch.tensor([row[0] for row in NONFINITE_ROWS], dtype=dtype)
    mask = torch.tensor([row[1] for row in NONFINITE_ROWS], dtype=torch.bool)
    all_masked = ~(mask & (z != -INF)).any(-1)
    nan_rows = torch.softmax(z.float().masked_fill(~mask, -INF), -1).isnan().any(-1) & ~all_masked
    assert nan_rows.tolist() == [False, True, True, True, True, True, False, False, True, False, False]
    return z, mask, nan_rows, all_masked
