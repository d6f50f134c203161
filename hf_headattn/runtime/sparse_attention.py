"""Sparse and constrained attention transformations (Malaviya, Ferreira & Martins, 2018, Sec. 3; the entmax family
of Peters, Niculae & Martins, 2019, and Correia, Niculae & Martins, 2019).

Drop-in replacements for ``softmax`` over the keys, each mapping scores ``z`` (and, for the constrained ones, upper
bounds ``u``; for ``entmax_bisect``, the order ``a`` of its argument ``alpha``) to a probability distribution
``alpha``:

* ``sparsemax(z)`` (Eq. 3; Martins & Astudillo, 2016): the Euclidean projection of ``z`` onto the probability
  simplex, ``alpha_j = max(0, z_j - tau)``. Exactly zero on low-scoring keys.
* ``csoftmax(z, u)`` (Eq. 4; Martins & Kreutzer, 2017): the distribution closest in KL to ``softmax(z)`` with
  ``alpha <= u``, ``alpha_j = min(u_j, exp(z_j) / Z)``. Strictly positive (where ``u > 0``), never above the
  bound: used with ``u_t = f - beta_{t-1}`` (Eq. 5, fertility minus cumulative attention) it is sparse over
  decoding steps.
* ``csparsemax(z, u)`` (Eq. 6; the paper's proposal): the Euclidean projection onto the simplex intersected
  with the box ``0 <= alpha <= u``, ``alpha_j = max(0, min(u_j, z_j - tau))`` (Proposition 1, as corrected in
  the project's paper notes). Sparse over keys and over decoding steps.
* ``entmax15(z)`` (Peters et al., 2019): 1.5-entmax, ``alpha_j = [z_j / 2 - tau]_+^2``, the Tsallis-entropy map
  halfway between softmax and sparsemax: exact zeros, with a wider and smoother support than sparsemax's.
* ``entmax_bisect(z, a)`` (Peters et al., 2019, Eq. 10; Correia et al., 2019): a-entmax for any ``a`` in (1, 2],
  ``alpha_j = [(a - 1) z_j - tau]_+^(1 / (a - 1))`` (``a = 2``: sparsemax, ``a -> 1``: softmax), differentiable in
  ``a`` too, for an ``a`` learned per head.

The forward passes are exact (no iteration to a tolerance; ``entmax_bisect``'s bisection runs a fixed number of steps
that pins tau to rounding): their solvers (active-set passes with a sort-based
fallback, and csparsemax's compiled passes) are in `sparse_solvers`. Every backward pass is written out here (no
autograd through a sort or an iteration), from the partition the solver settles on. Off the CPU, forward and backward
read no tensor value on the host (no synchronisation with the device; `sparse_solvers`, "Host synchronisation").

Shared conventions:

* ``mask`` is a bool tensor broadcastable to ``z`` (True = the key may be attended); keys whose score is
  ``-inf`` are masked too. Masked keys get exactly 0 attention and 0 gradient (for ``z`` and ``u``); a row
  with every key masked is all zeros with zero gradient, never NaN. Pass padding through ``mask`` or
  ``-inf``: a large finite negative score (e.g. ``finfo.min``) is an ordinary key, which ``csoftmax`` or
  ``csparsemax`` may have to give attention to when the other keys' bounds are exhausted.
* ``entmax_bisect``'s ``a`` is a number in (1, 2] or a tensor broadcastable to ``z`` with size 1 along ``dim`` (one
  per row); the gradient is reduced back to its shape. A tensor's values are not read: a row whose ``a`` is outside
  (1, 2] or NaN is NaN, as a row with a NaN score is (below).
* ``u`` is broadcastable to ``z``; the gradient is reduced back to ``u``'s shape. ``u`` must be ``>= 0``;
  ``u = +inf`` means unbounded (e.g. the ``<SINK>`` token). Bounds ``>= 1`` never bind (no
  probability exceeds 1). Negative bounds (which only arise from rounding in ``f - beta``) are treated as 0
  and get the gradient of a zero bound.
* Infeasible rows: if the bounds of a row's allowed keys sum to less than 1, no distribution satisfies them.
  Then ``alpha = u`` on the allowed keys (every key capped at its bound, so the row sums to ``sum(u) < 1``),
  which is the limit of the solution as ``sum(u)`` decreases to 1; the gradients are those of that map:
  ``dz = 0`` and ``du = dalpha`` on the allowed keys. Add a sink key with ``u = inf`` to rule this out.
* float16/bfloat16 inputs are computed in float32, float64 inputs in float64; the result has ``z``'s dtype.
* NaN and ``+inf`` propagate as through ``torch.softmax``, which returns a row of NaN (and NaN gradients) when any
  score of the row is NaN or ``+inf`` (``+inf - +inf`` in its shift by the row maximum): so that a numerical
  failure upstream (an overflowed or NaN score) shows instead of becoming a plausible distribution, a row with a
  NaN or ``+inf`` score on an allowed key, or a NaN bound on an allowed key, is NaN everywhere, and so are its
  gradients for ``z`` and ``u``. Masked keys' scores and bounds are ignored, as ``masked_fill(~mask, -inf)``
  would ignore them (so a NaN score under ``mask=False`` changes nothing), and ``-inf`` scores in a finite row
  stay exact zeros. Unlike ``torch.softmax``, a row whose keys are all masked is all zeros, not NaN (see above).
  Other rows of the batch are unaffected.
* Scores are shifted by the row maximum, and results are exact up to rounding of quantities of the size of
  ``z - max(z)``: float32 errors grow like ``|z| * 1e-7`` (about ``1e-6`` for scores of size 5). ``csparsemax``
  needs ``|z - max(z)|`` small enough that ``z - u`` differs from ``z`` in floating point, another reason to mask
  padding rather than give it a ``finfo.min`` score.

Degenerate points (ties at a breakpoint, bounds that sum to exactly 1) are handled exactly in the forward
pass. Where the map is not differentiable, the backward pass returns the one-sided derivative of a piece
adjacent to the solution: the one given by the partition the solver settles on, whose key sets are fixed by
the search rather than by comparing rounded values afterwards, and which for a feasible row always has a free
key (rows where it would not go to the sort-based search). Ties go the way of the piece of tau values just
above the solution: a key exactly at zero counts as zero, a key exactly at its bound as free. E.g. one-hot
attention under unit bounds (alpha_j = u_j = 1) gets the ``sparsemax`` gradient and no gradient to ``u``.
"""

