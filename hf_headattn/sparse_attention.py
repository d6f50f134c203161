"""Sparse and constrained attention transformations (Malaviya, Ferreira & Martins, 2018, Sec. 3).

Three drop-in replacements for ``softmax`` over the keys, each mapping scores ``z`` (and, for the constrained
ones, upper bounds ``u``) to a probability distribution ``alpha``:

* ``sparsemax(z)`` (Eq. 3; Martins & Astudillo, 2016): the Euclidean projection of ``z`` onto the probability
  simplex, ``alpha_j = max(0, z_j - tau)``. Exactly zero on low-scoring keys.
* ``csoftmax(z, u)`` (Eq. 4; Martins & Kreutzer, 2017): the distribution closest in KL to ``softmax(z)`` with
  ``alpha <= u``, ``alpha_j = min(u_j, exp(z_j) / Z)``. Strictly positive (where ``u > 0``), never above the
  bound: used with ``u_t = f - beta_{t-1}`` (Eq. 5, fertility minus cumulative attention) it is sparse over
  decoding steps.
* ``csparsemax(z, u)`` (Eq. 6; the paper's proposal): the Euclidean projection onto the simplex intersected
  with the box ``0 <= alpha <= u``, ``alpha_j = max(0, min(u_j, z_j - tau))`` (Proposition 1, as corrected in
  the project's paper notes). Sparse over keys and over decoding steps.

Every forward pass is exact (no iteration to a tolerance) and vectorised over all leading dimensions: the
threshold (``tau`` or the normaliser ``Z``) is found by sorting the breakpoints of a monotone piecewise
function along ``dim`` and locating the segment that holds the solution, then solved in closed form on that
segment. Every backward pass is written out (no autograd through a sort or an iteration).

Shared conventions:

* ``mask`` is a bool tensor broadcastable to ``z`` (True = the key may be attended); keys whose score is
  ``-inf`` are masked too. Masked keys get exactly 0 attention and 0 gradient (for ``z`` and ``u``); a row
  with every key masked is all zeros with zero gradient, never NaN. Pass padding through ``mask`` or
  ``-inf``: a large finite negative score (e.g. ``finfo.min``) is an ordinary key, which ``csoftmax`` or
  ``csparsemax`` may have to give attention to when the other keys' bounds are exhausted.
* ``u`` is broadcastable to ``z``; the gradient is reduced back to ``u``'s shape. ``u`` must be ``>= 0`` and
  not NaN; ``u = +inf`` means unbounded (e.g. the ``<SINK>`` token). Bounds ``>= 1`` never bind (no
  probability exceeds 1). Negative bounds (which only arise from rounding in ``f - beta``) are treated as 0
  and get the gradient of a zero bound.
* Infeasible rows: if the bounds of a row's allowed keys sum to less than 1, no distribution satisfies them.
  Then ``alpha = u`` on the allowed keys (every key capped at its bound, so the row sums to ``sum(u) < 1``),
  which is the limit of the solution as ``sum(u)`` decreases to 1; the gradients are those of that map:
  ``dz = 0`` and ``du = dalpha`` on the allowed keys. Add a sink key with ``u = inf`` to rule this out.
* float16/bfloat16 inputs are computed in float32, float64 inputs in float64; the result has ``z``'s dtype.
* ``z`` must not contain NaN or ``+inf``. Scores are shifted by the row maximum, and results are exact up to
  rounding of quantities of the size of ``z - max(z)``: float32 errors grow like ``|z| * 1e-7`` (about
  ``1e-6`` for scores of size 5). ``csparsemax`` needs ``|z - max(z)|`` small enough that ``z - u`` differs
  from ``z`` in floating point, another reason to mask padding rather than give it a ``finfo.min`` score.

Degenerate points (ties at a breakpoint, bounds that sum to exactly 1) are handled exactly in the forward
pass. Where the map is not differentiable, the backward pass returns the one-sided derivative of the piece
on which the breakpoint search lands (for ``csparsemax`` the segment of tau values just above the solution),
whose key sets are fixed by the search rather than by comparing rounded values, and which for a feasible row
always has a key strictly inside its bounds. E.g. one-hot attention under unit bounds (alpha_j = u_j = 1) gets
the ``sparsemax`` gradient and no gradient to ``u``.

Cost: one sort along ``dim`` (of n values for ``sparsemax`` and ``csoftmax``, 2n for ``csparsemax``) plus
O(n) elementwise work per row, all as batched tensor operations.
"""

