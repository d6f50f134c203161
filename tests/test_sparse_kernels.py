"""Exactness of the sparse / constrained attention kernels (Malaviya et al., 2018, Eq. 3-8).

The references below are deliberately naive and independent of the implementation: float64 bisection on the
threshold of a monotone function (no sorting, no breakpoint bookkeeping), run to machine precision.

Every test runs once per solver (see `solver`): the sort-based breakpoint searches, the active-set passes
(with settled rows dropped from the passes even in small inputs), and the passes cut short after one pass, so
that most rows are finished by the sort-based search (the two mixed in one batch). csparsemax also runs through
the fixed passes of `compiled=True`, here without compiling them (tests/test_compile.py compiles them), in full
and cut short after one pass. "branch-free" runs what runs off the CPU: every input sorted, no value read
(tests/test_host_sync.py counts the reads).
"""



import entmax
import numpy as np
import pytest
import torch

from hf_headattn.runtime import sparse_attention, sparse_solvers
from hf_headattn.runtime.sparse_attention import csoftmax, csparsemax, sparsemax

from helpers import random_model, tiny_config
from helpers.nonfinite import NAN, nonfinite_batch


INF = float("inf")
BISECTION_STEPS = 200

_solve_csparsemax = sparse_solvers.solve_csparsemax
# (module, name) -> value: the solvers' settings, and for the fixed passes the autograd Function's solver
_FIXED_PASSES = {
    (sparse_solvers, "_SORT_BELOW"): 0,
    (sparse_attention, "solve_csparsemax"): lambda z, us, compiled: _solve_csparsemax(z, us, compiled=True),
    (sparse_solvers, "torch_compiled"): lambda function: function,
}
SOLVERS = {
    "sort": {(sparse_solvers, "_SORT_BELOW"): float("inf")},
    "passes": {(sparse_solvers, "_SORT_BELOW"): 0, (sparse_solvers, "_COMPACT_FROM"): 0},
    "safeguarded-passes": {(sparse_solvers, "_SORT_BELOW"): 0, (sparse_solvers, "_COMPACT_FROM"): 0,
                           (sparse_solvers, "_NEWTON_PASSES"): 0},
    "one-pass": {(sparse_solvers, "_SORT_BELOW"): 0, (sparse_solvers, "_COMPACT_FROM"): 0,
                 (sparse_solvers, "_NEWTON_PASSES"): 1, (sparse_solvers, "_MAX_PASSES"): 1},
    "fixed": _FIXED_PASSES,
    "fixed-one-pass": {**_FIXED_PASSES, (sparse_solvers, "_COMPILED_PASSES"): 1},
    "branch-free": {(sparse_solvers, "_SORT_BELOW"): 0, (sparse_solvers, "HOST_DEVICES"): ()},
}


@pytest.fixture(autouse=True, params=list(SOLVERS))
def solver(request, monkeypatch):
    for (module, name), value in SOLVERS[request.param].items():
        monkeypatch.setattr(module, name, value)
    return request.param


# ----------------------------------------------------------------------------------------------------------
# Independent float64 references (rows along the last axis of 2-D arrays).


def _as_rows(z, u, allowed):
    z = np.asarray(z, dtype=np.float64)
    u = np.broadcast_to(np.asarray(u, dtype=np.float64), z.shape)
    allowed = np.broadcast_to(np.asarray(allowed, dtype=bool), z.shape) & (z != -np.inf)
    shape = z.shape
    z, u, allowed = (x.reshape(-1, shape[-1]) for x in (z, u, allowed))
    return z, np.where(allowed, np.maximum(u, 0.0), 0.0), allowed, shape


def reference_csparsemax(z, u=INF, allowed=True):
    """alpha_j = clip(z_j - tau, 0, u_j) with tau found by bisection on sum_j clip(z_j - tau, 0, u_j) = 1
    (non-increasing in tau). Rows with sum(u) < 1 (infeasible): alpha = u, the documented convention."""
    z, u, allowed, shape = _as_rows(z, u, allowed)
    zz = np.where(allowed, z, 0.0)
    big = np.where(allowed, zz, -np.inf)
    hi = np.max(big, axis=1)  # f(hi) = 0
    lo = np.min(np.where(allowed, zz - np.minimum(u, 1.0), np.inf), axis=1) - 1.0  # f(lo) >= min(1, sum u)
    hi = np.where(np.isfinite(hi), hi, 0.0)
    lo = np.where(np.isfinite(lo), lo, -1.0)
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        f = np.where(allowed, np.clip(zz - mid[:, None], 0.0, u), 0.0).sum(axis=1)
        hi = np.where(f < 1.0, mid, hi)
        lo = np.where(f < 1.0, lo, mid)
    tau = 0.5 * (lo + hi)
    alpha = np.where(allowed, np.clip(zz - tau[:, None], 0.0, u), 0.0)
    infeasible = u.sum(axis=1) < 1.0
    alpha[infeasible] = u[infeasible]
    return alpha.reshape(shape), tau


def reference_sparsemax(z, allowed=True):
    return reference_csparsemax(z, INF, allowed)[0]


