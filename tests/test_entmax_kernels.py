"""The entmax kernels (`entmax15`, `entmax_bisect`) against the `entmax` package (Peters, Niculae & Martins, 2019;
Correia, Niculae & Martins, 2019): values and gradients, alpha's included, and the conventions of
runtime/sparse_attention.py (masks, all-masked rows, NaN and +inf rows, half precision, any dim).

The entmax package takes no mask, and a -inf score makes its sort-based entmax15 NaN, so the references below give
the masked keys a score of -1e6 instead. Its bisection runs 100 steps here (float64), to rounding."""

import entmax
import pytest
import torch

from hf_headattn.runtime import sparse_solvers
from hf_headattn.runtime.sparse_attention import entmax15, entmax_bisect, sparsemax

from helpers.nonfinite import nonfinite_batch


INF, NAN = float("inf"), float("nan")
REFERENCE_STEPS = 100


@pytest.fixture(params=["host", "off-the-host"])
def where(request, monkeypatch):
    """Every test once as on the CPU and once as off it, where no value is read (`sparse_solvers.HOST_DEVICES`)."""
    if request.param == "off-the-host":
        monkeypatch.setattr(sparse_solvers, "HOST_DEVICES", ())
    return request.param


def reference(z, mask=None, alpha=None):
    """entmax's entmax15 (alpha None) or entmax_bisect along the last dim of 2-D z over the allowed keys (mask, and
    scores above -inf), which get a score of -1e6 (exact zeros for the package, whose max and thresholds come from
    the top keys); zeros for rows with no allowed key. alpha: None, a number, or one per row ([rows, 1])."""
    allowed = torch.isfinite(z) | z.isnan()
    if mask is not None:
        allowed = allowed & mask.expand(z.shape)
    scores = z.masked_fill(~allowed, -1e6)
    if alpha is None:
        values = entmax.entmax15(scores, dim=-1)
    else:
        values = entmax.entmax_bisect(scores, alpha, dim=-1, n_iter=REFERENCE_STEPS)
    return values * allowed.any(-1, keepdim=True)


