"""No host synchronisation in the models' per-step work (issue 43): a training forward and backward of every
registered variant in both model families, and decoding steps that continue a cache, read no tensor value on the host.

On a GPU such a read (`.item()`, `bool(tensor)`, `.tolist()`, `nonzero()`, a boolean-mask index, ...) makes the host
wait until the device has caught up, at every layer and every token. On the CPU nothing waits, so `HostSyncs` counts
the calls that would, three ways, each held by a positive control below to catching what it claims:

* a TorchFunctionMode names the Python-level calls (`item`, `__bool__`, `__int__`, `tolist`, `x[mask]`, ...);
* a TorchDispatchMode sees the ATen operators that read values or give shapes that depend on them: every conversion
  to a Python number goes through `_local_scalar_dense` (the C++ ones too, such as `torch.arange(tensor)`), and
  `nonzero`, `masked_select`, `unique`, `repeat_interleave` with tensor repeats, boolean-mask `index`... It also
  sees into backward passes, which the TorchFunctionMode does not reach (autograd runs them inside the handler of
  `backward`, where the mode is off);
* `Tensor.tolist` / `numpy` / `__array__` reach no operator for a CPU tensor, so they are wrapped while counting.

A copy between host and device memory also waits; on the CPU the test sees one kind, a tensor built from Python data
for a device (`torch.tensor(list, device=...)`). The others are left to `test_no_sync_on_cuda`, which runs the same
steps under `torch.cuda.set_sync_debug_mode("error")` where a GPU is present.

The sparse kernels read values on purpose where the tensors live in host memory (`sparse_solvers.HOST_DEVICES`, the
CPU: there a read waits for nothing and lets the solvers skip work); here they run as they run on any other device.
Two reads are allowed in a training forward, once per call: the input checks (`check_seq2seq_inputs`: the user's
tensors are checked before any work; a decoding step that continues a cache skips them) and the LSTM packing
(`pack_padded_sequence` takes the lengths on the host: the LSTM encoder and the PREDICTED fertility tagger). A decoding
step makes none, and the fast path's search between steps reads one number a step, as `generate`'s does.
"""

import contextlib
import functools
import traceback

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from hf_headattn import decoding
from hf_headattn.decoding import fast_generate
from hf_headattn.runtime import (modeling_headattn, modeling_headattn_rnn, rnn_packing, sparse_attention,
                                 sparse_solvers)
from hf_headattn.runtime.attention_registry import ATTENTION_VARIANTS
from hf_headattn.runtime.configuration_headattn_rnn import ATTENTION_TRANSFORMS, CONSTRAINED_TRANSFORMS
from hf_headattn.runtime.fertility import FERTILITY_STRATEGIES
from hf_headattn.runtime.sparse_attention import csoftmax, csparsemax, entmax15, entmax_bisect, sparsemax
from hf_headattn.runtime.transformers_compat import cache_of, with_cache

from helpers import (RNN_CONFIGS, TRANSFORMER_VARIANTS, VARIANT_CONFIGS, VOCAB, random_model, random_rnn_model,
                     rnn_config, source_batch, tiny_config)


DECODING_STEPS = 10

# ATen operators that read a value on the host or whose output shape depends on the data
SYNCING_OPERATORS = {"_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
                     "unique_consecutive", "equal", "bincount"}
# Python-level calls that do (besides those below, decided by their arguments)
SYNCING_CALLS = {"item", "__bool__", "__int__", "__float__", "__index__", "__contains__", "tolist",
                 "numpy", "__array__", "nonzero", "argwhere", "unique", "unique_consecutive", "masked_select", "equal",
                 "allclose", "is_nonzero", "bincount"}
WRAPPED_METHODS = ("tolist", "numpy", "__array__")  # no operator for a CPU tensor


def _has_mask_index(indices) -> bool:
    """Whether an index (a tensor, a tuple of indices, ...) holds a boolean tensor: indexing with it calls nonzero."""
    indices = indices if isinstance(indices, (tuple, list)) else (indices,)
    return any(torch.is_tensor(index) and index.dtype in (torch.bool, torch.uint8) for index in indices)


def _where_in_code() -> str:
    """The innermost frames of the package (else of Transformers or torch.nn) that led here."""
    frames = [frame for frame in traceback.extract_stack()[:-3]
              if "hf_headattn" in frame.filename or "transformers" in frame.filename or "/torch/nn/" in frame.filename]
    return " <- ".join(f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}" for frame in frames[::-1][:4])