def reference_csoftmax(z, u=INF, allowed=True):
    """alpha_j = min(u_j, exp(z_j - t)) with t found by bisection on sum_j min(u_j, exp(z_j - t)) = 1
    (decreasing in t). Rows with sum(u) < 1 (infeasible): alpha = u."""
    z, u, allowed, shape = _as_rows(z, u, allowed)
    zmax = np.max(np.where(allowed, z, -np.inf), axis=1, keepdims=True)
    zmax = np.where(np.isfinite(zmax), zmax, 0.0)
    zz = np.where(allowed, z - zmax, -np.inf)
    n = allowed.sum(axis=1)
    hi = np.log(np.maximum(n, 1)) + 1.0  # sum exp(zz - hi) <= n e^{-hi} < 1
    with np.errstate(divide="ignore", invalid="ignore"):
        lo = np.min(np.where(allowed & (u > 0), zz - np.log(np.minimum(u, 1.0)), np.inf), axis=1) - 1.0
    lo = np.where(np.isfinite(lo), lo, -1.0)
    for _ in range(BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        f = np.where(allowed, np.minimum(u, np.exp(zz - mid[:, None])), 0.0).sum(axis=1)
        lo = np.where(f > 1.0, mid, lo)
        hi = np.where(f > 1.0, hi, mid)
    t = 0.5 * (lo + hi)
    alpha = np.where(allowed, np.minimum(u, np.exp(zz - t[:, None])), 0.0)
    infeasible = u.sum(axis=1) < 1.0
    alpha[infeasible] = u[infeasible]
    return alpha.reshape(shape)


# ----------------------------------------------------------------------------------------------------------
# Random inputs covering ties, binding bounds, zero and infinite bounds, masks, infeasible rows.


def random_case(rows, n, seed, ties=False, mask_rate=0.2):
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, 1.5, size=(rows, n))
    if ties:
        z = np.round(z * 2) / 2  # many exact ties
    kind = rng.integers(0, 4, size=(rows, 1))
    u = np.select(
        [kind == 0, kind == 1, kind == 2],
        [rng.uniform(0, 2.5 / n, size=(rows, n)),  # bounds bind, sometimes infeasible
         rng.uniform(0, 1.0, size=(rows, n)),
         np.round(rng.uniform(0, 3.0 / n, size=(rows, n)) * 4) / 4 * (n / 3)],  # tied bounds, some zero
        default=np.full((rows, n), 0.6),
    )
    u = np.where(rng.random((rows, n)) < 0.1, np.inf, u)  # unbounded (sink-like) keys
    u = np.where(rng.random((rows, n)) < 0.05, 0.0, u)
    mask = rng.random((rows, n)) >= mask_rate
    neg_inf = rng.random((rows, n)) < 0.1
    z = np.where(neg_inf, -np.inf, z)
    mask[: max(1, rows // 10)] = False  # all-masked rows
    return z, u, mask


CASES = [(64, 1, 0), (64, 2, 1), (128, 3, 2), (128, 5, 3), (200, 8, 4), (200, 25, 5), (100, 50, 6)]


@pytest.mark.parametrize("rows,n,seed", CASES)
@pytest.mark.parametrize("ties", [False, True])
def test_forward_matches_reference_float64(rows, n, seed, ties):
    z, u, mask = random_case(rows, n, seed, ties=ties)
    zt, ut, mt = torch.tensor(z), torch.tensor(u), torch.tensor(mask)
    np.testing.assert_allclose(sparsemax(zt, mask=mt).numpy(), reference_sparsemax(z, mask), atol=1e-9, rtol=0)
    np.testing.assert_allclose(
        csparsemax(zt, ut, mask=mt).numpy(), reference_csparsemax(z, u, mask)[0], atol=1e-9, rtol=0
    )
    np.testing.assert_allclose(csoftmax(zt, ut, mask=mt).numpy(), reference_csoftmax(z, u, mask), atol=1e-9, rtol=0)


@pytest.mark.parametrize("rows,n,seed", CASES)
def test_forward_matches_reference_float32(rows, n, seed):
    z, u, mask = random_case(rows, n, seed + 100, ties=seed % 2 == 0)
    z32, u32 = z.astype(np.float32), u.astype(np.float32)
    zt, ut, mt = torch.tensor(z32), torch.tensor(u32), torch.tensor(mask)
    for got, want in [
        (sparsemax(zt, mask=mt), reference_sparsemax(z32, mask)),
        (csparsemax(zt, ut, mask=mt), reference_csparsemax(z32, u32, mask)[0]),
        (csoftmax(zt, ut, mask=mt), reference_csoftmax(z32, u32, mask)),
    ]:
        assert got.dtype == torch.float32
        np.testing.assert_allclose(got.numpy(), want, atol=1e-6, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype):
    z, u, mask = random_case(300, 12, 7)
    zt, ut, mt = torch.tensor(z).to(dtype), torch.tensor(u).to(dtype), torch.tensor(mask)
    z_rounded, u_rounded = zt.double().numpy(), ut.double().numpy()
    for got, want in [
        (sparsemax(zt, mask=mt), reference_sparsemax(z_rounded, mask)),
        (csparsemax(zt, ut, mask=mt), reference_csparsemax(z_rounded, u_rounded, mask)[0]),
        (csoftmax(zt, ut, mask=mt), reference_csoftmax(z_rounded, u_rounded, mask)),
    ]:
        assert got.dtype == dtype
        # Only the final rounding to half precision separates the two: one ulp of a value <= 1 (half an ulp
        # for the rounding, plus float32 error where the exact value sits on a rounding midpoint).
        tol = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-10
        np.testing.assert_allclose(got.double().numpy(), want, atol=tol, rtol=0)


def test_solution_properties():
    z, u, mask = random_case(500, 20, 8, ties=True)
    zt, ut, mt = torch.tensor(z), torch.tensor(u), torch.tensor(mask)
    allowed = mt & torch.isfinite(zt)
    u_allowed = torch.where(allowed, ut, 0.0)
    feasible = u_allowed.sum(-1) >= 1
    assert (~feasible).any() and feasible.any()
    for alpha in (csoftmax(zt, ut, mask=mt), csparsemax(zt, ut, mask=mt)):
        assert torch.isfinite(alpha).all()
        assert (alpha[~allowed] == 0).all()
        assert (alpha >= 0).all() and (alpha <= ut + 1e-12).all()
        torch.testing.assert_close(alpha[feasible].sum(-1), torch.ones(int(feasible.sum()), dtype=torch.float64))
        # Infeasible rows (the bounds sum to < 1, all-masked rows included): every allowed key at its bound.
        torch.testing.assert_close(alpha[~feasible], u_allowed[~feasible], rtol=0, atol=0)
    sm = sparsemax(zt, mask=mt)
    has_key = allowed.any(-1)
    torch.testing.assert_close(sm[has_key].sum(-1), torch.ones(int(has_key.sum()), dtype=torch.float64))
    assert (sm[~has_key] == 0).all()


def test_unbounded_reduces_to_sparsemax_and_softmax():
    torch.manual_seed(0)
    z = torch.randn(50, 4, 17, dtype=torch.float64) * 2
    mask = torch.rand(50, 4, 17) > 0.3
    mask[..., 0] = True
    inf = torch.full_like(z, INF)
    torch.testing.assert_close(csparsemax(z, inf), sparsemax(z), rtol=0, atol=1e-12)
    torch.testing.assert_close(csoftmax(z, inf), torch.softmax(z, -1), rtol=0, atol=1e-12)
    torch.testing.assert_close(csparsemax(z, inf, mask=mask), sparsemax(z, mask=mask), rtol=0, atol=1e-12)
    torch.testing.assert_close(
        csoftmax(z, INF, mask=mask), torch.softmax(z.masked_fill(~mask, -INF), -1), rtol=0, atol=1e-12
    )
    # Bounds >= 1 never bind either.
    torch.testing.assert_close(csparsemax(z, 1.0), sparsemax(z), rtol=0, atol=1e-12)
    torch.testing.assert_close(csoftmax(z, 1.0), torch.softmax(z, -1), rtol=0, atol=1e-12)


def test_mask_and_minus_inf_are_equivalent():
    z, u, mask = random_case(100, 9, 9, mask_rate=0.3)
    z = np.where(np.isinf(z), 0.3, z)
    zt, ut, mt = torch.tensor(z), torch.tensor(u), torch.tensor(mask)
    z_inf = zt.masked_fill(~mt, -INF)
    torch.testing.assert_close(sparsemax(zt, mask=mt), sparsemax(z_inf), rtol=0, atol=0)
    torch.testing.assert_close(csparsemax(zt, ut, mask=mt), csparsemax(z_inf, ut), rtol=0, atol=0)
    torch.testing.assert_close(csoftmax(zt, ut, mask=mt), csoftmax(z_inf, ut), rtol=0, atol=0)


def test_any_dim_and_broadcasting():
    torch.manual_seed(1)
    z = torch.randn(3, 7, 5, 4, dtype=torch.float64)
    u = torch.rand(3, 7, 1, 4, dtype=torch.float64) * 0.6  # broadcast over dim 2
    mask = torch.rand(1, 7, 5, 1) > 0.2  # broadcast over dims 0 and 3
    for dim in range(-4, 4):
        zt, ut, mt = z.movedim(dim, -1), u.movedim(dim, -1), mask.movedim(dim, -1)
        zt, ut = torch.broadcast_tensors(zt, ut)
        mt = mt.expand(zt.shape)
        for fn, ref in [(csparsemax, lambda *a: reference_csparsemax(*a)[0]), (csoftmax, reference_csoftmax)]:
            got = fn(z, u, dim=dim, mask=mask)
            assert got.shape == z.shape
            want = torch.tensor(ref(zt.numpy(), ut.numpy(), mt.numpy())).movedim(-1, dim)
            torch.testing.assert_close(got, want, rtol=0, atol=1e-9)
        want = torch.tensor(reference_sparsemax(zt.numpy(), mt.numpy())).movedim(-1, dim)
        torch.testing.assert_close(sparsemax(z, dim=dim, mask=mask), want, rtol=0, atol=1e-9)
    # The gradient of a broadcast bound is reduced back to its shape.
    zg, ug = z.clone().requires_grad_(), u.clone().requires_grad_()
    csparsemax(zg, ug, dim=-1).pow(2).sum().backward()
    assert ug.grad.shape == u.shape and zg.grad.shape == z.shape


def test_ties_and_binding_bounds_hand_cases():
    d = dict(dtype=torch.float64)
    # All scores tied, bounds bind on two keys.
    z = torch.zeros(1, 4, **d)
    u = torch.tensor([[0.1, 0.1, 1.0, 1.0]], **d)
    torch.testing.assert_close(csparsemax(z, u), torch.tensor([[0.1, 0.1, 0.4, 0.4]], **d))
    torch.testing.assert_close(csoftmax(z, u), torch.tensor([[0.1, 0.1, 0.4, 0.4]], **d))
    # Bounds summing to exactly 1: the only feasible point is alpha = u.
    u = torch.tensor([[0.25, 0.25, 0.5, 0.0]], **d)
    z = torch.tensor([[3.0, -1.0, 0.0, 5.0]], **d)
    torch.testing.assert_close(csparsemax(z, u), u)
    torch.testing.assert_close(csoftmax(z, u), u)
    # Zero bounds exclude a key; negative bounds (rounding in f - beta) act as zero.
    u = torch.tensor([[0.0, -1e-9, 1.0, 1.0]], **d)
    z = torch.tensor([[9.0, 9.0, 0.5, 0.0]], **d)
    torch.testing.assert_close(csparsemax(z, u), torch.tensor([[0.0, 0.0, 0.75, 0.25]], **d))
    e = torch.exp(torch.tensor([0.5, 0.0], **d))
    torch.testing.assert_close(csoftmax(z, u)[0, 2:], e / e.sum())
    # One-hot attention with unit bound: the bound is reached but not binding.
    z = torch.tensor([[5.0, 0.0, 0.0]], **d)
    torch.testing.assert_close(csparsemax(z, torch.ones_like(z)), torch.tensor([[1.0, 0.0, 0.0]], **d))


def test_large_finite_negative_scores_are_ordinary_keys():
    # HF-style finfo.min padding is not a mask: finite, never NaN, and zero unless the bounds force mass there.
    z = torch.tensor([[0.0, 1.0, torch.finfo(torch.float32).min]])
    u = torch.tensor([[1.0, 1.0, 1.0]])
    for fn in (csparsemax, csoftmax):
        alpha = fn(z, u)
        assert torch.isfinite(alpha).all() and alpha[0, 2] == 0
    assert torch.isfinite(sparsemax(z)).all()


def decoding_case(rows, n, seed, dtype=torch.float64, ties=True):
    """Attention-like rows: scores ~ N(0, 2^2); bounds f - beta mid-decoding (f in {1, 2, 3}, one key in five
    exhausted, u = 0); a <SINK> key with u = inf in most rows (the others may be infeasible); some keys masked,
    some scores -inf, some exact ties; enough entries for the active-set passes."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, n, generator=generator, dtype=dtype) * 2
    if ties:
        z[: rows // 8] = torch.round(z[: rows // 8] * 2) / 2
    fertility = torch.randint(1, 4, (rows, n), generator=generator).to(dtype)
    u = fertility * (1 - (torch.rand(rows, n, generator=generator, dtype=dtype) * 1.25).clamp(max=1))
    u[torch.rand(rows, generator=generator) < 0.9, -1] = INF
    mask = torch.rand(rows, n, generator=generator) > 0.1
    z[torch.rand(rows, n, generator=generator) < 0.05] = -INF
    return z, u, mask


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_decoding_batches_match_reference(dtype):
    z, u, mask = decoding_case(600, 47, seed=11, dtype=dtype)
    tol = 1e-9 if dtype == torch.float64 else 1e-6
    z64, u64, m = z.double().numpy(), u.double().numpy(), mask.numpy()
    np.testing.assert_allclose(sparsemax(z, mask=mask).double().numpy(), reference_sparsemax(z64, m), atol=tol, rtol=0)
    np.testing.assert_allclose(
        csparsemax(z, u, mask=mask).double().numpy(), reference_csparsemax(z64, u64, m)[0], atol=tol, rtol=0
    )
    np.testing.assert_allclose(
        csoftmax(z, u, mask=mask).double().numpy(), reference_csoftmax(z64, u64, m), atol=tol, rtol=0
    )


def test_solvers_agree_on_gradients(monkeypatch):
    # Away from breakpoints (no ties) every solver finds the same partition, hence the same gradients.
    z, u, mask = decoding_case(500, 40, seed=12, ties=False)
    g = torch.randn(z.shape, dtype=z.dtype, generator=torch.Generator().manual_seed(0))

    def gradients():
        out = {}
        for name, fn in [("sparsemax", lambda a, b: sparsemax(a, mask=mask)),
                         ("csoftmax", lambda a, b: csoftmax(a, b, mask=mask)),
                         ("csparsemax", lambda a, b: csparsemax(a, b, mask=mask))]:
            a, b = z.clone().requires_grad_(), u.clone().requires_grad_()
            alpha = fn(a, b)
            out[name] = (alpha.detach(), *torch.autograd.grad(alpha, [a, b], g, allow_unused=True))
        return out

    ours = gradients()
    monkeypatch.setattr(sparse_solvers, "_SORT_BELOW", float("inf"))
    sort = gradients()
    for name in ours:
        for got, want in zip(ours[name], sort[name]):
            if want is None:
                assert got is None
            else:
                torch.testing.assert_close(got, want, rtol=0, atol=1e-9)


def test_passes_settle_attention_rows(solver, monkeypatch):
    # The active-set passes (not the sort-based search they fall back on) solve attention-like rows.
    if solver not in ("passes", "fixed"):
        pytest.skip("checks the passes")
    sorted_rows = []
    for name in ("_sparsemax_sort", "_csoftmax_sort", "_csparsemax_sort"):
        original = getattr(sparse_solvers, name)

        def counting(*args, original=original):
            sorted_rows.append(args[0].shape[0])
            return original(*args)

        monkeypatch.setattr(sparse_solvers, name, counting)
    generator = torch.Generator().manual_seed(13)
    z = torch.randn(2000, 64, generator=generator) * 2
    u = (torch.randint(1, 4, z.shape, generator=generator) * (1 - torch.rand(z.shape, generator=generator)))
    u[:, -1] = INF
    sparsemax(z), csoftmax(z, u), csparsemax(z, u)
    assert sorted_rows == []


def test_csparsemax_rows_the_plain_newton_passes_leave_go_on_with_the_safeguarded_passes(solver, monkeypatch):
    # The first row is a flat stretch: from t = max - 1 no key is free (the top key is capped, the next has a zero
    # bound), so each plain Newton step moves t by f(t) - 1 = -0.1 and ~60 would be needed; the safeguarded passes
    # jump to the next breakpoint. The second row settles in the plain passes.
    if solver != "passes":
        pytest.skip("checks the passes")
    handed_over = []
    original = sparse_solvers._csparsemax_safeguarded_solve
    monkeypatch.setattr(sparse_solvers, "_csparsemax_safeguarded_solve",
                        lambda z, us: handed_over.append(z.shape[0]) or original(z, us))
    z = torch.tensor([[-3.0, -0.5, 4.0], [1.0, 0.0, -1.0]], dtype=torch.float64)
    u = torch.tensor([[0.5, 0.0, 0.9], [INF, INF, INF]], dtype=torch.float64)
    alpha = csparsemax(z, u)
    assert handed_over == [1]
    expected = torch.tensor([[0.1, 0.0, 0.9], [1.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(alpha, expected, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------------------------------------
# Gradients.


def test_sparsemax_matches_entmax_forward_and_backward():
    torch.manual_seed(2)
    for shape, dim in [((300, 10), -1), ((4, 6, 25), 1), ((50, 50), 0)]:
        z = (torch.randn(*shape, dtype=torch.float64) * 2).requires_grad_()
        z2 = z.detach().clone().requires_grad_()
        g = torch.randn(*shape, dtype=torch.float64)
        ours, theirs = sparsemax(z, dim=dim), entmax.sparsemax(z2, dim=dim)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
        (ours * g).sum().backward()
        (theirs * g).sum().backward()
        torch.testing.assert_close(z.grad, z2.grad, rtol=0, atol=1e-12)
    z = torch.randn(1000, 30)
    torch.testing.assert_close(sparsemax(z), entmax.sparsemax(z), rtol=0, atol=1e-6)


def _breakpoint_gaps(kind, z, u):
    """Distance of each key of one row from its breakpoints (tau or the cap), in the solution's own scale."""
    if kind == "csoftmax":
        alpha = reference_csoftmax(z[None], u[None])[0]
        free = np.flatnonzero(alpha < u - 1e-9)
        if free.size == 0:
            return np.zeros(1), False
        unconstrained = np.exp(z - z[free[0]]) * alpha[free[0]]  # exp(z_j - t), from a free key
        return np.abs(np.log(unconstrained) - np.log(u)), bool((unconstrained > u).any())
    _, tau = reference_csparsemax(z[None], u[None])
    x = z - tau[0]
    return np.concatenate([np.abs(x), np.abs(x - u)]), bool((x > u).any())


def _differentiable_case(kind, rows, n, seed, margin=1e-3, shared_u=False):
    """z, u, mask with feasible rows, a binding bound in every row with two or more keys, and every allowed key
    at least `margin` away from its breakpoints (finite differences with eps = 1e-6 never cross one). Row 0
    is all-masked; some keys are masked via `mask`, some via -inf scores, some bounds are +inf. With
    `shared_u`, every row has the same bounds and nothing is masked."""
    rng = np.random.default_rng(seed)
    mask = rng.random((rows, n)) > 0.15
    minus_inf = rng.random((rows, n)) < 0.1
    mask[0] = False
    shared = None
    if shared_u:
        mask[:] = True
        minus_inf[:] = False
        shared = np.where(rng.random(n) < 0.15, np.inf, rng.uniform(0.05, 0.6, size=n))
        if shared.sum() < 1.1:
            shared = shared * (1.1 / shared.sum()) + 0.01
    z = np.zeros((rows, n))
    u = np.ones((rows, n))
    for i in range(rows):
        allowed = mask[i] & ~minus_inf[i]
        unbounded = rng.random(n) < 0.15
        for _ in range(1000):
            zi = rng.normal(0.0, 1.0, size=n)
            ui = np.where(unbounded, np.inf, rng.uniform(0.05, 0.6, size=n)) if shared is None else shared
            a = allowed
            if a.sum() == 0:
                break
            if ui[a].sum() < 1.1:  # keep the row feasible, away from sum(u) = 1
                ui = np.where(a, ui * (1.1 / ui[a].sum()) + 0.01, ui)
            gaps, binding = _breakpoint_gaps(kind, zi[a], ui[a])
            if gaps.min() > margin and (binding or a.sum() == 1):
                break
        else:
            raise AssertionError("no differentiable case found")
        z[i] = np.where(minus_inf[i], -np.inf, zi)
        u[i] = ui
    return torch.tensor(z), torch.tensor(u), torch.tensor(mask)


@pytest.mark.parametrize("kind", ["csparsemax", "csoftmax"])
@pytest.mark.parametrize("n", [1, 4, 9])
def test_gradcheck_constrained(kind, n):
    fn = csparsemax if kind == "csparsemax" else csoftmax
    z, u, mask = _differentiable_case(kind, 6, n, seed=n)
    z.requires_grad_()
    u.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, mask=mask), (z, u), eps=1e-6, atol=1e-6)
    # The same problems along dim 0.
    z_t = z.detach().t().contiguous().requires_grad_()
    u_t = u.detach().t().contiguous().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b, dim=0, mask=mask.t()), (z_t, u_t), eps=1e-6, atol=1e-6)
    # One bound vector broadcast over every row (its gradient is summed over the rows).
    z, u, _ = _differentiable_case(kind, 5, n, seed=10 + n, shared_u=True)
    z.requires_grad_()
    u = u[:1].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: fn(a, b), (z, u), eps=1e-6, atol=1e-6)