def random_scores(rows, keys, seed, ties=False, mask_rate=0.2, scale=2.0):
    """Scores with ties (optional), some -inf, a mask with an all-masked first row."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, keys, generator=generator, dtype=torch.float64) * scale
    if ties:
        z = torch.round(z * 2) / 2
    z[torch.rand(rows, keys, generator=generator) < 0.1] = -INF
    mask = torch.rand(rows, keys, generator=generator) >= mask_rate
    mask[0] = False
    return z, mask


CASES = [(20, 1, 0), (40, 2, 1), (60, 5, 2), (100, 17, 3), (50, 64, 4)]
ALPHAS = [1.01, 1.25, 1.5, 1.75, 2.0]


# ------------------------------------------------------------------------------------------------ values
@pytest.mark.parametrize("rows,keys,seed", CASES)
@pytest.mark.parametrize("ties", [False, True])
def test_entmax15_matches_the_entmax_package(rows, keys, seed, ties, where):
    z, mask = random_scores(rows, keys, seed, ties=ties)
    torch.testing.assert_close(entmax15(z, mask=mask), reference(z, mask), rtol=0, atol=1e-12)
    # float32: the package in float64 on the same (rounded) scores
    z32 = z.float()
    got = entmax15(z32, mask=mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(z32.double(), mask), rtol=0, atol=1e-6)


@pytest.mark.parametrize("rows,keys,seed", CASES)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_entmax_bisect_matches_the_entmax_package(rows, keys, seed, alpha, where):
    z, mask = random_scores(rows, keys, seed, ties=seed % 2 == 1)
    torch.testing.assert_close(entmax_bisect(z, alpha, mask=mask), reference(z, mask, alpha), rtol=0, atol=1e-12)
    got = entmax_bisect(z.float(), alpha, mask=mask)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), reference(z.float().double(), mask, alpha), rtol=0, atol=1e-6)


def test_entmax_bisect_with_one_alpha_per_row_and_its_special_cases(where):
    z, mask = random_scores(300, 23, 5)
    alphas = torch.linspace(1.02, 2.0, 300, dtype=torch.float64)[:, None]
    torch.testing.assert_close(entmax_bisect(z, alphas, mask=mask), reference(z, mask, alphas), rtol=0, atol=1e-12)
    # alpha = 1.5 is entmax15, alpha = 2 sparsemax
    torch.testing.assert_close(entmax_bisect(z, 1.5, mask=mask), entmax15(z, mask=mask), rtol=0, atol=1e-12)
    torch.testing.assert_close(entmax_bisect(z, 2.0, mask=mask), sparsemax(z, mask=mask), rtol=0, atol=1e-12)
    torch.testing.assert_close(entmax_bisect(z, torch.tensor(2.0, dtype=torch.float64), mask=mask),
                               sparsemax(z, mask=mask), rtol=0, atol=1e-12)


def test_solutions_are_distributions_with_exact_zeros(where):
    z, mask = random_scores(400, 30, 6, ties=True)
    allowed = mask & torch.isfinite(z)
    has_key = allowed.any(-1)
    for alpha in (entmax15(z, mask=mask), entmax_bisect(z, 1.3, mask=mask)):
        assert torch.isfinite(alpha).all() and (alpha >= 0).all()
        assert (alpha[~allowed] == 0).all() and (alpha[~has_key] == 0).all()
        torch.testing.assert_close(alpha[has_key].sum(-1), torch.ones(int(has_key.sum()), dtype=torch.float64))
    # sparse, and less sparse than sparsemax; the lower alpha, the wider the support
    supports = [(f(z) > 0).sum() for f in (sparsemax, lambda x: entmax_bisect(x, 1.75), entmax15,
                                          lambda x: entmax_bisect(x, 1.25))]
    assert supports == sorted(supports) and supports[0] < supports[-1] < z.numel()
    assert (entmax15(z) == 0).any()


def test_hand_cases():
    d = dict(dtype=torch.float64)
    # two keys: alpha = ([z/2 - tau]_+)^2; z = (1, 0): x = (0, -0.5), both in the support iff 0.25 < 1
    # (x1 - tau)^2 + (x2 - tau)^2 = 1 -> tau = -0.25 - sqrt(0.4375)
    tau = -0.25 - 0.4375**0.5
    expected = torch.tensor([[tau**2, (-0.5 - tau) ** 2]], **d)
    torch.testing.assert_close(entmax15(torch.tensor([[1.0, 0.0]], **d)), expected)
    # a gap of 2 / 2 = 1 or more between the top two scores: one-hot
    torch.testing.assert_close(entmax15(torch.tensor([[2.0, 0.0, -1.0]], **d)), torch.tensor([[1.0, 0.0, 0.0]], **d))
    # ties: equal shares
    torch.testing.assert_close(entmax15(torch.zeros(1, 4, **d)), torch.full((1, 4), 0.25, **d))
    torch.testing.assert_close(entmax_bisect(torch.zeros(1, 4, **d), 1.1), torch.full((1, 4), 0.25, **d))


def test_any_dim_and_broadcasting(where):
    generator = torch.Generator().manual_seed(7)
    z = torch.randn(3, 6, 5, 4, generator=generator, dtype=torch.float64) * 2
    mask = torch.rand(1, 6, 5, 1, generator=generator) > 0.2  # broadcast over dims 0 and 3
    for dim in range(-4, 4):
        rows = z.movedim(dim, -1)
        mask_rows = mask.expand(z.shape).movedim(dim, -1)
        flat, flat_mask = rows.reshape(-1, rows.shape[-1]), mask_rows.reshape(-1, rows.shape[-1])
        want = reference(flat, flat_mask).view(rows.shape).movedim(-1, dim)
        torch.testing.assert_close(entmax15(z, dim=dim, mask=mask), want, rtol=0, atol=1e-12)
        # one alpha per position of the other dims, given with size 1 along dim
        alpha_shape = list(z.shape)
        alpha_shape[dim] = 1
        alpha = 1.1 + torch.rand(alpha_shape, generator=generator, dtype=torch.float64) * 0.9
        alpha_rows = alpha.movedim(dim, -1).reshape(-1, 1)
        want = reference(flat, flat_mask, alpha_rows).view(rows.shape).movedim(-1, dim)
        torch.testing.assert_close(entmax_bisect(z, alpha, dim=dim, mask=mask), want, rtol=0, atol=1e-12)


def test_alpha_is_checked():
    z = torch.randn(4, 5)
    for alpha in (1.0, 0.5, 2.5, NAN, INF, True, "1.5"):
        with pytest.raises(ValueError, match=r"alpha must be a number in \(1, 2\]"):
            entmax_bisect(z, alpha)
    with pytest.raises(ValueError, match=r"alpha \(4, 5\) must broadcast .* with size 1 along dim -1"):
        entmax_bisect(z, torch.full((4, 5), 1.5))
    with pytest.raises(ValueError, match=r"alpha \(3, 1\) must broadcast"):
        entmax_bisect(z, torch.full((3, 1), 1.5))
    with pytest.raises(TypeError, match="alpha must be a floating-point tensor"):
        entmax_bisect(z, torch.tensor([[2]]))
    assert entmax_bisect(z, 2).shape == z.shape  # an int is a number
    assert entmax_bisect(z, torch.full((4, 1), 1.5)).shape == z.shape


# ------------------------------------------------------------------------------------------------ gradients
def _reference_gradients(z, mask, alpha, grad):
    """Gradients of sum(grad * entmax) for z (and alpha), through the entmax package's own backward."""
    zr = z.detach().clone().requires_grad_()
    ar = alpha.detach().clone().requires_grad_() if torch.is_tensor(alpha) else alpha
    out = reference(zr, mask, ar)
    return torch.autograd.grad(out, [zr] + ([ar] if torch.is_tensor(alpha) else []), grad)


