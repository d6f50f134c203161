#!/usr/bin/env python
"""Forward + backward time of the batched kernels in `hf_headattn.runtime.sparse_attention` against the implementations
they replace, at attention-like shapes [rows, keys] (rows = batch * heads * target steps):

* sparsemax  vs `entmax.sparsemax` (PyTorch, full sort; its default call);
* csoftmax   vs a per-row NumPy implementation of Martins & Kreutzer's (2017) algorithm;
* csparsemax vs a per-row NumPy implementation of the paper's sort-based algorithm (Malaviya et al., 2018,
  Alg. 1: the breakpoint walk of Pardalos & Kovoor, 1990, with a sort), twice: as called by default (eager
  PyTorch) and with `compiled=True` (its passes and backward compiled by torch.compile; the compile happens in
  the untimed first call, whose time is reported as first_call_s).

The references are written as the authors ran them, per row in NumPy float64 (their torch modules loop over the
batch and call a NumPy solver on each row), without handicaps: inputs are converted to float64 once per batch;
each row's algorithm sorts with NumPy, walks the sorted keys or breakpoints in Python only until the solution
is found (the cheaper way for each: Python floats for csoftmax, whose walk visits every zero bound, NumPy
scalars for csparsemax, whose walk ends after a few breakpoints), and vectorises the rest within the row; each
row's backward pass uses the O(n) closed form (Eq. 7-8 and its csoftmax counterpart), not a Jacobian.

Inputs (float32, seeded): scores z ~ N(0, 2^2) i.i.d.; bounds like u_t = f - beta_{t-1} mid-decoding (Eq. 5):
fertility f_j uniform in {1, 2, 3}, cumulative attention beta_j = f_j min(1, r_j) with r_j ~ U(0, 1.25), so
one key in five is exhausted (u = 0) and the others keep a uniform share of their credit; the last key is the
<SINK> with u = inf, so every row is feasible; output gradient ~ N(0, 1). The binding statistics are printed.

Timing: one sample is the mean over enough back-to-back calls to last >= --min-sample-ms; the implementations
alternate within every round (interleaved repeats); the table shows the median and the [min-max] over the
rounds, ratio = reference median / ours median (> 1: ours is faster). Forward + backward = one call computing
alpha and the gradients for z (and u) with `torch.autograd.grad` from leaves made once (no clone, no .grad
accumulation). Agreement of each pair (output and gradients) is checked before timing. The 1-minute load
average is recorded before and after every shape.

The script measures the `hf_headattn` of the checkout it lives in (its path is printed), not an installed one:

    python examples/benchmark_sparse_kernels.py --threads 2 --output sparse_kernels.json
"""

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time

import entmax
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's package
from hf_headattn.runtime import sparse_attention  # noqa: E402
from hf_headattn.runtime.sparse_attention import csoftmax, csparsemax, sparsemax  # noqa: E402


# ----------------------------------------------------------------------------------------------------------
# Per-row NumPy references (float64). Rows have at least one allowed key and finite scores (the inputs below).


def csoftmax_row(z, u):
    """Martins & Kreutzer (2017, Alg. 1): visit the keys by decreasing exp(z_j) / u_j; while a key's share of the
    mass left, exp(z_j) (1 - s) / Z, exceeds its bound, cap it (s += u_j, Z -= exp(z_j)). The first key that
    fits ends the walk (the later ones have smaller ratios); the rest get exp(z_j) (1 - s) / Z.
    Returns alpha and the capped keys."""
    e = np.exp(z - z.max())
    with np.errstate(divide="ignore", invalid="ignore"):
        order = np.argsort(u / e).tolist()  # increasing u_j / exp(z_j) = decreasing exp(z_j) / u_j
    e_list, u_list = e.tolist(), u.tolist()
    mass_left, s = sum(e_list), 0.0
    n_capped = 0
    for i in order:
        if e_list[i] * (1.0 - s) <= u_list[i] * mass_left:
            break
        s += u_list[i]
        mass_left -= e_list[i]
        n_capped += 1
    capped = np.zeros(z.shape, dtype=bool)
    capped[order[:n_capped]] = True
    if n_capped == len(order):  # infeasible (sum u < 1): every key at its bound
        return u.copy(), capped
    alpha = np.where(capped, u, e * ((1.0 - s) / mass_left))
    return alpha, capped