def test_gradcheck_sparsemax():
    rng = np.random.default_rng(3)
    mask = rng.random((8, 7)) > 0.2
    mask[1] = False
    z = rng.normal(0.0, 1.0, size=(8, 7))
    z[0, 3] = -np.inf
    for i in range(8):  # keep finite differences from crossing the support boundary
        while True:
            _, tau = reference_csparsemax(z[i : i + 1], INF, mask[i : i + 1])
            if np.abs(z[i][mask[i] & np.isfinite(z[i])] - tau[0]).min(initial=1.0) > 1e-3:
                break
            z[i] = np.where(np.isfinite(z[i]), rng.normal(0.0, 1.0, size=7), z[i])
    zt = torch.tensor(z, requires_grad=True)
    mt = torch.tensor(mask)
    assert torch.autograd.gradcheck(lambda a: sparsemax(a, mask=mt), (zt,), eps=1e-6, atol=1e-6)


def test_backward_formulas_explicitly():
    d = dict(dtype=torch.float64)
    g = torch.tensor([[0.3, -1.0, 2.0, 0.5]], **d)
    # csparsemax: z - tau = (0.6, 0.25, 0.15, -0.05) with tau = 0.2, so A = {1, 2}, A_R = {0}, A_L = {3}.
    z = torch.tensor([[0.8, 0.45, 0.35, 0.15]], **d, requires_grad=True)
    u = torch.tensor([[0.6, 0.9, 0.9, 0.9]], **d, requires_grad=True)
    alpha = csparsemax(z, u)
    torch.testing.assert_close(alpha.detach(), torch.tensor([[0.6, 0.25, 0.15, 0.0]], **d))
    alpha.backward(g)
    m = (-1.0 + 2.0) / 2
    torch.testing.assert_close(z.grad, torch.tensor([[0.0, -1.0 - m, 2.0 - m, 0.0]], **d))  # Eq. 7
    torch.testing.assert_close(u.grad, torch.tensor([[0.3 - m, 0.0, 0.0, 0.0]], **d))  # Eq. 8
    # csoftmax: key 0 capped at 0.5; the rest share 0.5 in proportion to exp(z).
    z = torch.tensor([[3.0, 0.0, 1.0, -0.5]], **d, requires_grad=True)
    u = torch.tensor([[0.5, 1.0, 1.0, 1.0]], **d, requires_grad=True)
    alpha = csoftmax(z, u)
    e = torch.exp(z.detach()[0, 1:])
    free = 0.5 * e / e.sum()
    torch.testing.assert_close(alpha.detach()[0], torch.cat([torch.tensor([0.5], **d), free]))
    alpha.backward(g)
    m = (free * g[0, 1:]).sum() / free.sum()
    torch.testing.assert_close(z.grad[0], torch.cat([torch.zeros(1, **d), free * (g[0, 1:] - m)]))
    torch.testing.assert_close(u.grad[0], torch.cat([(g[0, :1] - m), torch.zeros(3, **d)]))