import torch
from torch.autograd.function import once_differentiable


__all__ = ["csoftmax", "csparsemax", "sparsemax"]

# Bounds above 1 never bind (every probability is <= 1); capping them at 2 keeps every quantity finite
# (u = +inf for a sink key) without changing the solution or which rows are feasible.
_NON_BINDING_BOUND = 2.0

# Implementation note: masks are applied by multiplying with a 0/1 tensor of the compute dtype rather than
# with torch.where, which is several times slower on CPU; every masked quantity is made finite first.


def _shifted_scores(z: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """z - max over the allowed keys of the row (shift invariance of all three maps), 0 on masked keys."""
    finite_z = torch.nan_to_num(z, neginf=0.0)
    z_max = (finite_z + torch.log(keep)).amax(dim=-1, keepdim=True)  # log(0) = -inf drops masked keys
    z_max = torch.nan_to_num(z_max, neginf=0.0)  # rows with no allowed key
    return (finite_z - z_max) * keep


class SparsemaxFunction(torch.autograd.Function):
    """sparsemax over the last dim (Martins & Astudillo, 2016, Alg. 1: sort-based threshold).

    Input: scores with -inf on masked keys. Forward: sort the scores in decreasing order; the support size is
    the largest k with 1 + k z_(k) > sum_{i<=k} z_(i), and tau = (sum_{i<=k} z_(i) - 1) / k. O(n log n).
    Backward: dz = 1[alpha > 0] (dalpha - mean of dalpha over the support).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor) -> torch.Tensor:
        n = z.shape[-1]
        z_max = torch.nan_to_num(z.amax(dim=-1, keepdim=True), neginf=0.0)  # 0 for a row with no allowed key
        zs = z - z_max  # masked keys stay -inf and sort last
        z_sorted, _ = torch.sort(zs, dim=-1, descending=True)
        k = torch.arange(1, n + 1, dtype=z.dtype, device=z.device)
        z_cumsum = z_sorted.cumsum(dim=-1)  # -inf from the first masked key on: never in the support
        in_support = 1 + k * z_sorted > z_cumsum  # Eq. 3 solved by Martins & Astudillo (2016), Alg. 1
        support_size = in_support.sum(dim=-1, keepdim=True)
        tau = (z_cumsum.gather(-1, (support_size - 1).clamp(min=0)) - 1) / support_size.clamp(min=1)  # Eq. 3: sum = 1
        tau = torch.nan_to_num(tau, neginf=0.0)  # rows with no allowed key
        alpha = (zs - tau).clamp(min=0)  # Eq. 3: alpha_j = max(0, z_j - tau)
        ctx.save_for_backward(alpha, support_size)
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        alpha, support_size = ctx.saved_tensors
        support = (alpha > 0).to(alpha.dtype)
        m = (grad_alpha * support).sum(dim=-1, keepdim=True) / support_size.clamp(min=1)  # mean over the support
        return support * (grad_alpha - m)  # Eq. 7 with no upper bounds: dz_j = 1[alpha_j > 0](dalpha_j - m)


class ConstrainedSoftmaxFunction(torch.autograd.Function):
    """Constrained softmax over the last dim (Eq. 4; Martins & Kreutzer, 2017).

    Input: scores, bounds and a 0/1 tensor of allowed keys. Forward (sort-based, exact): the solution is
    alpha_j = min(u_j, g exp(z_j)) for the g > 0 with F(g) = sum_j min(u_j, g exp(z_j)) = 1. F is increasing
    and piecewise linear in g with breakpoints at the ratios rho_j = u_j / exp(z_j); key j is capped iff
    rho_j < g. Sort the ratios (in log space) ascending, evaluate F at every breakpoint with a cumulative sum
    of the bounds and a reverse cumulative sum of exp(z), take the first breakpoint with F >= 1: the keys
    before it are the capped set R, and g = (1 - sum_{R} u) / sum_{not R} exp(z). This yields the set that
    the iterative capping of Martins & Kreutzer (2017) converges to, in O(n log n) without a loop.
    Infeasible rows (sum u < 1): alpha = u.
    Backward (A = allowed keys below their bound, R = capped keys):
    dz_j = 1[j in A] alpha_j (dalpha_j - m), du_j = 1[j in R] (dalpha_j - m),
    m = sum_{A} alpha_i dalpha_i / sum_{A} alpha_i  (sum_{A} alpha_i = 1 - sum_{R} u_i); m = 0 if A is empty.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, u: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        n = z.shape[-1]
        zs = _shifted_scores(z, keep)
        us = u.clamp(min=0, max=_NON_BINDING_BOUND) * keep  # masked keys: bound 0, so always "capped" at 0
        log_ratio = torch.log(us) - zs  # log rho_j = log(u_j / exp(z_j)); -inf for zero bounds and masked keys
        ratio_sorted, order = torch.sort(log_ratio, dim=-1)
        u_cumsum = us.gather(-1, order).cumsum(dim=-1)
        z_sorted = zs.gather(-1, order)
        # log sum_{i > k} exp(z_(i)): in the linear domain (no cancellation: a reverse cumulative sum) unless
        # some allowed key's exp(z - max) would underflow, then with logcumsumexp.
        if bool((zs >= (-80.0 if z.dtype != torch.float64 else -700.0)).all()):
            e_sorted = torch.exp(z_sorted) * keep.gather(-1, order)
            log_tail = torch.log(e_sorted.flip(-1).cumsum(dim=-1).flip(-1))
        else:
            z_sorted = z_sorted + torch.log(keep.gather(-1, order))
            log_tail = torch.logcumsumexp(z_sorted.flip(-1), dim=-1).flip(-1)
        log_tail = torch.nn.functional.pad(log_tail[..., 1:], (0, 1), value=float("-inf"))
        f_at_breakpoint = u_cumsum + torch.exp(ratio_sorted + log_tail)  # Eq. 4 KKT: F(rho) = sum_j min(u_j, rho e^z_j)
        # First breakpoint with F >= 1 (n: none, infeasible). F is non-decreasing; where rounding makes it wobble,
        # it does so within rounding of 1 at breakpoints rho_j ~ g, where capping key j or not is the same.
        k = (f_at_breakpoint < 1).sum(dim=-1, keepdim=True)
        feasible = k < n
        k = k.clamp(max=n - 1)
        threshold = ratio_sorted.gather(-1, k)  # log g lies in [log rho_(k-1), log rho_(k)]
        capped = ((log_ratio < threshold) | ~feasible).to(z.dtype) * keep  # Eq. 4 KKT: R = {j : rho_j < g}
        free = keep - capped
        free_mass = (1 - (us * capped).sum(dim=-1, keepdim=True)).clamp(min=0)  # Eq. 4: 1 - sum_{R} u left for A
        log_free_norm = torch.nan_to_num(torch.logsumexp(zs + torch.log(free), dim=-1, keepdim=True), neginf=0.0)
        softmax_free = torch.exp((zs - log_free_norm) * free)  # meaningful (and kept finite) only on free keys
        alpha_free = torch.minimum(free_mass * softmax_free, us)  # Eq. 4 KKT: alpha_j = g exp(z_j) below the bound
        alpha = capped * us + free * alpha_free  # Eq. 4 KKT: alpha_j = u_j on R
        ctx.save_for_backward(alpha, capped)
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        alpha, capped = ctx.saved_tensors
        alpha_free = alpha * (1 - capped)  # alpha on A (masked keys hold 0)
        free_mass = alpha_free.sum(dim=-1, keepdim=True)  # = 1 - sum_{R} u
        weighted = (alpha_free * grad_alpha).sum(dim=-1, keepdim=True)
        m = weighted / free_mass.clamp(min=torch.finfo(alpha.dtype).tiny)  # Martins & Kreutzer (2017); 0 if A is empty
        grad_z = alpha_free * (grad_alpha - m)  # dz_j = 1[j in A] alpha_j (dalpha_j - m)
        grad_u = capped * (grad_alpha - m)  # du_j = 1[j in R] (dalpha_j - m)
        return grad_z, grad_u, None


class ConstrainedSparsemaxFunction(torch.autograd.Function):
    """Constrained sparsemax over the last dim (Eq. 6, Proposition 1; Malaviya et al., 2018).

    Input: scores, bounds and a 0/1 tensor of allowed keys. Forward (sort-based, exact; the breakpoint search
    of Pardalos & Kovoor, 1990, with a sort in place of median selection): f(tau) = sum_j clip(z_j - tau, 0,
    u_j) is non-increasing and piecewise linear in tau with breakpoints z_j (key j leaves zero) and z_j - u_j
    (key j reaches its bound). Sort the 2n breakpoints in decreasing order and evaluate f at each as a
    cumulative sum of (number of keys strictly inside their box on the segment above) x (segment length), a
    sum of non-negative terms, so no cancellation. The first breakpoint with f >= 1 closes the segment that
    holds tau; on it the sets A (0 < alpha < u) and A_R (alpha = u) are fixed and
    tau = (sum_{A} z + sum_{A_R} u - 1) / |A|. O(n log n). Infeasible rows (sum u < 1): alpha = u.
    Backward (Eq. 7-8): dz_j = 1[j in A](dalpha_j - m), du_j = 1[j in A_R](dalpha_j - m),
    m = mean of dalpha over A (m = 0 if A is empty).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, u: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        n = z.shape[-1]
        # Masked keys become a zero-width box [0, 0] at score 0: they contribute 0 for every tau.
        zs = _shifted_scores(z, keep)
        us = u.clamp(min=0, max=_NON_BINDING_BOUND) * keep
        z_minus_u = zs - us
        breakpoints, order = torch.sort(torch.cat([zs, z_minus_u], dim=-1), dim=-1, descending=True)
        entering = (order < n).to(z.dtype) * 2 - 1  # +1 at z_j (key j enters), -1 at z_j - u_j (capped)
        inside_before = torch.nn.functional.pad(entering.cumsum(dim=-1)[..., :-1], (1, 0))
        gap = torch.nn.functional.pad(breakpoints[..., :-1] - breakpoints[..., 1:], (1, 0))
        # (inside_before is -1 only between tied breakpoints of a zero-width box, where the gap is 0.)
        f_at_breakpoint = (inside_before.clamp(min=0) * gap).cumsum(dim=-1)  # Eq. 6: f(e) = sum_j clip(z_j - e, 0, u_j)
        k = (f_at_breakpoint < 1).sum(dim=-1, keepdim=True)  # first e_k with f >= 1 (f is non-decreasing); 2n: none
        feasible = k < 2 * n
        k = k.clamp(min=1, max=2 * n - 1)
        lo = breakpoints.gather(-1, k)  # tau lies in [lo, hi]; no breakpoint strictly inside
        hi = breakpoints.gather(-1, k - 1)
        capped = ((z_minus_u >= hi) | ~feasible).to(z.dtype) * keep  # A_R: alpha_j = u_j on the whole segment
        active = ((z_minus_u <= lo) & (zs >= hi) & feasible).to(z.dtype) * keep  # A: 0 < alpha_j < u_j there
        n_active = active.sum(dim=-1, keepdim=True)
        excess = (zs * active).sum(dim=-1, keepdim=True) + (us * capped).sum(dim=-1, keepdim=True) - 1
        tau = excess / n_active.clamp(min=1)  # Prop. 1: sum_{A} (z_j - tau) + sum_{A_R} u_j = 1 solved for tau
        tau = torch.maximum(torch.minimum(tau, hi), lo)
        alpha = active * torch.minimum(zs - tau, us) + capped * us  # Prop. 1: alpha_j = max(0, min(u_j, z_j - tau))
        ctx.save_for_backward(active, capped)
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        active, capped = ctx.saved_tensors
        n_active = active.sum(dim=-1, keepdim=True)
        m = (grad_alpha * active).sum(dim=-1, keepdim=True) / n_active.clamp(min=1)  # Eq. 7-8: mean of dalpha over A
        grad_z = active * (grad_alpha - m)  # Eq. 7: dz_j = 1(j in A)(dalpha_j - m)
        grad_u = capped * (grad_alpha - m)  # Eq. 8: du_j = 1(j in A_R)(dalpha_j - m)
        return grad_z, grad_u, None


def _prepare(z: torch.Tensor, u, dim: int, mask):
    """Broadcast, promote to the compute dtype and move `dim` last. Returns (z, u, allowed, dim), allowed being
    the bool tensor of keys that may be attended (mask and not -inf; None for sparsemax without a mask)."""
    if not torch.is_tensor(z) or not z.is_floating_point():
        raise TypeError(f"z must be a floating-point tensor, got {type(z).__name__} {getattr(z, 'dtype', '')}")
    if u is not None and not torch.is_tensor(u):
        u = torch.as_tensor(u, dtype=z.dtype, device=z.device)
    if u is not None and not u.is_floating_point():
        u = u.to(z.dtype)
    if mask is not None and (not torch.is_tensor(mask) or mask.dtype != torch.bool):
        raise TypeError("mask must be a bool tensor (True = may attend)")
    dtypes = [z.dtype] + ([u.dtype] if u is not None else [])
    compute_dtype = torch.float64 if torch.float64 in dtypes else torch.float32
    shapes = [z.shape] + ([u.shape] if u is not None else []) + ([mask.shape] if mask is not None else [])
    shape = torch.broadcast_shapes(*shapes)
    if len(shape) == 0:
        raise ValueError("z must have at least one dimension")
    dim = dim % len(shape)
    z = _last(z.to(compute_dtype).expand(shape), dim)
    if u is not None:
        u = _last(u.to(compute_dtype).expand(shape), dim)
    if u is None and mask is None:  # sparsemax handles -inf scores itself
        return z, u, None, dim
    allowed = z != float("-inf")
    if mask is not None:
        allowed = allowed & _last(mask.expand(shape), dim)
    return z, u, allowed, dim


def _last(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Move `dim` to the end (no-op when it already is there)."""
    return x if dim == x.dim() - 1 else x.movedim(dim, -1)


def _back(x: torch.Tensor, dim: int) -> torch.Tensor:
    return x if dim == x.dim() - 1 else x.movedim(-1, dim)


def sparsemax(z: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """sparsemax(z) = argmin_{alpha in simplex} ||alpha - z||^2 along `dim` (Eq. 3; Martins & Astudillo, 2016).

    Exact sort-based threshold (see `SparsemaxFunction`); gradient dz = 1[alpha > 0](dalpha - mean over the
    support). `mask` (bool, broadcastable, True = allowed) and -inf scores exclude keys: they get 0 attention
    and 0 gradient; an all-masked row is all zeros. Half precision is computed in float32. Returns z's dtype.
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    zc, _, allowed, dim = _prepare(z, None, dim, mask)
    if zc.shape[-1] == 0:
        return _back(zc * 0, dim).to(out_dtype)
    if mask is not None:
        zc = zc + torch.log(allowed.to(zc.dtype))  # -inf on masked keys
    return _back(SparsemaxFunction.apply(zc), dim).to(out_dtype)


def csoftmax(z: torch.Tensor, u, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Constrained softmax along `dim` (Eq. 4; Martins & Kreutzer, 2017):
    argmin_{alpha in simplex} KL(alpha || softmax(z)) s.t. alpha <= u, i.e. alpha_j = min(u_j, exp(z_j) / Z).

    Exact sort-based solve (see `ConstrainedSoftmaxFunction`). `u` (broadcastable to z, >= 0, may be +inf;
    all +inf gives softmax) bounds each key's attention, e.g. u_t = fertility - cumulative attention (Eq. 5).
    Infeasible rows, where the bounds of the allowed keys sum to less than 1, return alpha = u on the allowed
    keys (every key capped; the row sums to sum(u) < 1) with gradients dz = 0, du = dalpha. `mask` (bool,
    True = allowed) and -inf scores exclude keys: 0 attention, 0 gradient for z and u; an all-masked row is
    all zeros. Half precision is computed in float32. Returns z's dtype.
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    zc, uc, allowed, dim = _prepare(z, u, dim, mask)
    if zc.shape[-1] == 0:
        return _back(zc * 0 + uc * 0, dim).to(out_dtype)
    return _back(ConstrainedSoftmaxFunction.apply(zc, uc, allowed.to(zc.dtype)), dim).to(out_dtype)


def csparsemax(z: torch.Tensor, u, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Constrained sparsemax along `dim` (Eq. 6; Malaviya et al., 2018):
    argmin_{alpha in simplex} ||alpha - z||^2 s.t. alpha <= u, i.e. alpha_j = max(0, min(u_j, z_j - tau)).

    Exact sort-based solve (see `ConstrainedSparsemaxFunction`); gradients of Eq. 7-8. `u` (broadcastable to
    z, >= 0, may be +inf; all +inf gives sparsemax) bounds each key's attention, e.g. u_t = fertility -
    cumulative attention (Eq. 5). Infeasible rows, where the bounds of the allowed keys sum to less than 1,
    return alpha = u on the allowed keys (every key capped; the row sums to sum(u) < 1) with gradients
    dz = 0, du = dalpha. `mask` (bool, True = allowed) and -inf scores exclude keys: 0 attention, 0 gradient
    for z and u; an all-masked row is all zeros. Half precision is computed in float32. Returns z's dtype.
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    zc, uc, allowed, dim = _prepare(z, u, dim, mask)
    if zc.shape[-1] == 0:
        return _back(zc * 0 + uc * 0, dim).to(out_dtype)
    return _back(ConstrainedSparsemaxFunction.apply(zc, uc, allowed.to(zc.dtype)), dim).to(out_dtype)