def csoftmax_row_backward(alpha, capped, g):
    """dz_j = 1[j free] alpha_j (g_j - m), du_j = 1[j capped] (g_j - m), m = sum_free alpha g / sum_free alpha."""
    free = np.where(capped, 0.0, alpha)
    free_mass = free.sum()
    m = free.dot(g) / free_mass if free_mass > 0 else 0.0
    return free * (g - m), np.where(capped, g - m, 0.0)


def csparsemax_row(z, u):
    """Malaviya et al. (2018, Alg. 1; Pardalos & Kovoor, 1990, with a sort): walk the breakpoints z_j (key j
    enters) and z_j - u_j (key j reaches its bound) in decreasing order, keeping the number of keys inside
    their box, the sum of their scores and the sum of the capped bounds, until f(b) = sum_j clip(z_j - b, 0,
    u_j) reaches 1; then tau = (sum_A z + sum_R u - 1) / |A| (Prop. 1). Returns alpha and the regions
    (0: alpha = 0, 1: 0 < alpha < u, 2: alpha = u)."""
    n = z.shape[0]
    breakpoints = np.concatenate([z, z - u])
    n_active, sum_z, sum_u = 0, 0.0, 0.0
    tau = None
    for idx in np.argsort(-breakpoints):
        b = breakpoints[idx]
        if n_active > 0 and sum_z - n_active * b + sum_u >= 1.0:  # f(b) >= 1: tau lies above b
            tau = (sum_z + sum_u - 1.0) / n_active
            break
        if n_active == 0 and sum_u >= 1.0:  # bounds summing to exactly 1: a flat segment
            tau = b
            break
        if idx < n:
            n_active += 1
            sum_z += z[idx]
        else:
            n_active -= 1
            sum_z -= z[idx - n]
            sum_u += u[idx - n]
    if tau is None:
        if n_active == 0:  # infeasible: sum(u) < 1
            return u.copy(), np.full(n, 2)
        tau = (sum_z + sum_u - 1.0) / n_active
    x = z - tau
    alpha = np.clip(x, 0.0, u)
    regions = np.where(x >= u, 2, np.where(x > 0, 1, 0))
    return alpha, regions


def csparsemax_row_backward(alpha, regions, g):
    """Eq. 7-8: dz_j = 1[j in A] (g_j - m), du_j = 1[j in A_R] (g_j - m), m = mean of g over A."""
    active = regions == 1
    n_active = np.count_nonzero(active)
    m = g[active].sum() / n_active if n_active else 0.0
    return np.where(active, g - m, 0.0), np.where(regions == 2, g - m, 0.0)


def numpy_reference(row_forward, row_backward):
    """Forward + backward of a per-row NumPy solver on torch tensors, as the authors' torch modules do."""

    def run(z, u, g):
        z64, u64, g64 = (x.detach().double().numpy() for x in (z, u, g))
        alpha, grad_z, grad_u = np.empty_like(z64), np.empty_like(z64), np.empty_like(z64)
        for r in range(z64.shape[0]):
            alpha[r], state = row_forward(z64[r], u64[r])
            grad_z[r], grad_u[r] = row_backward(alpha[r], state, g64[r])
        return tuple(torch.from_numpy(x).to(z.dtype) for x in (alpha, grad_z, grad_u))

    return run


# ----------------------------------------------------------------------------------------------------------


def make_inputs(rows, keys, seed):
    """z ~ N(0, 2^2); u = f - beta mid-decoding (see the module docstring); sink last; g ~ N(0, 1)."""
    generator = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, keys, generator=generator) * 2
    fertility = torch.randint(1, 4, (rows, keys), generator=generator).float()
    used = (torch.rand(rows, keys, generator=generator) * 1.25).clamp(max=1.0)
    u = fertility - fertility * used
    u[:, -1] = float("inf")
    g = torch.randn(rows, keys, generator=generator)
    return z, u, g