def test_one_hot_under_unit_bound_gets_the_sparsemax_gradient():
    # alpha_0 = u_0 = 1: the bound is reached but does not bind; the documented one-sided derivative is the
    # unconstrained one (no gradient to u), and the same when a sink key is present.
    d = dict(dtype=torch.float64)
    for z_row, u_row in [([5.0, 0.0, 0.0], [1.0, 1.0, 1.0]), ([5.0, 0.0, 0.0, -1.0], [1.0, 1.0, 1.0, INF])]:
        z = torch.tensor([z_row], **d, requires_grad=True)
        u = torch.tensor([u_row], **d, requires_grad=True)
        g = torch.randn(z.shape, **d)
        alpha = csparsemax(z, u)
        torch.testing.assert_close(alpha.detach(), torch.tensor([[1.0] + [0.0] * (len(z_row) - 1)], **d))
        alpha.backward(g)
        z2 = z.detach().clone().requires_grad_()
        sparsemax(z2).backward(g)
        torch.testing.assert_close(z.grad, z2.grad)
        assert (u.grad == 0).all()


@pytest.mark.parametrize("fn", [csparsemax, csoftmax])
def test_infeasible_and_masked_gradients(fn):
    d = dict(dtype=torch.float64)
    z = torch.tensor([[0.5, -0.5, 0.0, -INF], [1.0, 2.0, 3.0, 4.0], [-INF] * 4], **d, requires_grad=True)
    u = torch.tensor([[0.2, 0.3, 0.4, 5.0], [0.5, 0.5, 0.5, 0.5], [1.0] * 4], **d, requires_grad=True)
    mask = torch.tensor([[True] * 4, [True, False, True, True], [True] * 4])
    alpha = fn(z, u, mask=mask)
    # Row 0: the allowed bounds sum to 0.9 < 1 -> alpha = u there; row 2 is all-masked -> zeros.
    torch.testing.assert_close(alpha[0], torch.tensor([0.2, 0.3, 0.4, 0.0], **d))
    torch.testing.assert_close(alpha[2], torch.zeros(4, **d))
    g = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, -1.0, 0.5, 2.0], [1.0, 1.0, 1.0, 1.0]], **d)
    alpha.backward(g)
    assert torch.isfinite(z.grad).all() and torch.isfinite(u.grad).all()
    torch.testing.assert_close(z.grad[0], torch.zeros(4, **d))  # alpha = u: independent of z
    torch.testing.assert_close(u.grad[0], torch.tensor([1.0, 2.0, 3.0, 0.0], **d))  # du = dalpha, 0 if masked
    assert z.grad[1, 1] == 0 and u.grad[1, 1] == 0  # masked via mask
    assert (z.grad[2] == 0).all() and (u.grad[2] == 0).all()