class _NamedCalls(TorchFunctionMode):
    def __init__(self, record):
        super().__init__()
        self.record = record

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in SYNCING_CALLS and name not in WRAPPED_METHODS:
            self.record(name)
        elif name in ("__getitem__", "__setitem__", "index_put", "index_put_") and _has_mask_index(args[1]):
            self.record(f"{name} with a boolean mask")
        elif name == "repeat_interleave" and torch.is_tensor(kwargs.get("repeats", args[1] if len(args) > 1 else None)) \
                and kwargs.get("output_size") is None:
            self.record("repeat_interleave with tensor repeats")
        elif name == "where" and len(args) + len(kwargs) == 1:
            self.record("where(condition)")
        elif name in ("tensor", "as_tensor", "asarray") and kwargs.get("device") is not None \
                and not torch.is_tensor(args[0] if args else kwargs.get("data")):
            self.record(f"torch.{name} from Python data onto a device (a blocking copy from host memory)")
        return func(*args, **kwargs)


class _Operators(TorchDispatchMode):
    def __init__(self, record):
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in SYNCING_OPERATORS:
            self.record(f"aten.{name}")
        elif name in ("index", "index_put", "index_put_", "_index_put_impl_") and _has_mask_index(args[1]):
            self.record(f"aten.{name} with a boolean mask")
        elif func.name() == "aten::repeat_interleave.Tensor" and kwargs.get("output_size") is None:
            self.record("aten.repeat_interleave with tensor repeats")
        return func(*args, **kwargs)


class HostSyncs:
    """Within `with HostSyncs() as syncs:`, `syncs.calls` collects each call that would make the host wait for a
    device, as "what at where"; inside `syncs.allowing(reason)` they go to `syncs.allowed` instead."""

    def __init__(self):
        self.calls, self.allowed = [], []
        self._allowing = None
        self._stack = contextlib.ExitStack()

    def record(self, what: str) -> None:
        if self._allowing is None:
            self.calls.append(f"{what} at {_where_in_code()}")
        else:
            self.allowed.append(f"{what} ({self._allowing})")

    @contextlib.contextmanager
    def allowing(self, reason: str):
        outer, self._allowing = self._allowing, reason
        try:
            yield
        finally:
            self._allowing = outer

    def __enter__(self):
        for method in WRAPPED_METHODS:
            original = getattr(torch.Tensor, method)

            def counted(tensor, *args, original=original, method=method, **kwargs):
                self.record(method)
                return original(tensor, *args, **kwargs)

            self._stack.enter_context(_patched(torch.Tensor, method, functools.wraps(original)(counted)))
        self._stack.enter_context(_NamedCalls(self.record))
        self._stack.enter_context(_Operators(self.record))
        return self

    def __exit__(self, *exc_info):
        return self._stack.__exit__(*exc_info)