def torch_runner(fn, z, u, g):
    """alpha and the gradients w.r.t. z (and u) of <alpha, g>, from leaves made once."""
    z = z.clone().requires_grad_()
    u = None if u is None else u.clone().requires_grad_()

    def run():
        out = fn(z) if u is None else fn(z, u)
        grads = torch.autograd.grad(out, [z] if u is None else [z, u], g)
        return (out.detach(), *grads)

    return run


def max_difference(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def binding_stats(z, u):
    """How much the bounds bind in the csparsemax / csoftmax solutions of these inputs."""
    stats = {}
    for name, fn in (("csparsemax", csparsemax), ("csoftmax", csoftmax)):
        alpha = fn(z, u)
        at_bound = (alpha == u) & (u > 0)
        stats[name] = {
            "rows_with_a_binding_bound": at_bound.any(-1).float().mean().item(),
            "mean_keys_at_a_positive_bound": at_bound.sum(-1).float().mean().item(),
            "mean_support": (alpha > 0).sum(-1).float().mean().item(),
        }
    stats["zero_bounds"] = (u == 0).float().mean().item()
    stats["sparsemax_mean_support"] = (sparsemax(z) > 0).sum(-1).float().mean().item()
    return stats


def time_sample(run, inner):
    start = time.perf_counter()
    for _ in range(inner):
        run()
    return (time.perf_counter() - start) / inner


def summary(times):
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times), "samples": len(times)}


