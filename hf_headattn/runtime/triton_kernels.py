"""Triton kernels for the sparse and constrained attention of Malaviya, Ferreira & Martins (2018), with their
autograd Functions (forward and backward written out, as in `sparse_attention`).

* `constrained_scan`: the whole loop of constrained attention over a layer's target positions (Eq. 5:
  u_t = max(f - beta_t, 0), alpha_t = csoftmax or csparsemax of z_t + c u_t under u_t, beta_{t+1} = beta_t + alpha_t)
  in one launch forward and one backward. One program per (sentence, head) row keeps the cumulative attention beta
  in registers and loops over the positions; the recurrence is not linear (u_t feeds the solver), so the positions
  cannot run in parallel. The backward runs them in reverse with the closed-form Jacobians (Eq. 7-8 and
  `sparse_attention.ConstrainedSoftmaxFunction`), carrying the gradient of beta back; it needs from the forward
  only each cell's partition (one byte: zero / free / at its bound, whether the clamp of f - beta passed, whether
  the row was NaN) and, for csoftmax, the weights.
* `sparsemax_rows`: sparsemax over the last dim of [rows, keys] scores, one program a row.

Every convention of `sparse_attention` holds: masked keys (and -inf scores) get 0 weight and 0 gradient, an
all-masked row is zeros, an infeasible row (bounds summing below 1) is alpha = u with dz = 0 and du = dalpha, a row
with a NaN or +inf score or a NaN bound on an allowed key is NaN (weights and gradients), ties go to the piece of
tau values just above the solution, and half-precision inputs are computed in float32. The solvers are exact up to
rounding: csoftmax caps keys until none exceeds its bound (each pass caps at least one more key), csparsemax finds
tau by Newton's method over the partitions inside a bisection bracket and stops when a step lands in the piece it
came from, sparsemax runs Michelot's algorithm. Unlike the torch solvers they compute in float32 only (float64
inputs take the torch path) and need a key row to fit one block (`fits_one_block`).

This module imports triton, which a saved model must not need: `sparse_attention.kernel_backend` decides whether a
kernel runs, and only then is this module imported.
"""

import contextlib

import torch
from torch.autograd.function import once_differentiable

try:  # Transformers' remote-code check skips imports in a try block: a saved model loads without triton
    import triton
    import triton.language as tl
except ImportError as error:
    raise ImportError("the Triton kernels of hf_headattn need triton (pip install 'hf_headattn[kernels]'); "
                      "without it the kernels run through torch (backend='torch')") from error


__all__ = ["MAX_KEYS", "constrained_scan", "fits_one_block", "sparsemax_rows"]


# A row's keys live in one block of registers. 2,048 float32 keys over 8 warps are 8 registers a thread per vector;
# tests/test_triton_kernels.py compiles every kernel at this block for sm_90 and fails on spills.
MAX_KEYS = 2048

# The partition byte of a cell: its class (bits 0-1), whether max(f - beta, 0) passed its gradient (f - beta >= 0,
# as torch.clamp's backward), whether the row's step was NaN, whether the key is masked (its score's gradient is 0
# whatever else happens, as through the torch path's masked_fill).
ZERO = tl.constexpr(0)
FREE = tl.constexpr(1)
AT_BOUND = tl.constexpr(2)
CLASS_BITS = tl.constexpr(3)
SLACK_PASSES = tl.constexpr(4)
NONFINITE = tl.constexpr(8)
MASKED = tl.constexpr(16)

# Bounds are clamped to [0, 2] before a solver sees them (as `sparse_solvers.clamped_bounds`): no probability
# exceeds 1, so a bound of 2 never binds and +inf (the <SINK>) never meets inf - inf.
NON_BINDING_BOUND = tl.constexpr(2.0)
# csoftmax's backward divides by the free keys' mass, floored here as the torch path floors it (float32's tiny).
FLOAT32_TINY = tl.constexpr(1.1754943508222875e-38)


def fits_one_block(keys: int) -> bool:
    """Whether a row of `keys` keys fits the kernels' one block."""
    return keys <= MAX_KEYS


