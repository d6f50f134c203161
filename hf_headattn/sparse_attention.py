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
* ``z`` must not contain NaN or ``+inf``.

Degenerate points (ties at a breakpoint, bounds that sum to exactly 1) are handled exactly in the forward
pass. Where the map is not differentiable the backward pass returns the derivative on the segment just above
the threshold, which is always well defined for a feasible row (e.g. unit fertilities with one-hot attention
give the ``sparsemax`` gradient and no gradient to ``u``).
"""

import torch
from torch.autograd.function import once_differentiable


__all__ = ["csoftmax", "csparsemax", "sparsemax"]

# Bounds above 1 never bind (every probability is <= 1); capping them at 2 keeps every quantity finite
# (u = +inf for a sink key) without changing the solution or which rows are feasible.
_NON_BINDING_BOUND = 2.0


def _row_max(zs: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Max over the allowed keys of each row (0 for a row with none), for the usual shift-invariance trick."""
    z_max = torch.where(allowed, zs, float("-inf")).amax(dim=-1, keepdim=True)
    return torch.where(torch.isfinite(z_max), z_max, 0.0)


def _first_reaching_one(values: torch.Tensor) -> torch.Tensor:
    """Index of the first entry >= 1 along the last dim (its size where none is); robust to rounding that
    makes a mathematically monotone sequence wobble."""
    return ((values >= 1).cumsum(dim=-1) == 0).sum(dim=-1, keepdim=True)


class SparsemaxFunction(torch.autograd.Function):
    """sparsemax over the last dim (Martins & Astudillo, 2016, Alg. 1: sort-based threshold).

    Forward: sort the allowed scores in decreasing order; the support size is the largest k with
    1 + k z_(k) > sum_{i<=k} z_(i), and tau = (sum_{i<=k} z_(i) - 1) / k. O(n log n).
    Backward: dz = 1[alpha > 0] (dalpha - mean of dalpha over the support).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        n = z.shape[-1]
        zs = torch.where(allowed, z - _row_max(z, allowed), float("-inf"))
        z_sorted, _ = torch.sort(zs, dim=-1, descending=True)
        k = torch.arange(1, n + 1, dtype=z.dtype, device=z.device)
        valid = k <= allowed.sum(dim=-1, keepdim=True)  # sorted positions holding allowed keys
        z_sorted = torch.where(valid, z_sorted, 0.0)
        z_cumsum = z_sorted.cumsum(dim=-1)
        in_support = valid & (1 + k * z_sorted > z_cumsum)  # Eq. 3 solved as in Martins & Astudillo (2016), Alg. 1
        support_size = in_support.sum(dim=-1, keepdim=True)
        tau = (z_cumsum.gather(-1, (support_size - 1).clamp(min=0)) - 1) / support_size.clamp(min=1)  # Eq. 3: sum = 1
        alpha = torch.where(allowed, (zs - tau).clamp(min=0), 0.0)  # Eq. 3: alpha_j = max(0, z_j - tau)
        ctx.save_for_backward(alpha)
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        (alpha,) = ctx.saved_tensors
        support = alpha > 0
        g = torch.where(support, grad_alpha, 0.0)
        m = g.sum(dim=-1, keepdim=True) / support.sum(dim=-1, keepdim=True).clamp(min=1)  # mean over the support
        grad_z = torch.where(support, g - m, 0.0)  # Eq. 7 with no upper bounds: dz_j = 1[alpha_j > 0](dalpha_j - m)
        return grad_z, None


class ConstrainedSoftmaxFunction(torch.autograd.Function):
    """Constrained softmax over the last dim (Eq. 4; Martins & Kreutzer, 2017).

    Forward (sort-based, exact): the solution is alpha_j = min(u_j, g exp(z_j)) for the g > 0 with
    F(g) = sum_j min(u_j, g exp(z_j)) = 1. F is increasing and piecewise linear in g with breakpoints at the
    ratios rho_j = u_j / exp(z_j); key j is capped iff rho_j < g. Sort the ratios (in log space) ascending,
    evaluate F at every breakpoint with a cumulative sum of the bounds and a reverse log-cumsum-exp of the
    scores, take the first breakpoint with F >= 1: the keys before it are the capped set R, and
    g = (1 - sum_{R} u) / sum_{not R} exp(z). This yields the same set as the iterative capping of Martins &
    Kreutzer (2017) in O(n log n) without a loop. Infeasible rows (sum u < 1): alpha = u.
    Backward (A = allowed keys below their bound, R = capped keys):
    dz_j = 1[j in A] alpha_j (dalpha_j - m), du_j = 1[j in R] (dalpha_j - m),
    m = sum_{A} alpha_i dalpha_i / sum_{A} alpha_i  (sum_{A} alpha_i = 1 - sum_{R} u_i); m = 0 if A is empty.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, u: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        n = z.shape[-1]
        neg_inf = float("-inf")
        zs = torch.where(allowed, z - _row_max(z, allowed), neg_inf)
        us = torch.where(allowed, u.clamp(min=0, max=_NON_BINDING_BOUND), 0.0)
        log_ratio = torch.where(allowed, torch.log(us) - zs, neg_inf)  # log rho_j = log(u_j / exp(z_j))
        ratio_sorted, order = torch.sort(log_ratio, dim=-1)
        z_sorted = zs.gather(-1, order)
        u_cumsum = us.gather(-1, order).cumsum(dim=-1)
        lse_from = torch.logcumsumexp(z_sorted.flip(-1), dim=-1).flip(-1)  # log sum_{i >= k} exp(z_(i))
        lse_after = torch.cat([lse_from[..., 1:], torch.full_like(lse_from[..., :1], neg_inf)], dim=-1)
        f_at_breakpoint = u_cumsum + torch.exp(ratio_sorted + lse_after)  # Eq. 4 KKT: F(rho_(k)) = sum_j min(u_j, rho_(k) e^{z_j})
        k = _first_reaching_one(f_at_breakpoint)
        feasible = k < n
        k = k.clamp(max=n - 1)
        upper = ratio_sorted.gather(-1, k)  # log g lies in [log rho_(k-1), log rho_(k)]
        lower = torch.where(k > 0, ratio_sorted.gather(-1, (k - 1).clamp(min=0)), neg_inf)
        capped = allowed & (~feasible | (log_ratio < upper))  # Eq. 4 KKT: R = {j : rho_j < g}
        free = allowed & ~capped
        capped_mass = torch.where(capped, us, 0.0).sum(dim=-1, keepdim=True)
        log_free_mass = torch.log((1 - capped_mass).clamp(min=torch.finfo(z.dtype).tiny))
        log_g = log_free_mass - torch.logsumexp(torch.where(free, zs, neg_inf), dim=-1, keepdim=True)  # Eq. 4: sum alpha = 1
        log_g = torch.maximum(torch.minimum(log_g, upper), lower)
        alpha_free = torch.minimum(torch.exp(zs + log_g), us)  # Eq. 4 KKT: alpha_j = g exp(z_j) below the bound
        alpha = torch.where(capped, us, torch.where(free, alpha_free, 0.0))  # Eq. 4 KKT: alpha_j = u_j on R
        ctx.save_for_backward(alpha, capped)
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        alpha, capped = ctx.saved_tensors
        alpha_free = torch.where(capped, 0.0, alpha)  # alpha on A (masked keys hold 0)
        free_mass = alpha_free.sum(dim=-1, keepdim=True)  # = 1 - sum_{R} u
        weighted = (alpha_free * grad_alpha).sum(dim=-1, keepdim=True)
        m = torch.where(free_mass > 0, weighted / torch.where(free_mass > 0, free_mass, 1.0), 0.0)  # Martins & Kreutzer (2017)
        grad_z = alpha_free * (grad_alpha - m)  # dz_j = 1[j in A] alpha_j (dalpha_j - m)
        grad_u = torch.where(capped, grad_alpha - m, 0.0)  # du_j = 1[j in R] (dalpha_j - m)
        return grad_z, grad_u, None