def loadavg():
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def benchmark_shape(rows, keys, args):
    z, u, g = make_inputs(rows, keys, args.seed)
    csoftmax_ref = numpy_reference(csoftmax_row, csoftmax_row_backward)
    csparsemax_ref = numpy_reference(csparsemax_row, csparsemax_row_backward)
    pairs = [
        ("sparsemax", "entmax.sparsemax", torch_runner(sparsemax, z, None, g),
         torch_runner(entmax.sparsemax, z, None, g)),
        ("csoftmax", "NumPy per row, Martins & Kreutzer (2017)", torch_runner(csoftmax, z, u, g),
         lambda: csoftmax_ref(z, u, g)),
        ("csparsemax", "NumPy per row, sort-based (Malaviya et al., 2018)", torch_runner(csparsemax, z, u, g),
         lambda: csparsemax_ref(z, u, g)),
        ("csparsemax compiled", "NumPy per row, sort-based (Malaviya et al., 2018)",
         torch_runner(functools.partial(csparsemax, compiled=True), z, u, g), lambda: csparsemax_ref(z, u, g)),
    ]
    runs = []  # (transform, side, run, inner)
    agreement, first_call = {}, {}
    for name, _, ours, reference in pairs:
        start = time.perf_counter()
        ours_first = ours()  # the warm-up (and the compile of `compiled=True`)
        first_call[name] = time.perf_counter() - start
        agreement[name] = max_difference(ours_first, reference())
        for side, run in (("ours", ours), ("reference", reference)):
            once = min(time_sample(run, 1) for _ in range(2))
            runs.append((name, side, run, max(1, int(args.min_sample_ms / 1e3 / max(once, 1e-9)))))
    times = {(name, side): [] for name, side, _, _ in runs}
    for _ in range(args.repeats):
        for name, side, run, inner in runs:
            times[name, side].append(time_sample(run, inner))
    results = []
    for name, reference_name, *_ in pairs:
        ours_t, ref_t = times[name, "ours"], times[name, "reference"]
        results.append({
            "shape": [rows, keys], "transform": name, "reference": reference_name,
            "ours": summary(ours_t), "reference_time": summary(ref_t),
            "ratio_median": statistics.median(ref_t) / statistics.median(ours_t),
            "max_abs_diff": agreement[name], "first_call_s": first_call[name],
        })
    return results, binding_stats(z, u)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", default="2", help="torch intra-op threads; a comma-separated list runs each")
    parser.add_argument("--repeats", type=int, default=9, help="interleaved rounds")
    parser.add_argument("--min-sample-ms", type=float, default=20.0, help="each sample lasts at least this long")
    parser.add_argument("--shapes", default="4096x32,4096x128,1024x512", help="comma-separated ROWSxKEYS")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", help="write the results as JSON here")
    parser.add_argument("--quiet-load", type=float, help="first wait (60 s steps, up to --wait-minutes) until the "
                        "1-minute load average is below this")
    parser.add_argument("--wait-minutes", type=float, default=15.0)
    args = parser.parse_args()
    if args.quiet_load is not None:
        waited = 0
        while loadavg() >= args.quiet_load and waited < args.wait_minutes * 60:
            print(f"1-min load average {loadavg():.2f} >= {args.quiet_load}: waiting 60 s", flush=True)
            time.sleep(60)
            waited += 60
    goals = {"sparsemax": 1.5, "csoftmax": 20.0, "csparsemax": 20.0, "csparsemax compiled": 20.0}

    runs = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        results, stats, loads = [], {}, []
        for shape in args.shapes.split(","):
            rows, keys = (int(x) for x in shape.lower().split("x"))
            load_before = loadavg()
            shape_results, stats[shape] = benchmark_shape(rows, keys, args)
            loads.append((shape, load_before, loadavg()))
            results += shape_results
        runs.append({"threads": threads, "results": results, "binding": stats, "loadavg_1min": loads})

        print(f"\n{sparse_attention.__file__}: torch {torch.__version__}, {threads} thread(s), {args.repeats} "
              f"interleaved rounds, forward+backward, float32 (references in float64), {os.cpu_count()} CPUs; "
              "1-min load average per shape (before -> after): "
              + ", ".join(f"{s} {a:.2f} -> {b:.2f}" for s, a, b in loads))
        print(f"{'shape':>9} {'transform':>19} {'ours median [min-max] ms':>27} {'reference median [min-max] ms':>32} "
              f"{'ratio':>7} {'goal':>5}  max |diff|  reference")
        for r in results:
            o, f = r["ours"], r["reference_time"]
            ours_s = f"{o['median_s'] * 1e3:.2f} [{o['min_s'] * 1e3:.2f}-{o['max_s'] * 1e3:.2f}]"
            ref_s = f"{f['median_s'] * 1e3:.2f} [{f['min_s'] * 1e3:.2f}-{f['max_s'] * 1e3:.2f}]"
            goal = goals[r["transform"]]
            r["goal"], r["goal_met"] = goal, r["ratio_median"] >= goal
            print(f"{'x'.join(map(str, r['shape'])):>9} {r['transform']:>19} {ours_s:>27} {ref_s:>32} "
                  f"{r['ratio_median']:>6.1f}x {'ok' if r['goal_met'] else 'MISS':>5}  {r['max_abs_diff']:.1e}     "
                  f"{r['reference']}")
        for shape, s in stats.items():
            print(f"  {shape}: zero bounds {s['zero_bounds']:.0%}; support sparsemax "
                  f"{s['sparsemax_mean_support']:.1f}, "
                  + "; ".join(f"{k} {v['mean_support']:.1f} with {v['mean_keys_at_a_positive_bound']:.2f} keys at a "
                              f"positive bound ({v['rows_with_a_binding_bound']:.0%} of rows)"
                              for k, v in s.items() if isinstance(v, dict)))

    if args.output:
        with open(args.output, "w") as handle:
            json.dump({
                "config": {"threads": args.threads, "repeats": args.repeats, "min_sample_ms": args.min_sample_ms,
                           "shapes": args.shapes, "seed": args.seed, "goals_ratio": goals,
                           "torch": torch.__version__, "numpy": np.__version__,
                           "entmax": getattr(entmax, "__version__", "unknown"), "python": platform.python_version(),
                           "module": sparse_attention.__file__,
                           "machine": platform.machine(), "processor": platform.processor(),
                           "cpu_count": os.cpu_count()},
                "runs": runs,
            }, handle, indent=2)
        print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
