"""The exact solvers behind `sparse_attention`'s sparsemax, csoftmax and csparsemax (Malaviya, Ferreira & Martins,
2018, Sec. 3), on [rows, keys] inputs whose scores are -inf on masked keys: the maps, their conventions and their
written-out backward are in `sparse_attention`.

Algorithms. Every forward pass is exact (no iteration to a tolerance) and vectorised over all leading
dimensions. Each map is fixed by a partition of the keys (zero / strictly inside the bounds / capped) and, given
the partition, by a threshold in closed form. Exact solvers find the partition:

* Active-set passes, for inputs of `_SORT_BELOW` entries or more on the CPU: finite methods whose passes are O(n)
  elementwise operations over the batch (no sort), and which for attention scores settle within a few passes:
  Michelot's (1986) algorithm for ``sparsemax``; the capping iteration of the authors' implementation
  (Martins & Kreutzer, 2017) for ``csoftmax``; Newton's method over the partitions for ``csparsemax``, a few
  plain passes first (`_NEWTON_PASSES`), then passes safeguarded by bisection for the rows they leave. A row is
  accepted once a pass leaves its partition unchanged: the threshold computed from the partition then defines that
  same partition, which is the optimality (KKT) condition, so the result is the exact solution. Rows that have
  not settled after `_MAX_PASSES` passes (adversarial inputs), infeasible rows and degenerate rows go to the
  sort-based solvers.
* Sort-based breakpoint searches (O(n log n)), for small inputs (where they cost fewer tensor operations), for
  every input off the CPU (see below) and for the rows the passes leave: sort the breakpoints of a monotone
  piecewise-linear function along ``dim``, locate the segment that holds the solution, solve in closed form on it
  (Martins & Astudillo, 2016, Alg. 1; Martins & Kreutzer, 2017; Pardalos & Kovoor, 1990, as in the paper's Alg. 1).
* For ``csparsemax(..., compiled=True)``: the same safeguarded Newton passes, but a fixed number of them over every
  row, branch-free and without host syncs, compiled by ``torch.compile`` into fused loops (one read of the keys
  per pass instead of a dozen eager operations); rows they have not settled go on with the eager solvers.

Host synchronisation. The active-set passes decide on the data (which rows settled, which rows the sort must
finish), and so do the choice of csoftmax's tail sums (`_csoftmax_tails`) and whether any row needs the NaN fills
(`fill_nonfinite`): they read tensor values, which is free only where the tensors live in host memory
(`HOST_DEVICES`: the CPU). On any other device each read would stall the host until the device has caught up, at
every layer and decoding step, so there every input goes to the sort-based solvers, which run branch-free: masks,
`torch.where` and row-wise arithmetic, no value read by Python (`tests/test_host_sync.py`). So does torch.export
(`solve_for_export`), whose graphs cannot branch on the data.

Rows that come out NaN (a NaN or +inf score, or a NaN bound, on an allowed key; `nonfinite_rows`) go through the
solvers as they are, which makes junk in those rows alone (every step is row-wise), and are filled with NaN after
(`fill_nonfinite`).
"""

import functools
import math

import torch


# Bounds above 1 never bind (every probability is <= 1); capping them at 2 keeps every quantity finite
# (u = +inf for a sink key) without changing the solution or which rows are feasible.
_NON_BINDING_BOUND = 2.0

# Inputs with fewer entries are solved by sorting: there the passes' fixed cost in tensor operations dominates.
_SORT_BELOW = 1 << 13

# csparsemax's plain Newton passes (`_csparsemax_newton_passes`), which run before the safeguarded ones: they settle
# decoding's inputs (e.g. [512, 37]: 128 sentences x 4 heads) in 3-4 passes, at 0.33 against 0.51 ms a call for the
# safeguarded passes alone (BENCHMARKS.md, fast path); on inputs whose bounds bind more (examples/
# benchmark_sparse_kernels.py) they leave 1-7% of the rows, and the two together cost what the safeguarded passes
# cost alone (0.93-1.04x).
_NEWTON_PASSES = 4

# Passes of the active-set methods before the rows that have not settled go to the sort-based solvers. Random
# or trained attention scores settle in 2-6 passes; the bound keeps adversarial inputs at O(n log n).
_MAX_PASSES = 12

# Inputs with at least this many entries drop settled rows from the passes (below, the bookkeeping costs more).
_COMPACT_FROM = 1 << 15

# Passes of csparsemax's compiled solver (`compiled=True`), which runs every pass over every row: attention scores
# settle within 6 (at [1024, 512] in examples/benchmark_sparse_kernels.py: 27/63/90/99/99.8/100% after 1-6); flat
# rows with a wide support (e.g. 20% of rows of N(0, 0.3^2) scores at [1024, 512]) go on with the eager passes.
_COMPILED_PASSES = 6
# Of its evaluations, the first this many also find the jump targets for rows with no free key (see
# `_csparsemax_fixed_passes`): with them in every pass, a pass costs about 1.5x as much and settles no more rows.
_JUMP_PASSES = 3

# Devices whose tensors live in host memory, where the solvers may read values to skip work (see the module docstring).
HOST_DEVICES = ("cpu",)

# Implementation notes (CPU): 0/1 indicators are float tensors written by comparisons with `out=` and used in
# multiplications and sums (bool tensors, their conversion and torch.where are several times slower); the
# passes write into a few preallocated buffers, which also become the outputs, since every fresh full-size
# allocation costs page faults.


def reads_values(x: torch.Tensor) -> bool:
    """Whether the solvers may branch on x's values: x lives in host memory (`HOST_DEVICES`), and no graph is being
    exported (an exported graph cannot branch on the data)."""
    return x.device.type in HOST_DEVICES and not torch.compiler.is_exporting()


def _passes_pay_off(x: torch.Tensor) -> bool:
    """Whether the active-set passes solve x ([rows, keys]): large inputs whose values the solvers may read; the
    others are sorted."""
    return x.numel() >= _SORT_BELOW and reads_values(x)