def test_sparsemax_all_masked_row_has_zero_gradient():
    z = torch.tensor([[-INF, -INF], [0.0, 1.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [False, False]])
    alpha = sparsemax(z, mask=mask)
    assert (alpha == 0).all()
    alpha.sum().backward()
    assert (z.grad == 0).all()


# ----------------------------------------------------------------------------------------------------------
# The paper's Figure 1 toy example: three rounds, unit fertilities, u_t = f - beta_{t-1} (Eq. 5).

FIGURE1_SCORES = [[1.2, 0.8, -0.2], [0.7, 0.9, 0.1], [-0.2, 0.2, 0.9]]

# Values of the independent float64 references above (see test_figure1_reference_values), to 1e-4.
FIGURE1_EXPECTED = {
    "csoftmax": [
        [0.521671, 0.349687, 0.128642],
        [0.360983, 0.440905, 0.198112],
        [0.117346, 0.209408, 0.673246],  # = u_3: the bounds left after two rounds sum to exactly 1
    ],
    "csparsemax": [
        [0.7, 0.3, 0.0],
        [0.3, 0.7, 0.0],  # both bounds bind (u_2 = (0.3, 0.7, 1)): the sparsemax answer would be (0.4, 0.6, 0)
        [0.0, 0.0, 1.0],
    ],
}
# The unconstrained transformations of the same scores, for contrast (they overspend some word's fertility).
FIGURE1_UNCONSTRAINED = {
    "softmax": [[0.521671, 0.349687, 0.128642], [0.360983, 0.440905, 0.198112], [0.181951, 0.271439, 0.546610]],
    "sparsemax": [[0.7, 0.3, 0.0], [0.4, 0.6, 0.0], [0.0, 0.15, 0.85]],
}


def _figure1_rounds(transform, dtype=torch.float64):
    fertility = torch.ones(3, dtype=dtype)
    beta = torch.zeros(3, dtype=dtype)
    rounds = []
    for scores in FIGURE1_SCORES:
        u = fertility - beta
        alpha = transform(torch.tensor([scores], dtype=dtype), u[None])[0]
        rounds.append((alpha, u))
        beta = beta + alpha
    return rounds


def _figure1_reference(name):
    ref = reference_csoftmax if name == "csoftmax" else (lambda z, u: reference_csparsemax(z, u)[0])
    beta = np.zeros(3)
    out = []
    for scores in FIGURE1_SCORES:
        alpha = ref(np.array([scores]), (1.0 - beta)[None])[0]
        out.append(alpha)
        beta = beta + alpha
    return np.array(out)


@pytest.mark.parametrize("name", ["csoftmax", "csparsemax"])
def test_figure1_reference_values(name):
    reference = _figure1_reference(name)
    print(name, np.array2string(reference, precision=5))
    np.testing.assert_allclose(reference, FIGURE1_EXPECTED[name], atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["csoftmax", "csparsemax"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_figure1_toy_example(name, dtype):
    transform = csoftmax if name == "csoftmax" else csparsemax
    rounds = _figure1_rounds(transform, dtype)
    cumulative = torch.zeros(3, dtype=dtype)
    for alpha, u in rounds:
        assert abs(alpha.sum().item() - 1) < 1e-6  # attention sums to one each round
        assert (alpha >= 0).all() and (alpha <= u + 1e-6).all()  # 0 <= alpha <= u
        cumulative = cumulative + alpha
        assert (cumulative <= 1 + 1e-6).all()  # each word's fertility is never exceeded
    got = torch.stack([alpha for alpha, _ in rounds]).double().numpy()
    np.testing.assert_allclose(got, FIGURE1_EXPECTED[name], atol=1e-4, rtol=0)
    np.testing.assert_allclose(got, _figure1_reference(name), atol=1e-6, rtol=0)
    # After three rounds every word has used exactly its unit fertility (last row of Figure 1).
    np.testing.assert_allclose(cumulative.double().numpy(), np.ones(3), atol=1e-6)
    if name == "csparsemax":
        # Sparse over words at each round, unlike csoftmax.
        assert (got < 1e-6).sum() == 4  # (float32 rounding at the tie in round 2 may leave ~1e-7)


def test_figure1_unconstrained_contrast():
    z = torch.tensor(FIGURE1_SCORES, dtype=torch.float64)
    for name, fn in [("softmax", lambda x: torch.softmax(x, -1)), ("sparsemax", sparsemax)]:
        got = fn(z).numpy()
        np.testing.assert_allclose(got, FIGURE1_UNCONSTRAINED[name], atol=1e-4, rtol=0)
        assert got.sum(axis=0).max() > 1.04  # some word receives more than its unit fertility


def test_fertility_loop_with_sink_never_exceeds_fertility():
    # Beam-search-like decoding: 30 steps over 6 words with fertility 2 plus an unbounded <SINK>.
    torch.manual_seed(4)
    batch, words, steps = 16, 6, 30
    fertility = torch.cat([torch.full((batch, words), 2.0), torch.full((batch, 1), INF)], dim=1)
    for transform in (csoftmax, csparsemax):
        beta = torch.zeros(batch, words + 1)
        for _ in range(steps):
            z = torch.randn(batch, words + 1) * 2
            alpha = transform(z + 0.2 * (fertility - beta).clamp(max=2), fertility - beta)  # exhaustion scores, c = 0.2
            torch.testing.assert_close(alpha.sum(-1), torch.ones(batch))
            beta = beta + alpha
            assert (beta[:, :words] <= 2 + 1e-5).all()


@pytest.mark.parametrize("dtype,gap", [(torch.float32, 100.0), (torch.float64, 800.0)])
def test_csoftmax_wide_score_range(dtype, gap):
    # exp(z - max z) underflows for the low keys, yet they must share the mass the capped key cannot take.
    z = torch.tensor([[0.0, -gap, -gap, -gap], [0.0, -gap, -gap - 1.0, -INF]], dtype=dtype)
    u = torch.tensor([[0.4, 1.0, 1.0, 1.0], [0.4, 1.0, 1.0, 1.0]], dtype=dtype)
    e = np.exp([0.0, -1.0])
    expected = torch.tensor([[0.4, 0.2, 0.2, 0.2], [0.4, *(0.6 * e / e.sum()), 0.0]], dtype=dtype)
    torch.testing.assert_close(csoftmax(z, u), expected)
    # A finfo.min score is an ordinary key: it gets the mass the bounds leave over.
    z = torch.tensor([[0.0, 1.0, torch.finfo(dtype).min]], dtype=dtype)
    u = torch.tensor([[0.3, 0.3, 1.0]], dtype=dtype)
    torch.testing.assert_close(csoftmax(z, u), torch.tensor([[0.3, 0.3, 0.4]], dtype=dtype))
    # csparsemax cannot do this in floating point: finfo.min - u rounds to finfo.min, so that key's box has zero
    # width. The result stays finite and within the bounds (documented: mask such keys instead).
    alpha = csparsemax(z, u)
    assert torch.isfinite(alpha).all() and (alpha >= 0).all() and (alpha <= u).all()


def test_compiled_csparsemax_explains_a_failed_compile(solver, monkeypatch):
    if solver == "branch-free":
        pytest.skip("off the CPU compiled=True sorts too: nothing is compiled")
    def failing_compile(function):
        def run(*args):
            raise torch._dynamo.exc.BackendCompilerFailed(function, RuntimeError("No working C++ compiler"), None)
        return run

    monkeypatch.setattr(sparse_solvers, "_SORT_BELOW", 0)
    monkeypatch.setattr(sparse_solvers, "torch_compiled", failing_compile)
    with pytest.raises(RuntimeError, match="compiled=False for the eager solver") as raised:
        csparsemax(torch.randn(4, 5), torch.ones(4, 5), compiled=True)
    assert "No working C++ compiler" in str(raised.value.__cause__)


# ----------------------------------------------------------------------------------------------------------
# NaN and +inf propagate as through torch.softmax (issue 17): a row with a NaN or +inf score on an allowed key is
# NaN, output and gradients; masked keys are ignored whatever their score; other rows are untouched.

KERNELS = {
    "sparsemax": lambda z, u, **kw: sparsemax(z, **kw),
    "csoftmax": csoftmax,
    "csparsemax": csparsemax,
}


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_nan_and_inf_rows_propagate_like_softmax(name, dtype):
    z, mask, nan_rows, all_masked = nonfinite_batch(dtype)
    bounds = torch.tensor([0.6, 0.3, 0.3, 0.5, INF], dtype=dtype)  # binding, unbounded key last: feasible
    fn = KERNELS[name]
    z = z.requires_grad_()
    u = bounds.clone().requires_grad_()
    alpha = fn(z, u, mask=mask)
    assert alpha.dtype == dtype
    assert alpha[nan_rows].isnan().all()
    assert not alpha[~nan_rows].isnan().any()
    assert (alpha[~nan_rows] >= 0).all() and (alpha[all_masked] == 0).all()
    finite = ~nan_rows & ~all_masked
    allowed = mask & (z != -INF)
    assert (alpha.detach()[~nan_rows][~allowed[~nan_rows]] == 0).all()  # masked keys: exact zeros
    sums = alpha.detach()[finite].sum(-1).double()
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    # The finite rows are what they are on their own, as if the NaN rows were not in the batch.
    rows = finite.nonzero().squeeze(-1)
    z_alone = z.detach()[rows].masked_fill(~mask[rows], 0.0).requires_grad_()  # the NaN under mask=False gone
    alpha_alone = fn(z_alone, bounds, mask=mask[rows])
    torch.testing.assert_close(alpha.detach()[rows], alpha_alone.detach(), rtol=0, atol=0)
    # Backward: NaN where torch.softmax's gradient is NaN (the NaN rows; masked_fill gives the keys under
    # mask=False no gradient), finite elsewhere, and the finite rows' gradients are theirs alone.
    grad = torch.linspace(-1.0, 1.0, z.numel(), dtype=dtype).view_as(z)
    grad_z, *grad_u = torch.autograd.grad(alpha, (z, u) if name != "sparsemax" else (z,), grad)
    z_ref = z.detach().float().requires_grad_()
    softmax = torch.softmax(z_ref.masked_fill(~mask, -INF), -1)
    (grad_ref,) = torch.autograd.grad(softmax, z_ref, grad.float())
    assert torch.equal(grad_z.isnan()[~all_masked], grad_ref.isnan()[~all_masked])
    assert (grad_z[all_masked] == 0).all()
    (grad_alone,) = torch.autograd.grad(alpha_alone, z_alone, grad[rows])
    torch.testing.assert_close(grad_z[rows], grad_alone.masked_fill(~mask[rows], 0.0), rtol=0, atol=0)
    if grad_u:  # the bounds are shared by every row, so the NaN rows make their whole gradient NaN
        assert grad_u[0].isnan().all()
    if name == "csoftmax" or name == "csparsemax":  # without NaN rows, u's gradient is finite
        (grad_u_finite,) = torch.autograd.grad(fn(z_alone, u, mask=mask[rows]), u, grad[rows])
        assert torch.isfinite(grad_u_finite).all()


@pytest.mark.parametrize("name", list(KERNELS))
def test_unbounded_kernels_match_softmax_semantics_on_nonfinite_rows(name):
    # With u = +inf, csoftmax is softmax: same values, same NaN, on every row that is not all masked.
    z, mask, nan_rows, all_masked = nonfinite_batch(torch.float64)
    alpha = KERNELS[name](z, INF, mask=mask)
    softmax = torch.softmax(z.masked_fill(~mask, -INF), -1)
    assert torch.equal(alpha.isnan()[~all_masked], softmax.isnan()[~all_masked])
    if name == "csoftmax":
        torch.testing.assert_close(alpha[~all_masked], softmax[~all_masked], equal_nan=True, rtol=0, atol=1e-15)


def test_issue_examples_show_nan():
    ones = torch.ones(1, 4)
    assert csoftmax(torch.full((1, 4), NAN), ones).isnan().all()
    assert csparsemax(torch.full((1, 4), NAN), ones).isnan().all()
    assert sparsemax(torch.tensor([NAN, 1.0, 2.0, 0.5])).isnan().all()
    assert sparsemax(torch.tensor([INF, 0.0, 0.0, 0.0])).isnan().all()  # as torch.softmax([inf, 0, 0, 0])
    assert torch.softmax(torch.tensor([INF, 0.0, 0.0, 0.0]), -1).isnan().all()


@pytest.mark.parametrize("fn", [csoftmax, csparsemax])
def test_nan_bound_on_an_allowed_key_gives_a_nan_row(fn):
    z = torch.tensor([[0.3, 1.0, -0.5, 2.0], [0.3, 1.0, -0.5, 2.0], [0.3, -INF, -0.5, 2.0]], requires_grad=True)
    u = torch.tensor([[NAN, 0.5, 0.5, 1.0], [0.4, NAN, 0.5, 1.0], [0.4, NAN, 0.5, 1.0]], requires_grad=True)
    mask = torch.tensor([[True, True, True, True], [True, False, True, True], [True, True, True, True]])
    alpha = fn(z, u, mask=mask)
    assert alpha[0].isnan().all()
    # A NaN bound on a masked key (by mask or by -inf) is ignored like the key.
    expected = fn(z.detach()[1:], torch.tensor([0.4, 0.0, 0.5, 1.0]), mask=mask[1:])
    torch.testing.assert_close(alpha[1:], expected, rtol=0, atol=0)
    grad_z, grad_u = torch.autograd.grad(alpha, (z, u), torch.ones_like(alpha))
    assert grad_z[0].isnan().all() and grad_u[0].isnan().all()
    assert torch.isfinite(grad_z[1:]).all() and torch.isfinite(grad_u[1:]).all()


@pytest.mark.parametrize("kind", ["csparsemax", "csoftmax", "sparsemax"])
def test_gradcheck_beside_nan_rows(kind):
    # gradcheck of the finite rows of a batch that also holds a NaN row and a +inf row (constants): the written-out
    # backward of the finite rows is untouched by them.
    z, u, mask = _differentiable_case("csparsemax" if kind == "sparsemax" else kind, 5, 6, seed=21)
    if kind == "sparsemax":
        u = torch.full_like(u, INF)
    bad_z = torch.tensor([[NAN, 0.0, 1.0, 0.5, 0.2, 0.1], [INF, 0.0, 1.0, 0.5, 0.2, 0.1]], dtype=z.dtype)
    bad_mask = torch.ones(2, 6, dtype=torch.bool)

    def finite_rows(a, b):
        fn = KERNELS[kind]
        out = fn(torch.cat([a, bad_z]), torch.cat([b, torch.ones_like(bad_z)]), mask=torch.cat([mask, bad_mask]))
        assert out[-2:].isnan().all()
        return out[:-2]

    z.requires_grad_()
    u.requires_grad_(kind != "sparsemax")
    inputs = (z, u)
    assert torch.autograd.gradcheck(finite_rows, inputs, eps=1e-6, atol=1e-6)


def test_nan_in_cross_attention_weights_shows_in_the_loss():
    # The issue's case: one NaN in the last cross-attention k_proj gave csoftmax models a finite loss.
    for variant in ("csoftmax", "csparsemax", "sparsemax"):
        model = random_model(tiny_config(cross_attention=variant))
        with torch.no_grad():
            model.model.decoder.layers[-1].encoder_attn.k_proj.weight[0, 0] = NAN
        input_ids = torch.tensor([[5, 6, 7, 8, 2], [9, 10, 11, 2, 0]])
        labels = torch.tensor([[12, 13, 14, 2], [15, 16, 2, -100]])
        loss = model(input_ids=input_ids, attention_mask=(input_ids != 0).long(), labels=labels).loss
        assert loss.isnan(), variant