@contextlib.contextmanager
def _patched(owner, name, value):
    original = owner.__dict__.get(name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if original is None:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


# ------------------------------------------------------------------------------------------------ the controls
class _SyncInBackward(torch.autograd.Function):
    """Doubles x; its backward reads the gradient in the way `read` does."""

    @staticmethod
    def forward(ctx, x, read):
        ctx.read = read
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        ctx.read(grad)
        return grad * 2, None


def _backward_reading(read):
    x = torch.randn(4, requires_grad=True)
    _SyncInBackward.apply(x, read).sum().backward()


X = torch.tensor([0.5, -1.0, 2.0, 0.0])
MASK = X > 0
SYNCING = {
    "item": lambda: X.sum().item(),
    "bool": lambda: bool(X.sum() > 0),
    "if-tensor": lambda: 1 if X.max() > 1 else 0,
    "any-bool": lambda: bool(MASK.any()),
    "all-bool": lambda: not MASK.all(),
    "int": lambda: int(X[0]),
    "float": lambda: float(X[0]),
    "index": lambda: [0, 1, 2][torch.tensor(1)],
    "tolist": lambda: X.tolist(),
    "numpy": lambda: X.numpy(),
    "nonzero": lambda: MASK.nonzero(),
    "torch.nonzero": lambda: torch.nonzero(MASK),
    "where(condition)": lambda: torch.where(MASK),
    "argwhere": lambda: torch.argwhere(MASK),
    "unique": lambda: torch.unique(X),
    "masked_select": lambda: X.masked_select(MASK),
    "boolean-mask-index": lambda: X[MASK],
    "boolean-mask-assignment": lambda: X.clone().__setitem__(MASK, 0.0),
    "repeat_interleave-tensor-repeats": lambda: X.repeat_interleave(torch.tensor([1, 2, 0, 1])),
    "equal": lambda: torch.equal(X, X),
    "allclose": lambda: torch.allclose(X, X),
    "in": lambda: 0.5 in X,
    "arange-of-a-tensor": lambda: torch.arange(X.argmax()),  # the conversion happens in C++
    "bincount": lambda: torch.bincount(MASK.long()),
    "tensor-from-a-list-onto-a-device": lambda: torch.tensor([1, 2], device=X.device),
    "item-in-backward": lambda: _backward_reading(lambda grad: grad.sum().item()),
    "bool-in-backward": lambda: _backward_reading(lambda grad: bool(grad.any())),
    "tolist-in-backward": lambda: _backward_reading(lambda grad: grad.tolist()),
    "nonzero-in-backward": lambda: _backward_reading(lambda grad: grad.nonzero()),
    "mask-index-in-backward": lambda: _backward_reading(lambda grad: grad[grad > 0]),
}
BRANCH_FREE = {
    "where": lambda: torch.where(MASK, X, 0.0),
    "masked_fill": lambda: X.masked_fill(~MASK, float("-inf")),
    "sort-cumsum-gather": lambda: X.sort().values.cumsum(0).gather(0, torch.tensor([1, 0])),
    "index_select": lambda: X.index_select(0, torch.tensor([2, 0])),
    "integer-index": lambda: X[torch.tensor([2, 0])],
    "repeat_interleave-int": lambda: X.repeat_interleave(2),
    "repeat_interleave-output-size": lambda: X.repeat_interleave(torch.tensor([1, 2, 0, 1]), output_size=4),
    "shapes": lambda: (X.shape[0], X.numel(), len(X), X.dim()),
    "python-scalar-assignment": lambda: X.clone().__setitem__(slice(0, 2), 3.0),  # a fill, no copy
    "full": lambda: torch.full((2,), 3, device=X.device),
    "backward": lambda: _backward_reading(lambda grad: grad.clamp(min=0)),
}


@pytest.mark.parametrize("name", list(SYNCING))
def test_a_syncing_call_is_caught(name):
    with HostSyncs() as syncs:
        SYNCING[name]()
    assert syncs.calls, f"{name} read a value unnoticed"


@pytest.mark.parametrize("name", list(BRANCH_FREE))
def test_branch_free_code_is_not_counted(name):
    with HostSyncs() as syncs:
        BRANCH_FREE[name]()
    assert syncs.calls == []


def test_allowed_reads_are_kept_apart():
    with HostSyncs() as syncs:
        with syncs.allowing("a reason"):
            X.sum().item()
    assert syncs.calls == [] and syncs.allowed


# ------------------------------------------------------------------------------------------------ the models
def _transformer_configs() -> dict:
    """The invariant tests' placements (every registered variant at every site it declares among them), and those of
    a variant that needs fertility with each fertility strategy."""
    configs = {f"transformer-{name}": config for name, config in VARIANT_CONFIGS.items()}
    for name, variant in ATTENTION_VARIANTS.items():
        for strategy in FERTILITY_STRATEGIES if variant.needs_fertility else ():
            configs[f"transformer-{name}-every-site-{strategy}"] = {**TRANSFORMER_VARIANTS[name], "fertility": strategy}
    return configs


def _rnn_configs() -> dict:
    """The invariant tests' LSTMs and every attention transform with every fertility strategy it takes."""
    configs = {f"lstm-{name}": config for name, config in RNN_CONFIGS.items()}
    for transform in ATTENTION_TRANSFORMS:
        for strategy in FERTILITY_STRATEGIES if transform in CONSTRAINED_TRANSFORMS else (None,):
            fertility = {"fertility": strategy} if strategy else {}
            configs[f"lstm-{transform}" + (f"-{strategy}" if strategy else "")] = {"attention_transform": transform,
                                                                                     **fertility}
    return configs


MODELS = {**{name: (random_model, tiny_config, config) for name, config in _transformer_configs().items()},
          **{name: (random_rnn_model, rnn_config, config) for name, config in _rnn_configs().items()}}


def test_every_registered_variant_and_transform_is_run():
    names = " ".join(MODELS)
    assert all(f"transformer-{name}-every-site" in names for name in ATTENTION_VARIANTS)
    assert all(f"lstm-{transform}" in names for transform in ATTENTION_TRANSFORMS)


def _build(name: str, device: str = "cpu"):
    build, config, overrides = MODELS[name]
    return build(config(**overrides)).to(device)


def _inputs(device: str):
    input_ids, attention_mask = source_batch(lengths=(7, 4, 9))
    generator = torch.Generator().manual_seed(2)
    labels = torch.randint(2, VOCAB, (3, 6), generator=generator)
    labels[1, 4:] = -100  # a shorter target
    return input_ids.to(device), attention_mask.to(device), labels.to(device)


@contextlib.contextmanager
def _allowed_reads(allowing):
    """Within the block, the two reads a training forward may make go through `allowing(reason)`."""
    original_check, original_packing = modeling_headattn.check_seq2seq_inputs, rnn_packing._run_packed

    def check(**arguments):
        with allowing("the input checks, once per call"):
            return original_check(**arguments)

    def packing(*args):
        with allowing("pack_padded_sequence's host lengths"):
            return original_packing(*args)

    with contextlib.ExitStack() as stack:
        for module in (modeling_headattn, modeling_headattn_rnn):
            stack.enter_context(_patched(module, "check_seq2seq_inputs", check))
        stack.enter_context(_patched(rnn_packing, "_run_packed", packing))
        yield


def _train_step(model, inputs):
    input_ids, attention_mask, labels = inputs
    model.train()
    loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
    loss.backward()
    return loss


def _decoding_steps(model, inputs, steps):
    """Decoding as `generate` and the fast path run it: a first step without a cache (outside `steps`: it checks the
    inputs), then steps within `steps()` that each reorder the cache (beam search does at every step) and feed the
    previous step's prediction."""
    input_ids, attention_mask, _ = inputs
    device = input_ids.device
    model.eval()
    with torch.inference_mode():
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, return_dict=True)
        start = torch.full((input_ids.shape[0], 1), model.config.decoder_start_token_id, device=device)
        outputs = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask, decoder_input_ids=start,
                        use_cache=True)
        beams = torch.arange(input_ids.shape[0], device=device)
        with steps():
            for _ in range(DECODING_STEPS):
                cache = cache_of(outputs)
                cache.reorder_cache(beams)
                tokens = outputs.logits[:, -1].argmax(dim=-1, keepdim=True)
                outputs = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask,
                                decoder_input_ids=tokens, use_cache=True, **with_cache(cache))
        assert cache_of(outputs).get_seq_length() == 1 + DECODING_STEPS
    return outputs