def test_gradients_match_the_entmax_package(where):
    z, mask = random_scores(200, 15, 8)
    grad = torch.randn(z.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    zz = z.clone().requires_grad_()
    (grad_z,) = torch.autograd.grad(entmax15(zz, mask=mask), zz, grad)
    (want,) = _reference_gradients(z, mask, None, grad)
    torch.testing.assert_close(grad_z, want, rtol=0, atol=1e-10)
    assert (grad_z[~(mask & torch.isfinite(z))] == 0).all()
    alphas = torch.linspace(1.05, 1.95, 200, dtype=torch.float64)[:, None].requires_grad_()
    grad_z, grad_alpha = torch.autograd.grad(entmax_bisect(zz, alphas, mask=mask), (zz, alphas), grad)
    want_z, want_alpha = _reference_gradients(z, mask, alphas, grad)
    torch.testing.assert_close(grad_z, want_z, rtol=0, atol=1e-10)
    torch.testing.assert_close(grad_alpha, want_alpha, rtol=1e-8, atol=1e-10)
    assert grad_alpha[0] == 0  # the all-masked row
    assert (grad_alpha[1:] != 0).sum() > 100  # (rows with one allowed key have none)


def _off_breakpoints(z, mask, solution, margin=1e-3):
    """Whether every allowed key's threshold gap [x_j - tau] is away from 0 by `margin`, so that finite differences
    do not cross the support's boundary (checked on the solution: a key is either clearly in or clearly out)."""
    allowed = mask & torch.isfinite(z)
    near = (solution > 0) & (solution < margin**2)
    return not near[allowed].any()


def _differentiable_scores(rows, keys, seed, transform):
    for attempt in range(100):
        z, mask = random_scores(rows, keys, seed * 1000 + attempt, scale=1.0)
        if _off_breakpoints(z, mask, transform(z, mask)):
            return z, mask
    raise AssertionError("no differentiable case found")


@pytest.mark.parametrize("keys", [1, 4, 9])
def test_gradcheck_entmax15(keys, where):
    z, mask = _differentiable_scores(6, keys, keys, lambda z, m: entmax15(z, mask=m))
    z.requires_grad_()
    assert torch.autograd.gradcheck(lambda a: entmax15(a, mask=mask), (z,), eps=1e-6, atol=1e-6)
    z_t = z.detach().t().contiguous().requires_grad_()
    assert torch.autograd.gradcheck(lambda a: entmax15(a, dim=0, mask=mask.t()), (z_t,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("keys", [1, 4, 9])
def test_gradcheck_entmax_bisect_for_scores_and_alpha(keys, where):
    alphas = torch.tensor([[1.1], [1.3], [1.5], [1.6], [1.8], [1.95]], dtype=torch.float64)
    z, mask = _differentiable_scores(6, keys, keys + 10, lambda z, m: entmax_bisect(z, alphas, mask=m))
    z.requires_grad_()
    alphas.requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: entmax_bisect(a, b, mask=mask), (z, alphas), eps=1e-6, atol=1e-6)
    # along dim 0, alpha [1, rows]
    z_t = z.detach().t().contiguous().requires_grad_()
    alphas_t = alphas.detach().t().contiguous().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: entmax_bisect(a, b, dim=0, mask=mask.t()), (z_t, alphas_t),
                                    eps=1e-6, atol=1e-6)


def test_gradcheck_alpha_per_head_broadcast_over_queries(where):
    # [batch, heads, queries, keys] scores, alpha [heads, 1, 1] as the entmax_alpha variant passes it: alpha's
    # gradient is summed over batch and queries
    generator = torch.Generator().manual_seed(3)
    z = (torch.randn(2, 3, 4, 5, generator=generator, dtype=torch.float64)).requires_grad_()
    alphas = torch.tensor([1.2, 1.5, 1.9], dtype=torch.float64).view(3, 1, 1).requires_grad_()
    mask = torch.tensor([[True] * 5, [True, True, True, False, False]]).view(2, 1, 1, 5)
    out = entmax_bisect(z, alphas, mask=mask)
    assert out.shape == z.shape
    assert torch.autograd.gradcheck(lambda a, b: entmax_bisect(a, b, mask=mask), (z, alphas), eps=1e-6, atol=1e-6)


def test_all_masked_rows_have_zero_gradient(where):
    z = torch.tensor([[-INF, -INF], [0.0, 1.0]], requires_grad=True)
    mask = torch.tensor([[True, True], [False, False]])
    alphas = torch.full((2, 1), 1.4, requires_grad=True)
    for out in (entmax15(z, mask=mask), entmax_bisect(z, alphas, mask=mask)):
        assert (out == 0).all()
    grad_z, grad_alpha = torch.autograd.grad(entmax_bisect(z, alphas, mask=mask).sum(), (z, alphas))
    assert (grad_z == 0).all() and (grad_alpha == 0).all()
    (grad_z,) = torch.autograd.grad(entmax15(z, mask=mask).sum(), z)
    assert (grad_z == 0).all()


def test_empty_key_dimension():
    z = torch.zeros(3, 0, requires_grad=True)
    alphas = torch.full((3, 1), 1.5, requires_grad=True)
    assert entmax15(z).shape == (3, 0) and entmax_bisect(z, alphas).shape == (3, 0)


# ------------------------------------------------------------------------------------------------ precision
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype, where):
    z, mask = random_scores(300, 12, 9)
    zh = z.to(dtype)
    tol = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-10  # one ulp of a value <= 1
    got = entmax15(zh, mask=mask)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), reference(zh.double(), mask), rtol=0, atol=tol)
    alphas = torch.full((300, 1), 1.3, requires_grad=True)  # a float32 parameter, as a model keeps it
    got = entmax_bisect(zh, alphas, mask=mask)
    assert got.dtype == dtype
    torch.testing.assert_close(got.double(), reference(zh.double(), mask, 1.3), rtol=0, atol=tol)
    (grad_alpha,) = torch.autograd.grad(got.float().pow(2).sum(), alphas)
    assert grad_alpha.dtype == torch.float32 and torch.isfinite(grad_alpha).all()
    # a number alpha keeps float32 precision with half scores (1.3 is not a float16 number)
    torch.testing.assert_close(entmax_bisect(zh, 1.3, mask=mask), got.detach(), rtol=0, atol=0)