def _block_and_warps(keys: int) -> tuple[int, int]:
    """The block (keys rounded up to a power of two, as tl.arange needs) and warps for a row: about 8 keys a thread."""
    block = triton.next_power_of_2(keys)
    return block, max(1, min(8, block // 256))


def _on_device_of(x: torch.Tensor):
    """Launches go to the current CUDA device: make it x's (a no-op off CUDA)."""
    return torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------------------
# The solvers, on one row in registers: zs are the scores minus the row maximum (-inf off `live`), us the bounds
# clamped to [0, NON_BINDING_BOUND] (0 off `live`).


@triton.jit
def _csoftmax_capping(zs, us, live, feasible):
    """Constrained softmax (Eq. 4): alpha_j = min(u_j, (1 - sum_R u) exp(z_j) / sum_{not R} exp(z)), R the capped
    keys, grown from none until no free key exceeds its bound. Capping a key raises every other key's share, so R
    only grows and each pass caps at least one more key. Returns (capped, the free keys' weights)."""
    capped = live & (zs != zs)  # none
    alpha_free = tl.zeros_like(zs)
    changed = feasible
    while changed:
        free = live & ~capped
        free_max = tl.max(tl.where(free, zs, float("-inf")), axis=0)  # the free keys' own shift: no underflow
        exps = tl.where(free, tl.exp(zs - free_max), 0.0)
        total = tl.sum(exps, axis=0)
        free_mass = 1.0 - tl.sum(tl.where(capped, us, 0.0), axis=0)
        alpha_free = free_mass * exps / tl.where(total > 0, total, 1.0)
        newly_capped = free & (alpha_free > us)  # a key exactly at its bound stays free
        capped = capped | newly_capped
        changed = tl.sum(newly_capped.to(tl.int32), axis=0) > 0
    return capped, alpha_free


@triton.jit
def _csparsemax_threshold(zs, us, live, feasible):
    """Constrained sparsemax's tau (Eq. 6): the root of g(tau) = sum_j clip(z_j - tau, 0, u_j) = 1, piecewise linear
    and decreasing. The bracket [lo, hi] keeps g(lo) >= 1 > g(hi); each pass evaluates g and the partition at tau and
    moves to the root of that piece's line (a Newton step) if it lies inside the bracket, else to the bracket's
    middle. A root that stays in its own piece is the solution; a bracket with no float between its ends (the root
    within an ulp) ends the search with its piece's root too."""
    lo = tl.min(tl.where(live, zs - tl.minimum(us, 1.0), float("inf")), axis=0)  # every key at min(u, 1): g >= 1
    hi = tl.max(tl.where(live, zs, float("-inf")), axis=0)  # 0: g(hi) = 0
    tau = lo
    searching = feasible
    while searching:
        excess = zs - tau
        free = live & (excess > 0) & (excess <= us)
        at_bound = live & (excess > us)
        n_free = tl.sum(free.to(tl.float32), axis=0)
        bound_mass = tl.sum(tl.where(at_bound, us, 0.0), axis=0)
        mass = tl.sum(tl.where(free, excess, 0.0), axis=0) + bound_mass
        lo = tl.where(mass >= 1.0, tau, lo)
        hi = tl.where(mass >= 1.0, hi, tau)
        piece_root = (tl.sum(tl.where(free, zs, 0.0), axis=0) + bound_mass - 1.0) / tl.maximum(n_free, 1.0)
        root_excess = zs - piece_root
        moved = live & ((((root_excess > 0) & (root_excess <= us)) != free) | ((root_excess > us) != at_bound))
        settled = (n_free > 0) & (tl.sum(moved.to(tl.int32), axis=0) == 0)
        middle = lo + 0.5 * (hi - lo)
        exhausted = (middle <= lo) | (middle >= hi)
        inside = (n_free > 0) & (piece_root > lo) & (piece_root < hi)
        tau = tl.where(settled | inside | (exhausted & (n_free > 0)), piece_root, middle)
        searching = ~(settled | exhausted)
    return tau


@triton.jit
def _sparsemax_threshold(zs, live):
    """sparsemax's tau (Eq. 3) by Michelot's algorithm: from tau = max(z) - 1 (g(tau) >= 1), tau = (sum of the
    support - 1) / |support| over the support {z > tau}, which only shrinks, until it no longer changes."""
    tau = tl.max(tl.where(live, zs, 0.0), axis=0) - 1.0
    support = live & (zs > tau)
    changing = tl.sum(support.to(tl.int32), axis=0) > 0
    while changing:
        tau = (tl.sum(tl.where(support, zs, 0.0), axis=0) - 1.0) / tl.sum(support.to(tl.float32), axis=0)
        kept = support & (zs > tau)  # a key exactly at tau counts as zero
        changing = tl.sum((kept != support).to(tl.int32), axis=0) > 0
        support = kept
    return tau


@triton.jit
def _constrained_solve(z, u, attendable, SPARSE: tl.constexpr):
    """alpha = csparsemax(z, u) (SPARSE) or csoftmax(z, u) over the `attendable` keys of one row, and each cell's
    class (ZERO / FREE / AT_BOUND, NONFINITE on every cell of a NaN row)."""
    live = attendable & (z > float("-inf"))  # -inf scores are masked keys too (NaN is not > -inf)
    bad = (attendable & ((z != z) | (z == float("inf")))) | (live & (u != u))
    nonfinite = tl.sum(bad.to(tl.int32), axis=0) > 0
    live = live & (z < float("inf"))  # a NaN row is solved on its finite keys, then filled with NaN
    row_max = tl.max(tl.where(live, z, float("-inf")), axis=0)
    zs = tl.where(live, z - row_max, float("-inf"))
    us = tl.where(live & (u == u), tl.minimum(tl.where(u < 0, 0.0, u), NON_BINDING_BOUND), 0.0)
    feasible = tl.sum(us, axis=0) >= 1.0
    # An infeasible row has every key at its bound. (The scalar `feasible` enters the blocks through tl.where, not
    # `&`: Triton 3.9's interpreter broadcasts a comparison of float scalars as float32, which `&` refuses.)
    if SPARSE:
        tau = _csparsemax_threshold(zs, us, live, feasible)
        excess = zs - tau
        free = tl.where(feasible, live & (excess > 0) & (excess <= us), False)
        capped = live & tl.where(feasible, excess > us, True)
        alpha = tl.where(capped, us, tl.where(free, excess, 0.0))
    else:
        capped, alpha_free = _csoftmax_capping(zs, us, live, feasible)
        free = tl.where(feasible, live & ~capped, False)
        capped = live & tl.where(feasible, capped, True)
        alpha = tl.where(capped, us, tl.where(free, alpha_free, 0.0))
    alpha = tl.where(nonfinite, float("nan"), alpha)
    cell = tl.where(free, FREE, tl.where(capped, AT_BOUND, ZERO)) | tl.where(nonfinite, NONFINITE, 0)
    return alpha, cell


# ----------------------------------------------------------------------------------------------------------
# The constrained scan.


@triton.jit
def _constrained_scan_forward(
    scores, stride_sb, stride_sh, stride_st,
    fertility, stride_fb, stride_fh,
    allowed, stride_ab, stride_ah,
    start, weights, partition, final,
    heads, targets, keys, sources, exhaustion,
    HAS_ALLOWED: tl.constexpr, HAS_START: tl.constexpr, BONUS: tl.constexpr, SPARSE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    sentence = row // heads
    head = row % heads
    key = tl.arange(0, BLOCK)
    in_row = key < keys
    is_source = key < sources  # with the sink, key `sources` is the <SINK>
    attendable = in_row
    if HAS_ALLOWED:
        attendable = attendable & (tl.load(allowed + sentence * stride_ab + head * stride_ah + key,
                                           mask=in_row, other=0) != 0)
    fert = tl.load(fertility + sentence * stride_fb + head * stride_fh + key, mask=is_source, other=0.0)
    fert = fert.to(tl.float32)
    if HAS_START:
        beta = tl.load(start + row * sources + key, mask=is_source, other=0.0).to(tl.float32)
    else:
        beta = tl.zeros([BLOCK], dtype=tl.float32)
    for t in range(targets):
        z = tl.load(scores + sentence * stride_sb + head * stride_sh + t * stride_st + key, mask=in_row, other=0.0)
        z = z.to(tl.float32)
        slack = fert - beta
        bound = tl.where(slack < 0, 0.0, slack)  # max(f - beta, 0), keeping NaN
        bound = tl.where(is_source, bound, float("inf"))  # the <SINK>'s fertility is unbounded
        if BONUS:
            z = z + exhaustion * tl.where(is_source, bound, 0.0)  # z' = z + c u; the sink has no bonus
        alpha, cell = _constrained_solve(z, bound, attendable, SPARSE)
        cell = cell | tl.where(is_source & (slack >= 0), SLACK_PASSES, 0) | tl.where(attendable, 0, MASKED)
        offset = (row * targets + t) * keys + key
        tl.store(weights + offset, alpha, mask=in_row)
        tl.store(partition + offset, cell.to(tl.uint8), mask=in_row)
        beta = beta + tl.where(is_source, alpha, 0.0)
    tl.store(final + row * sources + key, beta, mask=is_source)


@triton.jit
def _constrained_scan_backward(
    grad_weights, grad_final, weights, partition,
    grad_scores, grad_fertility, grad_start,
    targets, keys, sources, exhaustion,
    HAS_GRAD_WEIGHTS: tl.constexpr, HAS_GRAD_FINAL: tl.constexpr, BONUS: tl.constexpr, SPARSE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    key = tl.arange(0, BLOCK)
    in_row = key < keys
    is_source = key < sources
    if HAS_GRAD_FINAL:
        grad_beta = tl.load(grad_final + row * sources + key, mask=is_source, other=0.0).to(tl.float32)
    else:
        grad_beta = tl.zeros([BLOCK], dtype=tl.float32)
    grad_fert = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(targets):
        t = targets - 1 - step
        offset = (row * targets + t) * keys + key
        cell = tl.load(partition + offset, mask=in_row, other=0).to(tl.int32)
        # alpha_t feeds the output and, through beta_{t+1} = beta_t + alpha_t, every later step
        grad_alpha = tl.where(is_source, grad_beta, 0.0)
        if HAS_GRAD_WEIGHTS:
            grad_alpha += tl.load(grad_weights + offset, mask=in_row, other=0.0).to(tl.float32)
        # 0/1 indicators multiply (not select), as in the torch path: a NaN gradient reaching a row (through beta,
        # from a later NaN step) makes all of it NaN there too
        free = ((cell & CLASS_BITS) == FREE).to(tl.float32)
        capped = ((cell & CLASS_BITS) == AT_BOUND).to(tl.float32)
        if SPARSE:  # Eq. 7-8: m = mean of dalpha over the free keys
            mean = tl.sum(free * grad_alpha, axis=0) / tl.maximum(tl.sum(free, axis=0), 1.0)
            grad_z = free * (grad_alpha - mean)
        else:  # m = sum_A alpha dalpha / sum_A alpha over the free keys A; dz = 1[A] alpha (dalpha - m)
            alpha_free = free * tl.load(weights + offset, mask=in_row, other=0.0)
            free_mass = tl.sum(alpha_free, axis=0)
            mean = tl.sum(alpha_free * grad_alpha, axis=0) / tl.maximum(free_mass, FLOAT32_TINY)
            grad_z = alpha_free * (grad_alpha - mean)
        grad_u = capped * (grad_alpha - mean)
        nonfinite = (cell & NONFINITE) != 0
        grad_z = tl.where(nonfinite, float("nan"), grad_z)
        grad_u = tl.where(nonfinite, float("nan"), grad_u)
        grad_z = tl.where((cell & MASKED) != 0, 0.0, grad_z)
        tl.store(grad_scores + offset, grad_z, mask=in_row)
        if BONUS:
            grad_u += exhaustion * grad_z  # z' = z + c u
        grad_slack = tl.where(is_source & ((cell & SLACK_PASSES) != 0), grad_u, 0.0)  # u = max(f - beta, 0)
        grad_fert += grad_slack
        grad_beta -= grad_slack
    tl.store(grad_fertility + row * sources + key, grad_fert, mask=is_source)
    tl.store(grad_start + row * sources + key, grad_beta, mask=is_source)


def _last_dim_dense(x: torch.Tensor) -> torch.Tensor:
    """x itself if its last dim is dense (the kernels take the other strides as given), else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


class ConstrainedScanFunction(torch.autograd.Function):
    """The constrained scan of `constrained_scan` (see the module docstring): scores [batch, heads, targets, keys],
    fertility [batch, 1 or heads, sources], start (beta before the first position) [batch, heads, sources] or None,
    allowed [batch, 1 or heads, keys] bool or None. Returns (weights [batch, heads, targets, keys], beta after the
    last position [batch, heads, sources]), both in the scores' dtype."""

    @staticmethod
    def forward(ctx, scores, fertility, start, allowed, exhaustion: float, sink: bool, sparse: bool):
        batch, heads, targets, keys = scores.shape
        sources = keys - 1 if sink else keys
        block, warps = _block_and_warps(keys)
        scores_in = _last_dim_dense(scores)
        fertility_in = _last_dim_dense(fertility.expand(batch, heads, sources))
        allowed_in = None if allowed is None else _last_dim_dense(allowed.expand(batch, heads, keys)).view(torch.uint8)
        start_in = None if start is None else start.expand(batch, heads, sources).contiguous()
        weights = scores.new_empty(batch, heads, targets, keys, dtype=torch.float32)
        partition = scores.new_empty(batch, heads, targets, keys, dtype=torch.uint8)
        final = scores.new_empty(batch, heads, sources, dtype=torch.float32)
        with _on_device_of(scores):
            _constrained_scan_forward[(batch * heads,)](
                scores_in, scores_in.stride(0), scores_in.stride(1), scores_in.stride(2),
                fertility_in, fertility_in.stride(0), fertility_in.stride(1),
                scores_in if allowed_in is None else allowed_in,
                0 if allowed_in is None else allowed_in.stride(0), 0 if allowed_in is None else allowed_in.stride(1),
                scores_in if start_in is None else start_in, weights, partition, final,
                heads, targets, keys, sources, float(exhaustion),
                HAS_ALLOWED=allowed_in is not None, HAS_START=start_in is not None, BONUS=exhaustion != 0,
                SPARSE=sparse, BLOCK=block, num_warps=warps,
            )
        ctx.save_for_backward(None if sparse else weights, partition)
        ctx.settings = (exhaustion, sparse, sources, block, warps)
        ctx.input_shapes = (scores.dtype, fertility.shape, fertility.dtype,
                            None if start is None else (start.shape, start.dtype))
        return weights.to(scores.dtype), final.to(scores.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_weights, grad_final):
        weights, partition = ctx.saved_tensors
        exhaustion, sparse, sources, block, warps = ctx.settings
        scores_dtype, fertility_shape, fertility_dtype, start_spec = ctx.input_shapes
        batch, heads, targets, keys = partition.shape
        grad_scores = partition.new_empty(batch, heads, targets, keys, dtype=torch.float32)
        grad_fertility = partition.new_empty(batch, heads, sources, dtype=torch.float32)
        grad_start = partition.new_empty(batch, heads, sources, dtype=torch.float32)
        grad_weights = None if grad_weights is None else grad_weights.contiguous()
        grad_final = None if grad_final is None else grad_final.contiguous()
        with _on_device_of(partition):
            _constrained_scan_backward[(batch * heads,)](
                grad_scores if grad_weights is None else grad_weights,
                grad_scores if grad_final is None else grad_final,
                grad_scores if weights is None else weights, partition,
                grad_scores, grad_fertility, grad_start,
                targets, keys, sources, float(exhaustion),
                HAS_GRAD_WEIGHTS=grad_weights is not None, HAS_GRAD_FINAL=grad_final is not None, BONUS=exhaustion != 0,
                SPARSE=sparse, BLOCK=block, num_warps=warps,
            )
        grad_fertility = grad_fertility.sum_to_size(fertility_shape).to(fertility_dtype)
        grad_start = None if start_spec is None else grad_start.sum_to_size(start_spec[0]).to(start_spec[1])
        return grad_scores.to(scores_dtype), grad_fertility, grad_start, None, None, None, None


def constrained_scan(scores, fertility, start, allowed, *, exhaustion: float, sink: bool, sparse: bool):
    """Constrained attention over every target position of `scores` in one kernel (see `ConstrainedScanFunction`):
    csparsemax if `sparse`, else csoftmax. The caller checks `fits_one_block` first."""
    return ConstrainedScanFunction.apply(scores, fertility, start, allowed, exhaustion, sink, sparse)


# ----------------------------------------------------------------------------------------------------------
# Row-wise sparsemax.


@triton.jit
def _sparsemax_forward(scores, weights, keys, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    key = tl.arange(0, BLOCK)
    in_row = key < keys
    z = tl.load(scores + row * keys + key, mask=in_row, other=float("-inf")).to(tl.float32)
    nonfinite = tl.sum((in_row & ((z != z) | (z == float("inf")))).to(tl.int32), axis=0) > 0
    live = in_row & (z > float("-inf")) & (z < float("inf"))
    zs = tl.where(live, z - tl.max(tl.where(live, z, float("-inf")), axis=0), float("-inf"))
    tau = _sparsemax_threshold(zs, live)
    alpha = tl.where(live & (zs > tau), zs - tau, 0.0)
    tl.store(weights + row * keys + key, tl.where(nonfinite, float("nan"), alpha), mask=in_row)


@triton.jit
def _sparsemax_backward(grad_weights, weights, grad_scores, keys, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    key = tl.arange(0, BLOCK)
    in_row = key < keys
    alpha = tl.load(weights + row * keys + key, mask=in_row, other=0.0)
    grad = tl.load(grad_weights + row * keys + key, mask=in_row, other=0.0).to(tl.float32)
    support = (alpha > 0).to(tl.float32)
    mean = tl.sum(support * grad, axis=0) / tl.maximum(tl.sum(support, axis=0), 1.0)
    grad_z = support * (grad - mean)  # 1[alpha > 0] (dalpha - mean over the support)
    nonfinite = tl.sum((in_row & (alpha != alpha)).to(tl.int32), axis=0) > 0
    tl.store(grad_scores + row * keys + key, tl.where(nonfinite, float("nan"), grad_z), mask=in_row)


class SparsemaxRowsFunction(torch.autograd.Function):
    """sparsemax over the last dim of contiguous float32 scores with -inf on masked keys (as
    `sparse_attention._prepare` gives them). Returns float32 weights of the same shape."""

    @staticmethod
    def forward(ctx, z):
        keys = z.shape[-1]
        block, warps = _block_and_warps(keys)
        weights = torch.empty_like(z, dtype=torch.float32)
        with _on_device_of(z):
            _sparsemax_forward[(z.numel() // keys,)](z, weights, keys, BLOCK=block, num_warps=warps)
        ctx.save_for_backward(weights)
        ctx.launch = (block, warps)
        return weights

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_weights):
        (weights,) = ctx.saved_tensors
        block, warps = ctx.launch
        keys = weights.shape[-1]
        grad_scores = torch.empty_like(weights)
        with _on_device_of(weights):
            _sparsemax_backward[(weights.numel() // keys,)](grad_weights.contiguous(), weights, grad_scores, keys,
                                                            BLOCK=block, num_warps=warps)
        return grad_scores


def sparsemax_rows(z: torch.Tensor) -> torch.Tensor:
    """sparsemax over the last dim in one kernel (see `SparsemaxRowsFunction`). The caller checks `fits_one_block`
    first."""
    return SparsemaxRowsFunction.apply(z)