@pytest.fixture
def kernels_as_off_the_host(monkeypatch):
    """The sparse kernels as they run on a GPU: no value read (on the CPU they may read values, which costs nothing
    there; see the module docstring)."""
    monkeypatch.setattr(sparse_solvers, "HOST_DEVICES", ())


@pytest.mark.parametrize("name", list(MODELS))
def test_training_step_reads_nothing_but_its_inputs(name, kernels_as_off_the_host):
    model = _build(name)
    inputs = _inputs("cpu")
    with HostSyncs() as syncs, _allowed_reads(syncs.allowing):
        _train_step(model, inputs)
    assert syncs.calls == [], f"{len(syncs.calls)} host syncs in a training forward and backward:\n" + "\n".join(
        syncs.calls)
    assert any("input checks" in read for read in syncs.allowed)  # (the allowance is where the reads are)


@pytest.mark.parametrize("name", list(MODELS))
def test_decoding_steps_read_nothing(name, kernels_as_off_the_host):
    model = _build(name)
    syncs = HostSyncs()
    _decoding_steps(model, _inputs("cpu"), lambda: syncs)
    assert syncs.calls == [] and syncs.allowed == [], (
        f"{len(syncs.calls)} host syncs in {DECODING_STEPS} decoding steps:\n" + "\n".join(syncs.calls))



SEARCH_STEPS = 6
# the fast path's search between the model's steps (its setup once per search aside)
SEARCH_FUNCTIONS = {f"decoding.py {name}" for search in (decoding._Search, decoding.GreedySearch, decoding.BeamSearch,
                                                         decoding.RunningSentences, decoding.RowDropPolicy)
                    for name in vars(search) if not name.startswith("__")}


def _innermost_function(call: str) -> str:
    """The file and function a read was made in: "decoding.py run" of "__int__ at decoding.py:123 run <- ..."."""
    where = call.split(" <- ")[0].split(" at ", 1)[-1]
    file_and_line, _, function = where.partition(" ")
    return f"{file_and_line.split(':')[0]} {function}"


@pytest.mark.parametrize("num_beams", [1, 3])
@pytest.mark.parametrize("name", ["transformer-softmax-every-site", "transformer-csparsemax-guided", "lstm-softmax"])
def test_fast_search_reads_one_number_a_step(name, num_beams, kernels_as_off_the_host):
    """The fast path's search, like `generate`'s, reads one number a step on the host (how many sentences are done):
    which sentences are done is read only when rows leave the batch, and at the end the longest result's length. Here
    (every sentence held to the same length) no row leaves before the end."""
    model = _build(name).eval()
    input_ids, attention_mask, _ = _inputs("cpu")
    with HostSyncs() as syncs:
        sequences = fast_generate(model, input_ids, attention_mask, num_beams=num_beams,
                                  min_new_tokens=SEARCH_STEPS, max_new_tokens=SEARCH_STEPS)
    assert sequences.shape == (input_ids.shape[0], 1 + SEARCH_STEPS)
    searching = [call for call in syncs.calls if _innermost_function(call) in SEARCH_FUNCTIONS]
    assert [call.split(" at ")[0] for call in searching] == ["__int__"] * (SEARCH_STEPS + 1), "\n".join(searching)