# ------------------------------------------------------------------------------------------------ NaN and +inf
KERNELS = {
    "entmax15": lambda z, alphas, mask: entmax15(z, mask=mask),
    "entmax_bisect": lambda z, alphas, mask: entmax_bisect(z, alphas, mask=mask),
}


@pytest.mark.parametrize("name", list(KERNELS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_nan_and_inf_rows_propagate_like_softmax(name, dtype, where):
    z, mask, nan_rows, all_masked = nonfinite_batch(dtype)
    z.requires_grad_()
    alphas = torch.linspace(1.2, 1.9, z.shape[0])[:, None].requires_grad_()
    fn = KERNELS[name]
    out = fn(z, alphas, mask)
    assert out.dtype == dtype
    assert out[nan_rows].isnan().all() and not out[~nan_rows].isnan().any()
    assert (out[all_masked] == 0).all()
    finite = ~nan_rows & ~all_masked
    allowed = mask & (z != -INF)
    assert (out.detach()[finite][~allowed[finite]] == 0).all()
    sums = out.detach()[finite].sum(-1).double()
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-2 if dtype == torch.bfloat16 else 1e-6)
    # the finite rows are what they are alone, as if the NaN rows were not in the batch
    rows = finite.nonzero().squeeze(-1)
    z_alone = z.detach()[rows].masked_fill(~mask[rows], 0.0).requires_grad_()
    alphas_alone = alphas.detach()[rows].requires_grad_()
    out_alone = fn(z_alone, alphas_alone, mask[rows])
    torch.testing.assert_close(out.detach()[rows], out_alone.detach(), rtol=0, atol=0)
    grad = torch.linspace(-1.0, 1.0, z.numel(), dtype=dtype).view_as(z)
    inputs = (z, alphas) if name == "entmax_bisect" else (z,)
    grad_z, *grad_alpha = torch.autograd.grad(out, inputs, grad)
    z_ref = z.detach().float().requires_grad_()
    (grad_ref,) = torch.autograd.grad(torch.softmax(z_ref.masked_fill(~mask, -INF), -1), z_ref, grad.float())
    assert torch.equal(grad_z.isnan()[~all_masked], grad_ref.isnan()[~all_masked])
    assert (grad_z[all_masked] == 0).all()
    inputs_alone = (z_alone, alphas_alone) if name == "entmax_bisect" else (z_alone,)
    grad_z_alone, *grad_alpha_alone = torch.autograd.grad(out_alone, inputs_alone, grad[rows])
    torch.testing.assert_close(grad_z[rows], grad_z_alone.masked_fill(~mask[rows], 0.0), rtol=0, atol=0)
    if grad_alpha:  # one alpha per row: only the NaN rows' alphas get NaN
        assert grad_alpha[0][nan_rows].isnan().all() and not grad_alpha[0][~nan_rows].isnan().any()
        torch.testing.assert_close(grad_alpha[0][rows], grad_alpha_alone[0], rtol=0, atol=0)


def test_alpha_outside_its_range_gives_nan_rows(where):
    # a tensor's values are not read (no host sync off the CPU): a row whose alpha is not in (1, 2] is NaN
    z = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    alphas = torch.tensor([[1.5], [1.0], [2.5], [NAN], [2.0]], dtype=torch.float64, requires_grad=True)
    out = entmax_bisect(z, alphas)
    bad = torch.tensor([False, True, True, True, False])
    assert out[bad].isnan().all() and not out[~bad].isnan().any()
    torch.testing.assert_close(out[~bad], entmax_bisect(z.detach()[~bad], alphas.detach()[~bad]), rtol=0, atol=0)
    grad_z, grad_alpha = torch.autograd.grad(out, (z, alphas), torch.ones_like(out))
    assert grad_z[bad].isnan().all() and torch.isfinite(grad_z[~bad]).all()
    assert grad_alpha[bad].isnan().all() and torch.isfinite(grad_alpha[~bad]).all()