def _row_max(z: torch.Tensor) -> torch.Tensor:
    """Max over the last dim of scores that are -inf on masked keys; 0 for rows with no allowed key."""
    return torch.nan_to_num(z.amax(dim=-1, keepdim=True), neginf=0.0)


def row_sum(x: torch.Tensor) -> torch.Tensor:
    return x.sum(dim=-1, keepdim=True)


def as_rows(x: torch.Tensor) -> torch.Tensor:
    """x as a 2-D [rows, keys] tensor (a view when x is contiguous)."""
    return x.reshape(-1, x.shape[-1])


def _true_rows(mask: torch.Tensor, all_none: bool = False) -> torch.Tensor | None:
    """Indices of the True rows of a [rows, 1] bool tensor; None if there are none (or, with all_none, if every
    row is True)."""
    rows = mask.squeeze(-1).nonzero().squeeze(-1)
    if all_none:
        return None if rows.numel() == mask.shape[0] else rows
    return rows if rows.numel() else None


def clamped_bounds(u: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
    """u clamped to [0, 2] and 0 on the keys masked in z (scores, -inf on masked keys, u's shape; None: no key
    masked), as [rows, keys]. (A fill, not a multiplication, so that a NaN bound on a masked key is ignored like the
    key.)"""
    us = u.clamp(min=0, max=_NON_BINDING_BOUND)
    return as_rows(us if z is None else us.masked_fill_(z == float("-inf"), 0.0))


def nonfinite_rows(row_max: torch.Tensor, us: torch.Tensor | None = None) -> torch.Tensor:
    """The [rows, 1] bool mask of the rows that come out NaN (see the module docstring): row_max, the [rows, 1] max
    of scores that are -inf on masked keys, is NaN or +inf (amax propagates NaN), or bounds `us` (0 on masked keys)
    hold a NaN."""
    nonfinite = ~(row_max < float("inf"))  # NaN or +inf; -inf (every key masked) is a finite row
    if us is not None:
        nonfinite |= row_sum(us).isnan()
    return nonfinite


# ----------------------------------------------------------------------------------------------------------
# Sort-based solvers (inputs: [rows, keys], scores -inf on masked keys, bounds from `clamped_bounds`).


def _sparsemax_sort(zs: torch.Tensor) -> torch.Tensor:
    """tau of sparsemax by Martins & Astudillo (2016, Alg. 1): sort the scores in decreasing order; the support
    size is the largest k with 1 + k z_(k) > sum_{i<=k} z_(i), and tau = (sum_{i<=k} z_(i) - 1) / k."""
    n = zs.shape[-1]
    z_sorted = torch.sort(zs, dim=-1, descending=True)[0]  # masked keys (-inf) last
    k = torch.arange(1, n + 1, dtype=zs.dtype, device=zs.device)
    z_cumsum = z_sorted.cumsum(dim=-1)  # -inf from the first masked key on: never in the support
    support_size = row_sum(1 + k * z_sorted > z_cumsum)
    tau = (z_cumsum.gather(-1, (support_size - 1).clamp(min=0)) - 1) / support_size.clamp(min=1)
    return torch.nan_to_num(tau, neginf=0.0)  # rows with no allowed key


def _shifted_scores(z: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """z - max over the allowed keys of the row (shift invariance of all three maps), 0 on masked keys."""
    return (torch.nan_to_num(z, neginf=0.0) - _row_max(z)) * keep


def _csoftmax_sort(z: torch.Tensor, us: torch.Tensor):
    """Constrained softmax by sorting (Martins & Kreutzer, 2017): the solution is alpha_j = min(u_j, g exp(z_j))
    for the g > 0 with F(g) = sum_j min(u_j, g exp(z_j)) = 1. F is increasing and piecewise linear in g with
    breakpoints at the ratios rho_j = u_j / exp(z_j); key j is capped iff rho_j < g. Sort the ratios (in log space)
    ascending, evaluate F at every breakpoint with a cumulative sum of the bounds and a reverse cumulative sum of
    exp(z), take the first breakpoint with F >= 1: the keys before it are capped, and g = (1 - sum_capped u) /
    sum_free exp(z). Infeasible rows (sum u < 1): alpha = u. Returns (alpha, capped)."""
    n = z.shape[-1]
    keep = (z != float("-inf")).to(z.dtype)
    zs = _shifted_scores(z, keep)
    log_ratio = torch.log(us) - zs  # log rho_j; -inf for zero bounds and masked keys
    ratio_sorted, order = torch.sort(log_ratio, dim=-1)
    u_cumsum = us.gather(-1, order).cumsum(dim=-1)
    log_tail = _csoftmax_tails(zs, zs.gather(-1, order), keep.gather(-1, order))
    log_tail = torch.nn.functional.pad(log_tail[..., 1:], (0, 1), value=float("-inf"))
    f_at_breakpoint = u_cumsum + torch.exp(ratio_sorted + log_tail)  # F(rho) = sum_j min(u_j, rho e^z_j)
    # First breakpoint with F >= 1 (n: none, infeasible). F is non-decreasing; where rounding makes it wobble,
    # it does so within rounding of 1 at breakpoints rho_j ~ g, where capping key j or not is the same.
    k = row_sum(f_at_breakpoint < 1)
    feasible = k < n
    k = k.clamp(max=n - 1)
    threshold = ratio_sorted.gather(-1, k)  # log g lies in [log rho_(k-1), log rho_(k)]
    capped = ((log_ratio < threshold) | ~feasible).to(z.dtype) * keep  # capped iff rho_j < g
    free = keep - capped
    free_mass = (1 - row_sum(us * capped)).clamp(min=0)  # 1 - sum_capped u is left for the free keys
    log_free_norm = torch.nan_to_num(torch.logsumexp(zs + torch.log(free), dim=-1, keepdim=True), neginf=0.0)
    softmax_free = torch.exp((zs - log_free_norm) * free)  # meaningful (and kept finite) only on free keys
    alpha_free = torch.minimum(free_mass * softmax_free, us)  # alpha_j = g exp(z_j) below the bound
    return capped * us + free * alpha_free, capped


def _csoftmax_tails(zs: torch.Tensor, z_sorted: torch.Tensor, keep_sorted: torch.Tensor) -> torch.Tensor:
    """log sum_{i >= k} exp(z_(i)) for every position k of the keys in `_csoftmax_sort`'s order (z_sorted: the
    shifted scores zs in that order, keep_sorted: 1 on allowed keys). In the linear domain (no cancellation: a
    reverse cumulative sum; logcumsumexp costs 10x as much on the CPU) except in the rows where some allowed key's
    exp(z - max) would underflow, which take logcumsumexp: on the host only those rows (their indices read), elsewhere
    every row, chosen by `torch.where` (same numbers, no read)."""
    log_domain = row_sum(zs < (-80.0 if zs.dtype != torch.float64 else -700.0)) > 0  # zs is 0 on masked keys
    log_tail = torch.log((torch.exp(z_sorted) * keep_sorted).flip(-1).cumsum(dim=-1).flip(-1))

    def log_domain_tails(z_sorted, keep_sorted):
        return torch.logcumsumexp((z_sorted + torch.log(keep_sorted)).flip(-1), dim=-1).flip(-1)

    if not reads_values(zs):
        return torch.where(log_domain, log_domain_tails(z_sorted, keep_sorted), log_tail)
    if (rows := _true_rows(log_domain)) is not None:
        rows_tails = log_domain_tails(z_sorted.index_select(0, rows), keep_sorted.index_select(0, rows))
        log_tail.index_copy_(0, rows, rows_tails)
    return log_tail


def _csparsemax_sort(z: torch.Tensor, us: torch.Tensor):
    """Constrained sparsemax by sorting (the breakpoint search of Pardalos & Kovoor, 1990, with a sort, as in the
    paper's Alg. 1): f(tau) = sum_j clip(z_j - tau, 0, u_j) is non-increasing and piecewise linear in tau with
    breakpoints z_j (key j leaves zero) and z_j - u_j (key j reaches its bound). Sort the 2n breakpoints in
    decreasing order and evaluate f at each as a cumulative sum of (number of keys strictly inside their box on
    the segment above) x (segment length), a sum of non-negative terms, so no cancellation. The first breakpoint
    with f >= 1 closes the segment that holds tau; on it the sets A (0 < alpha < u) and A_R (alpha = u) are fixed
    and tau = (sum_{A} z + sum_{A_R} u - 1) / |A|. Infeasible rows (sum u < 1): alpha = u.
    Returns (alpha, active, capped, |A|)."""
    n = z.shape[-1]
    # Masked keys become a zero-width box [0, 0] at score 0: they contribute 0 for every tau.
    keep = (z != float("-inf")).to(z.dtype)
    zs = _shifted_scores(z, keep)
    z_minus_u = zs - us
    breakpoints, order = torch.sort(torch.cat([zs, z_minus_u], dim=-1), dim=-1, descending=True)
    entering = (order < n).to(z.dtype) * 2 - 1  # +1 at z_j (key j enters), -1 at z_j - u_j (capped)
    inside_before = torch.nn.functional.pad(entering.cumsum(dim=-1)[..., :-1], (1, 0))
    gap = torch.nn.functional.pad(breakpoints[..., :-1] - breakpoints[..., 1:], (1, 0))
    # (inside_before is -1 only between tied breakpoints of a zero-width box, where the gap is 0.)
    f_at_breakpoint = (inside_before.clamp(min=0) * gap).cumsum(dim=-1)  # f(e) = sum_j clip(z_j - e, 0, u_j)
    k = row_sum(f_at_breakpoint < 1)  # first e_k with f >= 1 (f is non-decreasing); 2n: none
    feasible = k < 2 * n
    k = k.clamp(min=1, max=2 * n - 1)
    lo = breakpoints.gather(-1, k)  # tau lies in [lo, hi]; no breakpoint strictly inside
    hi = breakpoints.gather(-1, k - 1)
    capped = ((z_minus_u >= hi) | ~feasible).to(z.dtype) * keep  # A_R: alpha_j = u_j on the whole segment
    active = ((z_minus_u <= lo) & (zs >= hi) & feasible).to(z.dtype) * keep  # A: 0 < alpha_j < u_j there
    excess = row_sum(zs * active) + row_sum(us * capped) - 1
    n_active = row_sum(active)
    tau = excess / n_active.clamp(min=1)  # Prop. 1: sum_{A} (z_j - tau) + sum_{A_R} u_j = 1
    tau = torch.maximum(torch.minimum(tau, hi), lo)
    alpha = active * torch.minimum(zs - tau, us) + capped * us  # alpha_j = max(0, min(u_j, z_j - tau))
    return alpha, active, capped, n_active


# ----------------------------------------------------------------------------------------------------------
# Active-set passes (inputs: [rows, keys]; scores shifted so that each row's max is 0, -inf on masked keys).


def _settle(step, inputs: tuple, buffers: tuple, state: tuple, rows: torch.Tensor | None = None):
    """Run an active-set method over the rows of `inputs` until each row's partition stops changing.

    step(inputs, buffers, state, done) -> (state, settled) is one pass over the working rows: `state` is a tuple
    of [rows, 1] tensors, `buffers` are scratch tensors shaped like inputs[0] (the caller's, to reuse after),
    `done` ([rows, 1] bool) marks the rows that settled in an earlier pass (their state must not change), and
    `settled` the rows whose partition did not change in this pass, so that their new state is exact. In large
    inputs, settled rows are dropped from the working rows once they are half of them. `rows`: the rows to solve
    (None: all); the others keep their initial state. Returns the final state of every row and the [rows, 1]
    bool tensor of the rows that settled.
    """
    result = done_all = None
    if rows is not None:
        result, done_all = [x.clone() for x in state], torch.zeros_like(state[0], dtype=torch.bool)
        inputs, state = tuple(x.index_select(0, rows) for x in inputs), tuple(x.index_select(0, rows) for x in state)
        buffers = tuple(x[: rows.numel()] for x in buffers)
    done = torch.zeros_like(state[0], dtype=torch.bool)
    compact = inputs[0].numel() >= _COMPACT_FROM
    for _ in range(_MAX_PASSES):
        state, settled = step(inputs, buffers, state, done)
        done |= settled
        n_working, n_done = done.shape[0], int(done.sum())
        if n_done == n_working:
            break
        if compact and 2 * n_done >= n_working:
            keep = (~done).squeeze(-1).nonzero().squeeze(-1)
            if result is None:
                result, done_all, rows = list(state), done, keep
            else:
                for r, x in zip(result, state):
                    r.index_copy_(0, rows, x)
                done_all.index_copy_(0, rows, done)
                rows = rows.index_select(0, keep)
            inputs = tuple(x.index_select(0, keep) for x in inputs)
            state = tuple(x.index_select(0, keep) for x in state)
            buffers, done = tuple(x[: keep.numel()] for x in buffers), done.index_select(0, keep)
    if result is None:
        return state, done
    for r, x in zip(result, state):
        r.index_copy_(0, rows, x)
    done_all.index_copy_(0, rows, done)
    return result, done_all


def _sparsemax_pass(inputs, buffers, state, done):
    """Michelot's (1986) pass: t <- t + (sum_j max(0, z_j - t) - 1) / |S| = (sum_S z - 1) / |S|, S = {z_j > t}:
    a Newton step on a convex piecewise-linear function, which never overshoots tau, so S only shrinks. Settled
    when {z_j > t} stays S: then t is computed from the set it defines, the exact tau; rows settled earlier keep
    their t. State: (t, |{z_j > t}|)."""
    (zs,), (work,), (t, count) = inputs, buffers, state
    excess = row_sum(torch.sub(zs, t, out=work).clamp_(min=0)).sub_(1)
    t = torch.where(done, t, torch.addcdiv(t, excess, count.clamp(min=1)))
    new_count = row_sum(torch.gt(zs, t, out=work))
    return (t, new_count), new_count == count


def _csoftmax_pass(inputs, buffers, state, done):
    """The capping pass: C = {j : g exp(z_j) > u_j}, then g <- (1 - sum_C u) / sum_{not C} exp(z). g only
    increases, so every capped key stays capped and C only grows. Settled when C is the set g was computed from:
    then g is exact (and a settled row keeps it: the same set gives the same g). State: (g, |C| of the set g was
    computed from, sum_{not C} exp(z))."""
    (e, us), (work, capped), (g, n_capped, _) = inputs, buffers, state
    new_n_capped = row_sum(torch.gt(torch.mul(e, g, out=work), us, out=capped))  # Eq. 4 KKT: g exp(z_j) <= u_j
    free_mass = row_sum(torch.mul(us, capped, out=work)).neg_().add_(1)  # 1 - sum_C u
    free_e = row_sum(torch.addcmul(e, e, capped, value=-1, out=work))  # sum_{not C} exp(z)
    g = free_mass / free_e.clamp(min=torch.finfo(e.dtype).tiny)
    return (g, new_n_capped, free_e), new_n_capped == n_capped


def _csparsemax_at(zs, us, t, work, indicator):
    """(f(t) = sum_j clip(z_j - t, 0, u_j), |{j : z_j > t}|, |{j : z_j - t > u_j}|) per row. Keys with a zero bound
    above t are in both sets, so they cancel in |A| = |{0 < z_j - t <= u_j}|; work ends up holding the clipped
    values."""
    x = torch.sub(zs, t, out=work)
    n_positive = row_sum(torch.gt(x, 0, out=indicator))
    n_capped = row_sum(torch.gt(x, us, out=indicator))
    return row_sum(torch.clamp(x, x.new_zeros(()), us, out=x)), n_positive, n_capped


def _csparsemax_jump(zs, us, t, f):
    """For rows with no free key at t (f is flat just above t): the next breakpoint towards the solution, where
    one key starts (f < 1: the largest z_j <= t with u_j > 0) or stops (f > 1: the smallest z_j - u_j > t with
    u_j > 0) moving, plus the Newton step with that key alone. (Few rows; the masks are 0/1 float tensors, see
    the implementation notes.)"""
    big = zs.new_full((), torch.finfo(zs.dtype).max)
    x = zs - t
    blocked = torch.eq(us, 0, out=torch.empty_like(x))  # keys with a zero bound never move
    step = torch.addcmul(zs, torch.gt(x, 0, out=x).add_(blocked), big, value=-1).amax(dim=-1, keepdim=True)
    if not bool((f < 1).all()):
        leaving = torch.addcmul(zs - us, torch.le(zs - t, us, out=x).add_(blocked), big).amin(dim=-1, keepdim=True)
        step = torch.where(f < 1, step, leaving)
    return step + (f - 1)


def _safeguard(t, excess, step, lo, hi):
    """Keep a step of `_csparsemax_pass` only if it lands strictly inside the bracket (lo, hi) of the earlier t's (at
    an end of the bracket or beyond, it is a cycle or an overshoot), else bisect the bracket; then t joins the
    bracket on its side of the solution (f(t) >= 1: t <= tau, f(t) <= 1: t >= tau).
    Returns (new t, whether the step was kept, lo, hi)."""
    inside = (step > lo) & (step < hi)
    lo = torch.where(excess >= 0, t, lo)
    hi = torch.where(excess <= 0, t, hi)
    return torch.where(inside, step, (lo + hi) * 0.5), inside, lo, hi


def _csparsemax_pass(inputs, buffers, state, done):
    """Newton's step on f(t) = sum_j clip(z_j - t, 0, u_j) = 1 from the partition at t (A = {0 < z_j - t <= u_j},
    A_R = {z_j - t > u_j}): t <- t + (f(t) - 1) / |A| = (sum_A z + sum_{A_R} u - 1) / |A| (Prop. 1), or
    `_csparsemax_jump` if A is empty. f is not convex, so Newton's steps can cycle: `_safeguard` bisects instead.
    Settled when a Newton step keeps the partition: then t is computed from the partition it defines, the exact
    tau; rows settled earlier keep their t.
    State: (t, f(t), |{z_j > t}|, |A_R|, lo, hi)."""
    (zs, us), (work, indicator), (t, f, n_positive, n_capped, lo, hi) = inputs, buffers, state
    n_active = n_positive - n_capped
    excess = f - 1
    step = torch.addcdiv(t, excess, n_active.clamp(min=1))
    newton = n_active > 0
    if not bool(newton.all()):
        rows = (~newton).squeeze(-1).nonzero().squeeze(-1)
        step.index_copy_(0, rows, _csparsemax_jump(*(x.index_select(0, rows) for x in (zs, us, t, f))))
    new_t, inside, lo, hi = _safeguard(t, excess, step, lo, hi)
    newton &= inside
    new_t = torch.where(done, t, new_t)
    new_f, new_n_positive, new_n_capped = _csparsemax_at(zs, us, new_t, work, indicator)
    settled = (new_n_positive == n_positive) & (new_n_capped == n_capped) & newton
    return (new_t, new_f, new_n_positive, new_n_capped, lo, hi), settled


def _csparsemax_evaluate(zs, us, moving, t, jump_targets: bool):
    """`_csparsemax_at` at t, for every row, in one pass over the keys, and with `jump_targets` the targets of
    `_csparsemax_jump` (the largest z_j <= t and the smallest z_j - u_j > t over the moving keys, u_j > 0), else t
    for both. Returns (f(t), |{z_j > t}|, |A_R|, target below, target above); counts are floats, exact below 2^24
    keys."""
    big = torch.finfo(zs.dtype).max
    x = zs - t
    positive, capped = x > 0, x > us
    f = torch.minimum(x.clamp(min=0), us).sum(dim=-1, keepdim=True)
    n_positive = positive.to(zs.dtype).sum(dim=-1, keepdim=True)
    n_capped = capped.to(zs.dtype).sum(dim=-1, keepdim=True)
    if not jump_targets:
        return f, n_positive, n_capped, t, t
    entering = torch.where(positive | ~moving, -big, zs).amax(dim=-1, keepdim=True)
    leaving = torch.where(capped & moving, zs - us, big).amin(dim=-1, keepdim=True)
    return f, n_positive, n_capped, entering, leaving


def _csparsemax_fixed_passes(z: torch.Tensor, us: torch.Tensor, passes: int):
    """`_csparsemax_pass` as `passes` branch-free passes over every row, for torch.compile to fuse (no host sync, no
    data-dependent shape): settled rows keep their t, and the bracket starts at [min_j (z_j - u_j), max z], where
    f = sum u >= 1 (every key capped; feasible rows) and f = 0. Rows with no free key are met mostly in the first
    passes (t = max - 1 lies below the caps of the top keys), so only the first `_JUMP_PASSES` evaluations find the
    jump targets, two more reductions; later, such a row steps as if one key were free, t <- t + f(t) - 1.
    z: scores (-inf on masked keys), us: bounds. Returns (alpha, active, capped, |A|, settled, nonfinite); infeasible
    rows and rows left with an empty A are not settled; the rows that come out NaN (`nonfinite_rows`, found from the
    row max and bound sum the passes need anyway, [rows, 1] bool `nonfinite`) are set to NaN and count as
    settled."""
    big = torch.finfo(z.dtype).max
    row_max, u_sum = z.amax(dim=-1, keepdim=True), us.sum(dim=-1, keepdim=True)
    nonfinite = ~(row_max < float("inf")) | u_sum.isnan()
    # The NaN rows go through the passes as they are: branch-free row-wise arithmetic on them makes NaN or junk in
    # those rows alone, which the end overwrites (cheaper than cleaning the inputs first, which costs a pass).
    zs = z - torch.nan_to_num(row_max, neginf=0.0)
    moving = us > 0
    t = torch.full_like(zs[:, :1], -1.0)
    lo = torch.where(moving, zs - us, big).amin(dim=-1, keepdim=True)
    hi = torch.zeros_like(t)
    f, n_positive, n_capped, entering, leaving = _csparsemax_evaluate(zs, us, moving, t, True)
    settled = torch.zeros_like(t, dtype=torch.bool)
    for i in range(passes):
        n_active = n_positive - n_capped
        excess = f - 1
        newton = n_active > 0
        jump = torch.where(excess < 0, entering, leaving) + excess
        step = torch.where(newton, t + excess / n_active.clamp(min=1), jump)
        new_t, inside, lo, hi = _safeguard(t, excess, step, lo, hi)
        new_t = torch.where(settled, t, new_t)
        evaluation = _csparsemax_evaluate(zs, us, moving, new_t, i + 1 < _JUMP_PASSES)
        f, new_n_positive, new_n_capped, entering, leaving = evaluation
        settled = settled | ((new_n_positive == n_positive) & (new_n_capped == n_capped) & newton & inside)
        t, n_positive, n_capped = new_t, new_n_positive, new_n_capped
    x = zs - t  # the settled partition, with the passes' arithmetic
    capped = (x > us).to(z.dtype)
    active = (x > 0).to(z.dtype) - capped
    alpha = torch.minimum(x.clamp(min=0), us)  # Prop. 1: alpha_j = max(0, min(u_j, z_j - tau))
    n_active = n_positive - n_capped
    feasible = u_sum >= 1
    alpha = torch.where(nonfinite, float("nan"), alpha)
    return alpha, active, capped, n_active, (settled & feasible & (n_active > 0)) | nonfinite, nonfinite


@functools.cache
def _compile(function):
    return torch.compile(function, dynamic=True, fullgraph=True)


def torch_compiled(function):
    """`function` compiled by torch.compile, once per process (on its first call; new dtypes or devices recompile);
    `function` itself while torch.compile traces a caller, which compiles it with the rest."""
    return function if torch.compiler.is_compiling() else _compile(function)


# ----------------------------------------------------------------------------------------------------------
# The three maps on [rows, keys] inputs: active-set passes, or sorting for small inputs and the rows left over.


def solve_sparsemax(zs: torch.Tensor):
    """zs: scores minus the row max (-inf on masked keys; overwritten). Returns (alpha, support size)."""
    work = torch.empty_like(zs)
    if not _passes_pay_off(zs):
        tau = _sparsemax_sort(zs)
    else:
        t = zs.new_full((zs.shape[0], 1), -1.0)  # tau >= max(z) - 1 = -1: no alpha_j exceeds 1
        (tau, _), settled = _settle(_sparsemax_pass, (zs,), (work,), (t, row_sum(torch.gt(zs, t, out=work))))
        if (rows := _true_rows(~settled)) is not None:
            tau.index_copy_(0, rows, _sparsemax_sort(zs.index_select(0, rows)))
    alpha = zs.sub_(tau).clamp_(min=0)  # Eq. 3: alpha_j = max(0, z_j - tau)
    return alpha, row_sum(torch.gt(alpha, 0, out=work))


def solve_csoftmax(z: torch.Tensor, us: torch.Tensor):
    """z: scores (-inf on masked keys), us: bounds. Returns (alpha, alpha on the free keys, capped, free mass)."""
    if not _passes_pay_off(z):
        alpha, capped = _csoftmax_sort(z, us)
        alpha_free = alpha * (1 - capped)
        return alpha, alpha_free, capped, row_sum(alpha_free)
    e = torch.sub(z, _row_max(z)).exp_()  # exp(z - max); 0 on masked keys
    feasible = row_sum(us) >= 1
    sum_e = row_sum(e)
    buffers = (torch.empty_like(e), torch.empty_like(e))
    state = (1 / sum_e, torch.zeros_like(sum_e), sum_e)  # C = {}: g = 1 / sum exp(z)
    (g, _, free_e), settled = _settle(_csoftmax_pass, (e, us), buffers, state, _true_rows(feasible, all_none=True))
    alpha_free = e.mul_(g)
    capped = torch.gt(alpha_free, us, out=buffers[1])  # the settled partition (same arithmetic as the pass)
    free_mass = row_sum(torch.mul(us, capped, out=buffers[0])).neg_().add_(1)  # 1 - sum_capped u
    alpha_free.addcmul_(alpha_free, capped, value=-1)  # g exp(z_j) on the free keys, 0 on the capped ones
    alpha = torch.addcmul(alpha_free, capped, us, out=buffers[0])  # alpha_j = u_j on the capped keys
    # Infeasible rows (sum u < 1) and rows whose free keys hold less than sqrt(tiny) of exp(z - max), where the
    # linear domain would lose precision, are sorted (in log space).
    settled &= feasible & (free_e >= torch.finfo(e.dtype).tiny ** 0.5)
    if (rows := _true_rows(~settled)) is not None:
        alpha_rows, capped_rows = _csoftmax_sort(z.index_select(0, rows), us.index_select(0, rows))
        alpha_free_rows = alpha_rows * (1 - capped_rows)
        for target, values in ((alpha, alpha_rows), (alpha_free, alpha_free_rows), (capped, capped_rows),
                               (free_mass, row_sum(alpha_free_rows))):
            target.index_copy_(0, rows, values)
    return alpha, alpha_free, capped, free_mass


def solve_csparsemax(z: torch.Tensor, us: torch.Tensor, compiled: bool = False):
    """z: scores (-inf on masked keys), us: bounds (the caller's, may be overwritten). Returns (alpha, active, capped,
    |active|, the mask of the rows that come out NaN, `nonfinite_rows`); alpha is NaN on those rows. The compiled
    passes run where the eager ones would (`_passes_pay_off`)."""
    if not compiled or not _passes_pay_off(z):
        nonfinite = nonfinite_rows(z.amax(dim=-1, keepdim=True), us)
        alpha, active, capped, n_active = _csparsemax_eager_solve(z, us)
        return alpha, active, capped, n_active, fill_nonfinite(nonfinite, alpha)
    try:
        # (The compiled passes find the NaN rows themselves, from the reductions they do anyway.)
        alpha, active, capped, n_active, settled, nonfinite = torch_compiled(_csparsemax_fixed_passes)(
            z, us, _COMPILED_PASSES)
    except torch._dynamo.exc.BackendCompilerFailed as error:
        raise RuntimeError(
            "csparsemax(compiled=True): torch.compile could not compile the solver (on CPU it needs a working C++ "
            "compiler; the cause is below). Leave compiled=False for the eager solver, same results."
        ) from error
    # Rows the fixed passes leave (e.g. flat scores, where many keys share the support) go on with the safeguarded
    # eager passes (sorted if few). NaN rows count as settled.
    solution = _solve_unsettled(_csparsemax_safeguarded_solve, z, us, settled, (alpha, active, capped, n_active))
    return (*solution, nonfinite)


def _csparsemax_eager_solve(z: torch.Tensor, us: torch.Tensor):
    """`solve_csparsemax` without compiling: sorting for small inputs and off the host, else `_NEWTON_PASSES` plain
    Newton passes, then `_csparsemax_safeguarded_solve` for the rows they leave."""
    if not _passes_pay_off(z):
        return _csparsemax_sort(z, us)
    *solution, settled = _csparsemax_newton_passes(z, us, _NEWTON_PASSES)
    return _solve_unsettled(_csparsemax_safeguarded_solve, z, us, settled, solution)


def _csparsemax_safeguarded_solve(z: torch.Tensor, us: torch.Tensor):
    """Sorting for small inputs and off the host, else the safeguarded passes until every row settles, then sorting
    for the rows they leave."""
    if not _passes_pay_off(z):
        return _csparsemax_sort(z, us)
    *solution, settled = _csparsemax_adaptive_passes(z, us)
    return _solve_unsettled(_csparsemax_sort, z, us, settled, solution)


def _solve_unsettled(solve, z: torch.Tensor, us: torch.Tensor, settled: torch.Tensor, solution):
    """`solution` (tensors with a row per row of z) with the rows that are not `settled` overwritten by `solve`'s
    answer for those rows alone."""
    if (rows := _true_rows(~settled)) is not None:
        for target, values in zip(solution, solve(z.index_select(0, rows), us.index_select(0, rows))):
            target.index_copy_(0, rows, values)
    return tuple(solution)


def _csparsemax_newton_passes(z: torch.Tensor, us: torch.Tensor, passes: int):
    """`passes` plain Newton steps t <- t + (f(t) - 1) / |A| over every row from t = max(z) - 1, with neither the
    bracket nor the jumps of `_csparsemax_pass`: about half its operations, which at decoding's sizes (hundreds of
    rows of a few dozen keys) decide the time, and there every row settles within 3-4 steps. A row is settled if its
    last step kept its partition (the counts of keys above 0 and above their bound, both monotone in t, equal at both
    ends: no breakpoint between, so f is linear there with slope -|A| and the step lands on its root), had a free key
    and is feasible; the others (a cycle, a flat stretch, an infeasible or NaN row) are left to the caller.
    Returns (alpha, active, capped, |A|, settled) as `_csparsemax_adaptive_passes`."""
    zs = torch.sub(z, _row_max(z))  # -inf on masked keys
    work, indicator = torch.empty_like(zs), torch.empty_like(zs)
    t = zs.new_full((zs.shape[0], 1), -1.0)
    f, n_positive, n_capped = _csparsemax_at(zs, us, t, work, indicator)
    settled = torch.zeros_like(t, dtype=torch.bool)
    for i in range(passes):
        n_active = n_positive - n_capped
        t = torch.addcdiv(t, f.sub_(1), n_active.clamp(min=1))
        f, new_n_positive, new_n_capped = _csparsemax_at(zs, us, t, work, indicator)
        if i == passes - 1:  # only the last step certifies the t it ends at
            settled = (new_n_positive == n_positive) & (new_n_capped == n_capped) & (n_active > 0)
        n_positive, n_capped = new_n_positive, new_n_capped
    alpha, active, capped = _csparsemax_solution_at(zs, us, t, work, indicator)
    return alpha, active, capped, n_positive.sub_(n_capped), settled & (row_sum(us) >= 1)


def _csparsemax_solution_at(zs, us, t, work, indicator):
    """(alpha, active, capped) of the partition at t, with the passes' arithmetic (a key with a zero bound is capped if
    z_j > t), written into the buffers: alpha into work, active into indicator, capped into zs (zs is spent)."""
    x = torch.sub(zs, t, out=work)
    capped = torch.gt(x, us, out=zs)
    active = torch.gt(x, 0, out=indicator).sub_(capped)
    alpha = torch.clamp(x, x.new_zeros(()), us, out=x)  # Prop. 1: alpha_j = max(0, min(u_j, z_j - tau))
    return alpha, active, capped


def _csparsemax_adaptive_passes(z: torch.Tensor, us: torch.Tensor):
    """`_csparsemax_pass` until every row settles, dropping settled rows (`_settle`).
    Returns (alpha, active, capped, |A|, settled) as `_csparsemax_fixed_passes`."""
    zs = torch.sub(z, _row_max(z))  # -inf on masked keys
    feasible = row_sum(us) >= 1
    work, indicator = torch.empty_like(zs), torch.empty_like(zs)
    # Start one below the top score. Bracket: f(t + 1) = 0 < 1, so tau < t + 1; no lower bound yet.
    t = zs.new_full((zs.shape[0], 1), -1.0)
    state = (t, *_csparsemax_at(zs, us, t, work, indicator), torch.full_like(t, float("-inf")), t + 1)
    (tau, _, n_positive, n_capped, *_), settled = _settle(_csparsemax_pass, (zs, us), (work, indicator), state,
                                                          _true_rows(feasible, all_none=True))
    alpha, active, capped = _csparsemax_solution_at(zs, us, tau, work, indicator)  # the settled partition
    n_active = n_positive.sub_(n_capped)
    return alpha, active, capped, n_active, settled & feasible & (n_active > 0)


# ----------------------------------------------------------------------------------------------------------
# The entmax family (Peters, Niculae & Martins, 2019; Correia, Niculae & Martins, 2019), on inputs [..., keys] of
# scores that are -inf on masked keys. Both solvers are branch-free on every device (a sort, or a fixed number of
# bisection steps) and work at any leading shape, so torch.export runs them as they are.


def solve_entmax15(z: torch.Tensor):
    """1.5-entmax by sorting (Peters et al., 2019, Alg. 2): alpha_j = [z_j / 2 - tau]_+^2 with sum_j alpha_j = 1.
    With x = (z - max z) / 2 sorted in decreasing order, f(t) = sum_j [x_j - t]_+^2 is decreasing, and key k is in
    the support iff f(x_(k)) = sum_{i<k} (x_(i) - x_(k))^2 < 1, which grows with k (so the support is a prefix, the
    top key always in it). On a support of k keys with mean m and sum of squared deviations s, tau is the root of
    sum_{i<=k} (x_(i) - tau)^2 = s + k (m - tau)^2 = 1 below m: tau = m - sqrt((1 - s) / k), and s < 1 there (s is
    at most f(x_(k)), the mean minimising the squared deviations). Support keys have x > tau >= -1, so the cumulative
    sums' rounding grows like k ulp(1), as sparsemax's sort does. Returns (alpha, sqrt(alpha)); rows with no allowed
    key are zeros. (NaN and +inf rows are junk, for the caller to fill.)"""
    n = z.shape[-1]
    x = (z - _row_max(z)) * 0.5  # -inf on masked keys
    x_sorted = torch.sort(x, dim=-1, descending=True)[0]  # masked keys last
    keep = x_sorted != float("-inf")
    x_kept = torch.where(keep, x_sorted, 0.0)
    k = torch.arange(1, n + 1, dtype=z.dtype, device=z.device)
    x_cumsum, square_cumsum = x_kept.cumsum(dim=-1), (x_kept * x_kept).cumsum(dim=-1)
    # sums over the keys above the k-th (inclusive sums less the k-th: a shifted copy would make torch.export guard
    # on the key count minus one)
    x_before, square_before = x_cumsum - x_kept, square_cumsum - x_kept * x_kept
    f_at_key = square_before - 2 * x_kept * x_before + (k - 1) * x_kept * x_kept  # sum_{i<k} (x_(i) - x_(k))^2
    support_size = row_sum((f_at_key < 1) & keep).clamp(min=1).to(torch.long)  # (1 for rows with no allowed key)
    size = support_size.to(z.dtype)
    mean = x_cumsum.gather(-1, support_size - 1) / size
    deviations = square_cumsum.gather(-1, support_size - 1) - mean * mean * size  # s = sum (x - m)^2
    tau = mean - torch.sqrt(((1 - deviations) / size).clamp(min=0))
    root = (x - tau).clamp(min=0)  # [z / 2 - tau]_+, 0 on masked keys
    return root * root, root


def bisection_steps(dtype: torch.dtype) -> int:
    """The bisection steps of `solve_entmax_bisect`: they halve a bracket of width below 1 down to the resolution of
    dtype's mantissa near 1 (where tau lies, in [-1, 0)), a fixed number for every input, so no step reads a value."""
    return round(-math.log2(torch.finfo(dtype).eps)) + 2  # eps = 2^-(mantissa bits)


def solve_entmax_bisect(z: torch.Tensor, alpha: torch.Tensor):
    """alpha-entmax (Peters et al., 2019, Eq. 10), alpha in (1, 2] ([..., 1], one per row): p_j = [(alpha - 1) z_j -
    tau]_+^(1 / (alpha - 1)) with sum_j p_j = 1. With x = (alpha - 1)(z - max z), f(t) = sum_j [x_j - t]_+^q,
    q = 1 / (alpha - 1) >= 1, is convex and decreasing, f(-1) >= 1 (the top key alone gives 1) and f(-n^(1 - alpha))
    <= 1 (no key above 1/n). Bisection keeps the left end lo with f(lo) >= 1 for `bisection_steps` steps, and p at lo
    is normalised to sum to 1, as the entmax package's `ensure_sum_one` does (float32 results are then within about
    4e-7 of the exact ones for alpha down to 1.01, the rounding of p = t^q with q up to 100). Returns p; rows with no allowed key are zeros.
    (NaN and +inf rows are junk, for the caller to fill.)"""
    n = z.shape[-1]
    beta = alpha - 1
    exponent = 1 / beta
    x = (z - _row_max(z)) * beta  # -inf on masked keys
    lo = torch.full_like(beta, -1.0)
    width = 1 - n ** (-beta)  # the bracket [lo, lo + width]
    for _ in range(bisection_steps(z.dtype)):
        width = width * 0.5
        middle = lo + width
        lo = torch.where(row_sum((x - middle).clamp(min=0).pow(exponent)) >= 1, middle, lo)
    p = (x - lo).clamp(min=0).pow(exponent)  # f(lo) >= 1: the top key is in, and the sum is > 0
    return p / row_sum(p).clamp(min=torch.finfo(z.dtype).tiny)


def fill_nonfinite(nonfinite: torch.Tensor, *tensors: torch.Tensor) -> torch.Tensor:
    """Set the rows of the [rows, keys] `tensors` that `nonfinite` ([rows, 1] bool) marks to NaN, as torch.softmax's
    output and gradients are on a row with a NaN or +inf score. A fill over every row, except on the host, where
    reading whether any row is marked is free and usually spares the fills. Returns nonfinite."""
    if reads_values(nonfinite) and not bool(nonfinite.any()):
        return nonfinite
    for tensor in tensors:
        tensor.masked_fill_(nonfinite, float("nan"))
    return nonfinite


# ----------------------------------------------------------------------------------------------------------
# torch.export: the eager solvers branch on the data (which rows settled, which rows are NaN, which solver an input's
# size calls for), which an exported graph cannot hold. Exported, every input is sorted, branch-free.


def solve_for_export(transform: str, z: torch.Tensor, u: torch.Tensor | None):
    """The forward pass of `transform` ("sparsemax", "csoftmax", "csparsemax") as the sort-based solvers alone, for
    every input size: no host sync, no shape that depends on the data, and rows that come out NaN (see the module
    docstring) chosen by `torch.where` rather than by row indices. Same solution as eager, up to rounding. Inputs as
    the autograd Functions take them, solved at their own shape (the solvers work along the last dim; flattening to
    rows would make torch.export guard on symbolic lengths); no written-out backward (autograd differentiates the
    sort if asked)."""
    nonfinite = ~(z.amax(dim=-1, keepdim=True) < float("inf"))
    if transform == "sparsemax":
        zs = z.masked_fill(nonfinite, 0.0)
        zs = zs - _row_max(zs)
        return (zs - _sparsemax_sort(zs)).clamp(min=0).masked_fill(nonfinite, float("nan"))  # Eq. 3
    us = u.clamp(min=0, max=_NON_BINDING_BOUND).masked_fill(z == float("-inf"), 0.0)  # as `clamped_bounds`
    nonfinite = nonfinite | row_sum(us).isnan()
    zs, us = z.masked_fill(nonfinite, 0.0), us.masked_fill(nonfinite, 1.0)
    if transform == "csoftmax":
        alpha = _csoftmax_sort(zs, us)[0]  # Eq. 4
    else:
        alpha = _csparsemax_sort(zs, us)[0]  # Eq. 6
    return alpha.masked_fill(nonfinite, float("nan"))