def _kernel_inputs(rows: int, keys: int, device: str = "cpu"):
    """Attention-like scores and bounds (some exhausted, an unbounded sink last), with masked keys, a row with no
    allowed key, an infeasible row, a NaN row and a +inf row."""
    generator = torch.Generator().manual_seed(0)
    z = torch.randn(rows, keys, generator=generator) * 2
    fertility = torch.randint(1, 4, (rows, keys), generator=generator).float()
    u = fertility * (1 - torch.rand(rows, keys, generator=generator).mul(1.25).clamp(max=1))
    u[:, -1] = float("inf")
    mask = torch.rand(rows, keys, generator=generator) > 0.2
    mask[:, -1] = True
    mask[3] = False
    u[5, -1], z[7, 0], z[9, 1], z[11, 2] = 0.01, float("nan"), float("inf"), float("-inf")
    return z.to(device), u.to(device), mask.to(device)


KERNELS = {
    "sparsemax": lambda z, u, mask: sparsemax(z, mask=mask),
    "csoftmax": lambda z, u, mask: csoftmax(z, u, mask=mask),
    "csparsemax": lambda z, u, mask: csparsemax(z, u, mask=mask),
    "csparsemax-compiled": lambda z, u, mask: csparsemax(z, u, mask=mask, compiled=True),
    "entmax15": lambda z, u, mask: entmax15(z, mask=mask),
    # a learned alpha per row, one of them out of (1, 2] (a NaN row, chosen without reading it)
    "entmax_bisect": lambda z, u, mask: entmax_bisect(z, _alphas(z), mask=mask),
}


def _alphas(z):
    alphas = torch.linspace(1.1, 2.0, z.shape[0], device=z.device)[:, None]
    alphas[13] = 2.5
    return alphas.requires_grad_()


# Below and above `sparse_solvers._SORT_BELOW` entries (on the CPU, the second goes to the active-set passes)
KERNEL_SHAPES = {"small": (40, 9), "large": (1024, 40)}


@pytest.mark.parametrize("shape", list(KERNEL_SHAPES))
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_kernels_read_nothing_off_the_host(kernel, shape, kernels_as_off_the_host, monkeypatch):
    # (compiled=True's backward runs eagerly here: torch.compile does not trace under the counting modes)
    for module in (sparse_attention, sparse_solvers):
        monkeypatch.setattr(module, "torch_compiled", lambda function: function)
    z, u, mask = (x.requires_grad_() if x.is_floating_point() else x for x in _kernel_inputs(*KERNEL_SHAPES[shape]))
    with HostSyncs() as syncs:
        alpha = KERNELS[kernel](z, u, mask)
        alpha.backward(torch.ones_like(alpha))
    assert syncs.calls == [], "\n".join(syncs.calls)
    assert alpha[7].isnan().all() and alpha[3].eq(0).all() and z.grad[7].isnan().any()


# ------------------------------------------------------------------------------------------------ on a GPU
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_no_sync_on_cuda():
    """The steps above on a GPU under `torch.cuda.set_sync_debug_mode("error")`, which raises at any synchronising
    call, blocking copies between host and device included; the two allowed reads run with it off."""

    @contextlib.contextmanager
    def erroring():
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(0)

    @contextlib.contextmanager
    def allowing(reason):
        torch.cuda.set_sync_debug_mode(0)
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode("error")

    for name in MODELS:  # (inputs are copied to the GPU before each erroring block)
        model, inputs = _build(name, "cuda"), _inputs("cuda")
        with erroring(), _allowed_reads(allowing):
            _train_step(model, inputs)
        _decoding_steps(model, inputs, erroring)
    for kernel in KERNELS:
        for shape in KERNEL_SHAPES.values():
            z, u, mask = _kernel_inputs(*shape, device="cuda")
            z, u = z.requires_grad_(), u.requires_grad_()
            KERNELS[kernel](z, u, mask).backward(torch.ones_like(z))  # torch.compile compiles on the first call
            with erroring():
                alpha = KERNELS[kernel](z, u, mask)
                alpha.backward(torch.ones_like(alpha))