import importlib.util
import os
import warnings

import torch
from torch.autograd.function import once_differentiable

from .sparse_solvers import (
    as_rows,
    clamped_bounds,
    fill_nonfinite,
    nonfinite_rows,
    row_sum,
    solve_csoftmax,
    solve_csparsemax,
    solve_entmax15,
    solve_entmax_bisect,
    solve_for_export,
    solve_sparsemax,
    torch_compiled,
)


__all__ = ["csoftmax", "csparsemax", "entmax15", "entmax_bisect", "kernel_backend", "sparsemax"]


# ----------------------------------------------------------------------------------------------------------
# Which kernels run: torch's (the solvers below; everywhere) or Triton's (`triton_kernels`; CUDA, or any device the
# environment names, e.g. the CPU under TRITON_INTERPRET=1).

KERNELS_VARIABLE = "HF_HEADATTN_KERNELS"
BACKENDS = ("auto", "torch", "triton")
# The largest key row of the Triton kernels (`triton_kernels.MAX_KEYS`), repeated here so that choosing a backend
# imports no triton; tests/test_triton_kernels.py checks that the two agree.
TRITON_MAX_KEYS = 2048


def kernel_backend(x: torch.Tensor, backend: str = "auto", *, keys: int) -> str:
    """"torch" or "triton": the kernels that compute on `x` (rows of `keys` keys). "auto" takes the environment
    variable HF_HEADATTN_KERNELS ("torch" or "triton") where it is set, else Triton where x is on CUDA and triton is
    installed, else torch. Whatever was asked, torch runs where Triton cannot: under torch.export or torch.compile,
    for float64 (the kernels compute in float32), and, with a warning, for rows longer than the kernels' block."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
    if backend == "auto":
        backend = os.environ.get(KERNELS_VARIABLE, "")
        if backend not in ("", "torch", "triton"):
            raise ValueError(f"{KERNELS_VARIABLE} must be 'torch' or 'triton' (or unset); got {backend!r}")
        if not backend:
            backend = "triton" if x.is_cuda and importlib.util.find_spec("triton") is not None else "torch"
    if backend == "torch" or torch.compiler.is_compiling() or x.dtype == torch.float64:
        return "torch"
    if keys > TRITON_MAX_KEYS:
        warnings.warn(f"rows of {keys} keys do not fit the Triton kernels' block of {TRITON_MAX_KEYS}: they run "
                      "through torch", stacklevel=3)
        return "torch"
    return "triton"


# ----------------------------------------------------------------------------------------------------------
# The autograd Functions on [rows, keys] inputs: the solvers' forward, the written-out backward.


class SparsemaxFunction(torch.autograd.Function):
    """sparsemax over the last dim (Eq. 3): alpha_j = max(0, z_j - tau) with sum_j alpha_j = 1.

    Input: scores with -inf on masked keys. Forward: Michelot's algorithm from tau = max(z) - 1 (a lower bound:
    no alpha_j exceeds 1; `sparse_solvers._sparsemax_pass`), or sorting (`sparse_solvers._sparsemax_sort`).
    Backward: dz = 1[alpha > 0] (dalpha - mean of dalpha over the support).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        row_max = as_rows(z).amax(dim=-1, keepdim=True)
        zs = as_rows(z) - torch.nan_to_num(row_max, neginf=0.0)  # NaN rows: junk for the solver, NaN below
        nonfinite = nonfinite_rows(row_max)
        alpha, support_size = solve_sparsemax(zs)
        ctx.nonfinite = fill_nonfinite(nonfinite, alpha)
        ctx.save_for_backward(alpha, support_size)
        return alpha.view(z.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        alpha, support_size = ctx.saved_tensors
        support = torch.gt(alpha, 0, out=torch.empty_like(alpha))
        grad_support = as_rows(grad_alpha) * support
        m = row_sum(grad_support) / support_size.clamp(min=1)  # mean over the support
        grad_z = grad_support.addcmul_(support, m, value=-1)  # Eq. 7 without bounds: 1[alpha_j > 0](dalpha_j - m)
        fill_nonfinite(ctx.nonfinite, grad_z)
        return grad_z.view(grad_alpha.shape)


class ConstrainedSoftmaxFunction(torch.autograd.Function):
    """Constrained softmax over the last dim (Eq. 4): alpha_j = min(u_j, g exp(z_j)) with sum_j alpha_j = 1.

    Inputs: scores with -inf on masked keys, bounds. Forward: the capping
    iteration of the authors' implementation from no key capped (`sparse_solvers._csoftmax_pass`), or sorting
    (`sparse_solvers._csoftmax_sort`); infeasible rows (sum u < 1): alpha = u.
    Backward (A = allowed keys below their bound, R = capped keys):
    dz_j = 1[j in A] alpha_j (dalpha_j - m), du_j = 1[j in R] (dalpha_j - m),
    m = sum_{A} alpha_i dalpha_i / sum_{A} alpha_i  (sum_{A} alpha_i = 1 - sum_{R} u_i); m = 0 if A is empty.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        zs, us = as_rows(z), clamped_bounds(u, z)
        nonfinite = nonfinite_rows(zs.amax(dim=-1, keepdim=True), us)  # junk for the solver, NaN below
        alpha, alpha_free, capped, free_mass = solve_csoftmax(zs, us)
        ctx.nonfinite = fill_nonfinite(nonfinite, alpha)
        ctx.save_for_backward(alpha_free, capped, free_mass)
        return alpha.view(z.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        alpha_free, capped, free_mass = ctx.saved_tensors
        grad = as_rows(grad_alpha)
        weighted = grad * alpha_free
        m = row_sum(weighted) / free_mass.clamp(min=torch.finfo(alpha_free.dtype).tiny)  # 0 if A is empty
        grad_z = weighted.addcmul_(alpha_free, m, value=-1)  # dz_j = 1[j in A] alpha_j (dalpha_j - m)
        grad_u = torch.sub(grad, m).mul_(capped)  # du_j = 1[j in R] (dalpha_j - m)
        fill_nonfinite(ctx.nonfinite, grad_z, grad_u)
        return grad_z.view(grad_alpha.shape), grad_u.view(grad_alpha.shape)


def _csparsemax_backward(grad: torch.Tensor, active: torch.Tensor, capped: torch.Tensor, n_active: torch.Tensor):
    """Eq. 7-8 on [rows, keys]: dz_j = 1[j in A](dalpha_j - m), du_j = 1[j in A_R](dalpha_j - m), m = mean of dalpha
    over A (m = 0 if A is empty)."""
    grad_active = grad * active
    m = row_sum(grad_active) / n_active.clamp(min=1)
    grad_z = grad_active.addcmul_(active, m, value=-1)
    grad_u = torch.sub(grad, m).mul_(capped)
    return grad_z, grad_u


class ConstrainedSparsemaxFunction(torch.autograd.Function):
    """Constrained sparsemax over the last dim (Eq. 6, Proposition 1): alpha_j = max(0, min(u_j, z_j - tau)).

    Inputs: scores with -inf on masked keys, bounds, whether to use the compiled solver. Forward: Newton's method over the partitions from tau = max(z) - 1
    (`sparse_solvers._csparsemax_pass`; as fixed passes compiled by torch.compile,
    `sparse_solvers._csparsemax_fixed_passes`, if asked), or sorting (`sparse_solvers._csparsemax_sort`); infeasible
    rows (sum u < 1): alpha = u.
    Backward (Eq. 7-8): `_csparsemax_backward`.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, u: torch.Tensor, compiled: bool) -> torch.Tensor:
        alpha, active, capped, n_active, ctx.nonfinite = solve_csparsemax(as_rows(z), clamped_bounds(u, z), compiled)
        ctx.save_for_backward(active, capped, n_active)
        ctx.compiled = compiled
        return alpha.view(z.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        backward = torch_compiled(_csparsemax_backward) if ctx.compiled else _csparsemax_backward
        grad_z, grad_u = backward(as_rows(grad_alpha), *ctx.saved_tensors)
        fill_nonfinite(ctx.nonfinite, grad_z, grad_u)
        return grad_z.view(grad_alpha.shape), grad_u.view(grad_alpha.shape), None


def _entmax_backward(grad: torch.Tensor, skew: torch.Tensor) -> torch.Tensor:
    """The alpha-entmax Jacobian (Peters et al., 2019, Prop. 2) applied to grad, on [rows, keys]: with
    g_j = p_j^(2 - alpha) on the support (0 elsewhere), dz = g (dalpha - sum_j g_j dalpha_j / sum_j g_j). `skew` holds
    g; rows where it is all zero (no allowed key) get 0."""
    weighted = grad * skew
    m = row_sum(weighted) / row_sum(skew).clamp(min=torch.finfo(skew.dtype).tiny)
    return weighted.addcmul_(skew, m, value=-1)


class Entmax15Function(torch.autograd.Function):
    """1.5-entmax over the last dim: alpha_j = [z_j / 2 - tau]_+^2 with sum_j alpha_j = 1 (Peters et al., 2019).

    Input: scores with -inf on masked keys. Forward: the sort-based threshold (`sparse_solvers.solve_entmax15`).
    Backward (`_entmax_backward` with g = alpha^(1/2)): dz = sqrt(alpha) (dalpha - m),
    m = sum_j sqrt(alpha_j) dalpha_j / sum_j sqrt(alpha_j).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        zs = as_rows(z)
        nonfinite = nonfinite_rows(zs.amax(dim=-1, keepdim=True))  # junk for the solver, NaN below
        alpha, root = solve_entmax15(zs)
        ctx.nonfinite = fill_nonfinite(nonfinite, alpha)
        ctx.save_for_backward(root)
        return alpha.view(z.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        (root,) = ctx.saved_tensors
        grad_z = _entmax_backward(as_rows(grad_alpha), root)
        fill_nonfinite(ctx.nonfinite, grad_z)
        return grad_z.view(grad_alpha.shape)


class EntmaxBisectFunction(torch.autograd.Function):
    """alpha-entmax over the last dim, alpha in (1, 2] per row: p_j = [(alpha - 1) z_j - tau]_+^(1 / (alpha - 1)) with
    sum_j p_j = 1 (Peters et al., 2019, Eq. 10; alpha = 2 is sparsemax, alpha -> 1 softmax).

    Inputs: scores [rows, keys] with -inf on masked keys, alpha [rows, 1]. Forward: bisection on tau
    (`sparse_solvers.solve_entmax_bisect`); a row whose alpha is outside (1, 2] (or NaN) is NaN, like a NaN score.
    Backward, with g_j = p_j^(2 - alpha) on the support (0 elsewhere): dz by `_entmax_backward`; for alpha
    (Correia et al., 2019, Prop. 1), from p_j^(alpha - 1) = (alpha - 1) z_j - tau differentiated with sum_j dp_j = 0:
    dp_j / dalpha = (p_j - g~_j) / (alpha - 1)^2 - (p_j log p_j - g~_j sum_i p_i log p_i) / (alpha - 1),
    g~ = g / sum_i g_i, and dalpha = sum_j dalpha_j dp_j / dalpha.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
        zs, alphas = as_rows(z), alpha.reshape(-1, 1)
        usable = (alphas > 1) & (alphas <= 2)  # False for NaN
        nonfinite = nonfinite_rows(zs.amax(dim=-1, keepdim=True)) | ~usable  # junk for the solver, NaN below
        alphas = torch.where(usable, alphas, 1.5)
        p = solve_entmax_bisect(zs, alphas)
        ctx.nonfinite = fill_nonfinite(nonfinite, p)
        ctx.save_for_backward(p, alphas)
        ctx.alpha_shape = alpha.shape
        return p.view(z.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_p: torch.Tensor):
        p, alphas = ctx.saved_tensors
        grad = as_rows(grad_p)
        support = p > 0
        skew = torch.where(support, p.pow(2 - alphas), 0.0)  # g_j = p_j^(2 - alpha)
        grad_alpha = None
        if ctx.needs_input_grad[1]:
            beta = alphas - 1
            skew_normalised = skew / row_sum(skew).clamp(min=torch.finfo(skew.dtype).tiny)  # g~
            shannon = torch.where(support, p * torch.log(torch.where(support, p, 1.0)), 0.0)  # p_j log p_j
            dp_dalpha = ((p - skew_normalised) / (beta * beta)
                         - (shannon - skew_normalised * row_sum(shannon)) / beta)
            grad_alpha = row_sum(grad * dp_dalpha)
            fill_nonfinite(ctx.nonfinite, grad_alpha)
            grad_alpha = grad_alpha.view(ctx.alpha_shape)
        grad_z = _entmax_backward(grad, skew)
        fill_nonfinite(ctx.nonfinite, grad_z)
        return grad_z.view(grad_p.shape), grad_alpha


# ----------------------------------------------------------------------------------------------------------
# Public functions.


def _prepare(z: torch.Tensor, u, dim: int, mask):
    """Broadcast, promote to the compute dtype and move `dim` last. Returns (z, u, dim): z contiguous with -inf on
    masked keys, u as given (broadcast). (Nothing here reads a value: the kernels run without host syncs off the
    CPU, see `sparse_solvers`.)"""
    if not torch.is_tensor(z) or not z.is_floating_point():
        raise TypeError(f"z must be a floating-point tensor, got {type(z).__name__} {getattr(z, 'dtype', '')}")
    if u is not None and not torch.is_tensor(u):
        if not isinstance(u, (int, float)) or isinstance(u, bool):
            raise TypeError(f"u (the upper bounds) must be a tensor or a number, got {type(u).__name__} {u!r}")
        u = torch.as_tensor(u, dtype=z.dtype, device=z.device)
    if u is not None and not u.is_floating_point():
        u = u.to(z.dtype)
    if mask is not None and (not torch.is_tensor(mask) or mask.dtype != torch.bool):
        raise TypeError("mask must be a bool tensor (True = may attend)")
    dtypes = [z.dtype] + ([u.dtype] if u is not None else [])
    compute_dtype = torch.float64 if torch.float64 in dtypes else torch.float32
    named_shapes = {"z": z.shape, "u": u.shape if u is not None else None, "mask": mask.shape if mask is not None else None}
    try:
        shape = torch.broadcast_shapes(*(shape for shape in named_shapes.values() if shape is not None))
    except RuntimeError:
        given = ", ".join(f"{name} {tuple(shape)}" for name, shape in named_shapes.items() if shape is not None)
        raise ValueError(f"z, u and mask must broadcast to one shape; got {given}") from None
    if len(shape) == 0:
        raise ValueError("z must have at least one dimension")
    if isinstance(dim, bool) or not isinstance(dim, int) or not -len(shape) <= dim < len(shape):
        raise IndexError(f"dim {dim!r} is out of range for {len(shape)}-D scores; accepted: {-len(shape)} to "
                         f"{len(shape) - 1}")
    dim = dim % len(shape)
    z = _last(z.to(compute_dtype).expand(shape), dim)
    if u is not None:
        u = _last(u.to(compute_dtype).expand(shape), dim)
    if mask is not None:
        z = z.masked_fill(_last((~mask).expand(shape), dim), float("-inf"))  # whatever the score, even NaN
    return z.contiguous(), u, dim


def _last(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Move `dim` to the end (no-op when it already is there)."""
    return x if dim == x.dim() - 1 else x.movedim(dim, -1)


def _back(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x if dim == x.dim() - 1 else x.movedim(-1, dim)


def sparsemax(
    z: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None, *, backend: str = "auto"
) -> torch.Tensor:
    """sparsemax(z) = argmin_{alpha in simplex} ||alpha - z||^2 along `dim` (Eq. 3; Martins & Astudillo, 2016).

    Exact (Michelot's algorithm, sorting for rows it leaves; see `SparsemaxFunction`); gradient
    dz = 1[alpha > 0](dalpha - mean over the support). `mask` (bool, broadcastable, True = allowed) and -inf
    scores exclude keys: they get 0 attention and 0 gradient; an all-masked row is all zeros. Half precision is
    computed in float32. Returns z's dtype. `backend` picks the kernel (`kernel_backend`): these solvers, or
    Triton's `triton_kernels.sparsemax_rows`.
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    zc, _, dim = _prepare(z, None, dim, mask)
    if zc.shape[-1] == 0:
        return _back(zc * 0, dim).to(out_dtype)
    if torch.compiler.is_exporting():
        return _back(solve_for_export("sparsemax", zc, None), dim).to(out_dtype)
    if kernel_backend(zc, backend, keys=zc.shape[-1]) == "triton":
        from .triton_kernels import sparsemax_rows  # imports triton: only where a kernel runs

        return _back(sparsemax_rows(zc), dim).to(out_dtype)
    return _back(SparsemaxFunction.apply(zc), dim).to(out_dtype)


def csoftmax(z: torch.Tensor, u, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Constrained softmax along `dim` (Eq. 4; Martins & Kreutzer, 2017):
    argmin_{alpha in simplex} KL(alpha || softmax(z)) s.t. alpha <= u, i.e. alpha_j = min(u_j, exp(z_j) / Z).

    Exact (capping iteration, sorting for rows it leaves; see `ConstrainedSoftmaxFunction`). `u` (broadcastable
    to z, >= 0, may be +inf; all +inf gives softmax) bounds each key's attention, e.g. u_t = fertility -
    cumulative attention (Eq. 5). Infeasible rows, where the bounds of the allowed keys sum to less than 1, return
    alpha = u on the allowed keys (every key capped; the row sums to sum(u) < 1) with gradients dz = 0,
    du = dalpha. `mask` (bool, True = allowed) and -inf scores exclude keys: 0 attention, 0 gradient for z and
    u; an all-masked row is all zeros. Half precision is computed in float32. Returns z's dtype.
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    if u is None:
        raise TypeError("u (the upper bounds, e.g. fertility - cumulative attention) is required; u = inf everywhere "
                        "gives the unconstrained transform")
    zc, uc, dim = _prepare(z, u, dim, mask)
    if zc.shape[-1] == 0:
        return _back(zc * 0 + uc * 0, dim).to(out_dtype)
    if torch.compiler.is_exporting():
        return _back(solve_for_export("csoftmax", zc, uc), dim).to(out_dtype)
    return _back(ConstrainedSoftmaxFunction.apply(zc, uc), dim).to(out_dtype)


def csparsemax(
    z: torch.Tensor, u, dim: int = -1, mask: torch.Tensor | None = None, *, compiled: bool = False
) -> torch.Tensor:
    """Constrained sparsemax along `dim` (Eq. 6; Malaviya et al., 2018):
    argmin_{alpha in simplex} ||alpha - z||^2 s.t. alpha <= u, i.e. alpha_j = max(0, min(u_j, z_j - tau)).

    Exact (safeguarded Newton's method over the partitions, sorting for rows it leaves; see
    `ConstrainedSparsemaxFunction`); gradients of Eq. 7-8. `u` (broadcastable to z, >= 0, may be +inf; all +inf
    gives sparsemax) bounds each key's attention, e.g. u_t = fertility - cumulative attention (Eq. 5).
    Infeasible rows, where the bounds of the allowed keys sum to less than 1, return alpha = u on the allowed
    keys (every key capped; the row sums to sum(u) < 1) with gradients dz = 0, du = dalpha. `mask` (bool,
    True = allowed) and -inf scores exclude keys: 0 attention, 0 gradient for z and u; an all-masked row is all
    zeros. Half precision is computed in float32. Returns z's dtype.

    `compiled=True` runs the Newton passes as a fixed number of branch-free passes over every row, compiled by
    `torch.compile` into fused loops (rows that have not settled go on with the eager solvers, so the result is
    the same exact solution): about 2x faster on large CPU inputs, e.g. [1024, 512]. The first call compiles
    (seconds; on CPU it needs a C++ compiler), later calls of any shape reuse it. Inputs below
    `sparse_solvers._SORT_BELOW` entries, and off the CPU every input, are sorted either way (the backward is
    compiled all the same).
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    if u is None:
        raise TypeError("u (the upper bounds, e.g. fertility - cumulative attention) is required; u = inf everywhere "
                        "gives the unconstrained transform")
    zc, uc, dim = _prepare(z, u, dim, mask)
    if zc.shape[-1] == 0:
        return _back(zc * 0 + uc * 0, dim).to(out_dtype)
    if torch.compiler.is_exporting():
        return _back(solve_for_export("csparsemax", zc, uc), dim).to(out_dtype)
    return _back(ConstrainedSparsemaxFunction.apply(zc, uc, compiled), dim).to(out_dtype)



def entmax15(z: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """1.5-entmax along `dim` (Peters, Niculae & Martins, 2019): argmax_{alpha in simplex} <alpha, z> + H_1.5(alpha)
    with the Tsallis entropy H_1.5, i.e. alpha_j = [z_j / 2 - tau]_+^2. Between softmax and sparsemax: exactly zero
    weight on low-scoring keys, but a smoother, wider support than sparsemax's.

    Exact (sorting, the threshold in closed form; see `Entmax15Function`); gradient dz = sqrt(alpha)(dalpha - m),
    m = sum sqrt(alpha) dalpha / sum sqrt(alpha). `mask` (bool, broadcastable, True = allowed) and -inf scores exclude
    keys: they get 0 attention and 0 gradient; an all-masked row is all zeros. Half precision is computed in float32.
    Returns z's dtype.
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    zc, _, dim = _prepare(z, None, dim, mask)
    if zc.shape[-1] == 0:
        return _back(zc * 0, dim).to(out_dtype)
    if torch.compiler.is_exporting():  # the solver is branch-free; autograd differentiates the sort if asked
        return _back(_entmax15_for_export(zc), dim).to(out_dtype)
    return _back(Entmax15Function.apply(zc), dim).to(out_dtype)


def _entmax15_for_export(zc: torch.Tensor) -> torch.Tensor:
    nonfinite = nonfinite_rows(zc.amax(dim=-1, keepdim=True))
    return solve_entmax15(zc)[0].masked_fill(nonfinite, float("nan"))


def entmax_bisect(z: torch.Tensor, alpha, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """alpha-entmax along `dim` (Peters, Niculae & Martins, 2019, Eq. 10): argmax_{p in simplex} <p, z> + H_alpha(p)
    with the Tsallis entropy H_alpha, i.e. p_j = [(alpha - 1) z_j - tau]_+^(1 / (alpha - 1)); alpha = 2 is sparsemax,
    alpha = 1.5 is `entmax15`, and alpha -> 1 tends to softmax.

    `alpha`: a number in (1, 2], or a tensor broadcastable to z's shape with size 1 along `dim` (one alpha per row,
    e.g. [heads, 1, 1] for a learned alpha per head, Correia, Niculae & Martins, 2019), differentiable: the gradient
    reaches alpha too (`EntmaxBisectFunction`). A tensor's values are not read (no host synchronisation off the CPU):
    a row whose alpha is outside (1, 2] or NaN comes out NaN, output and gradients, as a row with a NaN score does.
    The same fixed number of bisection steps for every input (`sparse_solvers.bisection_steps`: the dtype's mantissa
    bits and two) give tau to rounding. `mask` (bool, broadcastable, True = allowed) and -inf
    scores exclude keys: 0 attention, 0 gradient; an all-masked row is all zeros with zero gradient (alpha's
    included). Half precision is computed in float32. Returns z's dtype; alpha's gradient has alpha's dtype.
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    if not torch.is_tensor(alpha):
        if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not 1 < alpha <= 2:
            raise ValueError(f"alpha must be a number in (1, 2] or a tensor, got {type(alpha).__name__} {alpha!r} "
                             "(alpha = 2 is sparsemax; for alpha = 1, softmax, use torch.softmax)")
        wide = torch.is_tensor(z) and z.dtype == torch.float64
        # a fill, not torch.tensor: off the CPU that would copy the number from host memory, a synchronisation
        alpha = torch.full((), float(alpha), dtype=torch.float64 if wide else torch.float32,
                           device=z.device if torch.is_tensor(z) else None)
    elif not alpha.is_floating_point():
        raise TypeError(f"alpha must be a floating-point tensor (or a number), got {alpha.dtype}")
    if torch.is_tensor(z) and alpha.dim() > 0:
        shape = _broadcast_shape(z, mask)
        reduced = [*shape[: dim % len(shape)], 1, *shape[dim % len(shape) + 1:]] if _valid_dim(dim, shape) else None
        if reduced is not None and (alpha.dim() > len(shape) or _broadcasts(alpha.shape, reduced) != reduced):
            raise ValueError(f"alpha {tuple(alpha.shape)} must broadcast to the scores' shape {tuple(shape)} with size "
                             f"1 along dim {dim} (one alpha per row), e.g. {tuple(reduced)}")
    zc, alpha_keys, dim = _prepare(z, alpha, dim, mask)
    alpha_rows = alpha_keys[..., :1]  # alpha is constant along the keys (checked above)
    if zc.shape[-1] == 0:
        return _back(zc * 0 + alpha_rows * 0, dim).to(out_dtype)
    if torch.compiler.is_exporting():  # the solver is branch-free; autograd differentiates the bisection if asked
        return _back(_entmax_bisect_for_export(zc, alpha_rows), dim).to(out_dtype)
    return _back(EntmaxBisectFunction.apply(zc, alpha_rows.contiguous()), dim).to(out_dtype)


def _entmax_bisect_for_export(zc: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    usable = (alpha > 1) & (alpha <= 2)
    nonfinite = nonfinite_rows(zc.amax(dim=-1, keepdim=True)) | ~usable
    return solve_entmax_bisect(zc, torch.where(usable, alpha, 1.5)).masked_fill(nonfinite, float("nan"))


def _broadcast_shape(z: torch.Tensor, mask) -> torch.Size:
    """The shape z and mask broadcast to (z's own when they do not: `_prepare` then refuses them)."""
    try:
        return torch.broadcast_shapes(z.shape, mask.shape) if torch.is_tensor(mask) else z.shape
    except RuntimeError:
        return z.shape


def _valid_dim(dim, shape) -> bool:
    return len(shape) > 0 and not isinstance(dim, bool) and isinstance(dim, int) and -len(shape) <= dim < len(shape)


def _broadcasts(shape, target):
    """The broadcast of shape and target as a list, or None if they do not broadcast."""
    try:
        return list(torch.broadcast_shapes(shape, torch.Size(target)))
    except RuntimeError:
        return None