class ConstrainedSparsemaxFunction(torch.autograd.Function):
    """Constrained sparsemax over the last dim (Eq. 6, Proposition 1; Malaviya et al., 2018).

    Forward (sort-based, exact; the breakpoint search of Pardalos & Kovoor, 1990, with a sort in place of
    median selection): f(tau) = sum_j clip(z_j - tau, 0, u_j) is non-increasing and piecewise linear in tau
    with breakpoints z_j (key j leaves zero) and z_j - u_j (key j reaches its bound). Sort the 2n breakpoints
    in decreasing order and evaluate f at each as a cumulative sum of (number of keys strictly inside their
    box on the segment above) x (segment length) -- a sum of non-negative terms, so no cancellation. The first
    breakpoint with f >= 1 closes the segment that holds tau; on it the sets A (0 < alpha < u) and A_R
    (alpha = u) are fixed and tau = (sum_{A} z + sum_{A_R} u - 1) / |A|. O(n log n). Infeasible rows
    (sum u < 1): alpha = u.
    Backward (Eq. 7-8): dz_j = 1[j in A](dalpha_j - m), du_j = 1[j in A_R](dalpha_j - m),
    m = mean of dalpha over A (m = 0 if A is empty).
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, u: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        n = z.shape[-1]
        # Masked keys become a zero-width box [0, 0]: they contribute 0 for every tau.
        zs = torch.where(allowed, z - _row_max(z, allowed), 0.0)
        us = torch.where(allowed, u.clamp(min=0, max=_NON_BINDING_BOUND), 0.0)
        z_minus_u = zs - us
        breakpoints, order = torch.sort(torch.cat([zs, z_minus_u], dim=-1), dim=-1, descending=True)
        entering = torch.where(order < n, 1.0, -1.0).to(z.dtype)  # +1 at z_j (key enters), -1 at z_j - u_j (capped)
        inside_after = entering.cumsum(dim=-1)
        inside_before = torch.cat([torch.zeros_like(inside_after[..., :1]), inside_after[..., :-1]], dim=-1)
        gap = torch.cat([torch.zeros_like(breakpoints[..., :1]), breakpoints[..., :-1] - breakpoints[..., 1:]], dim=-1)
        f_at_breakpoint = torch.where(inside_before > 0, inside_before * gap, 0.0).cumsum(dim=-1)  # Eq. 6: f(e_k) = sum_j clip(z_j - e_k, 0, u_j)
        k = _first_reaching_one(f_at_breakpoint)
        feasible = k < 2 * n
        k = k.clamp(min=1, max=2 * n - 1)
        lo = breakpoints.gather(-1, k)  # tau lies in [lo, hi]; no breakpoint strictly inside
        hi = breakpoints.gather(-1, k - 1)
        capped = allowed & (~feasible | (z_minus_u >= hi))  # A_R: alpha_j = u_j on the whole segment
        active = allowed & feasible & (z_minus_u <= lo) & (zs >= hi)  # A: 0 < alpha_j < u_j on the segment
        n_active = active.sum(dim=-1, keepdim=True)
        tau = (
            torch.where(active, zs, 0.0).sum(dim=-1, keepdim=True)
            + torch.where(capped, us, 0.0).sum(dim=-1, keepdim=True)
            - 1
        ) / n_active.clamp(min=1)  # Prop. 1: sum_j alpha_j = 1 solved for tau on A, A_R
        tau = torch.maximum(torch.minimum(tau, hi), lo)
        alpha_active = torch.minimum(zs - tau, us)  # Prop. 1: alpha_j = max(0, min(u_j, z_j - tau))
        alpha = torch.where(active, alpha_active, torch.where(capped, us, 0.0))
        ctx.save_for_backward(active, capped)
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_alpha: torch.Tensor):
        active, capped = ctx.saved_tensors
        n_active = active.sum(dim=-1, keepdim=True)
        m = torch.where(active, grad_alpha, 0.0).sum(dim=-1, keepdim=True) / n_active.clamp(min=1)  # m = mean of dalpha over A
        grad_z = torch.where(active, grad_alpha - m, 0.0)  # Eq. 7: dz_j = 1(j in A)(dalpha_j - m)
        grad_u = torch.where(capped, grad_alpha - m, 0.0)  # Eq. 8: du_j = 1(j in A_R)(dalpha_j - m)
        return grad_z, grad_u, None


def _prepare(z: torch.Tensor, u, dim: int, mask):
    """Broadcast, promote to the compute dtype and move `dim` last. Returns (z, u, allowed, dim)."""
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
    dim = dim % len(shape) if len(shape) else 0
    z = z.to(compute_dtype).expand(shape).movedim(dim, -1)
    if u is not None:
        u = u.to(compute_dtype).expand(shape).movedim(dim, -1)
    allowed = z != float("-inf")
    if mask is not None:
        allowed = allowed & mask.expand(shape).movedim(dim, -1)
    return z, u, allowed, dim


def sparsemax(z: torch.Tensor, dim: int = -1, mask: torch.Tensor | None = None) -> torch.Tensor:
    """sparsemax(z) = argmin_{alpha in simplex} ||alpha - z||^2 along `dim` (Eq. 3; Martins & Astudillo, 2016).

    Exact sort-based threshold (see `SparsemaxFunction`); gradient dz = 1[alpha > 0](dalpha - mean over the
    support). `mask` (bool, broadcastable, True = allowed) and -inf scores exclude keys: they get 0 attention
    and 0 gradient; an all-masked row is all zeros. Half precision is computed in float32. Returns z's dtype.
    """
    out_dtype = z.dtype if torch.is_tensor(z) else None
    zc, _, allowed, dim = _prepare(z, None, dim, mask)
    if zc.shape[-1] == 0:
        return (zc * 0).movedim(-1, dim).to(out_dtype)
    return SparsemaxFunction.apply(zc, allowed).movedim(-1, dim).to(out_dtype)


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
        return (zc * 0 + uc * 0).movedim(-1, dim).to(out_dtype)
    return ConstrainedSoftmaxFunction.apply(zc, uc, allowed).movedim(-1, dim).to(out_dtype)


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
        return (zc * 0 + uc * 0).movedim(-1, dim).to(out_dtype)
    return ConstrainedSparsemaxFunction.apply(zc, uc, allowed).movedim(-1, dim).to(out_dtype)
