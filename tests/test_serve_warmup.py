"""metalgen.serve.warmup: which quantized products the server runs before it takes requests, and the short
batch that builds the traced step's kernels."""

import mlx.core as mx

import kernels_metal as K
from metalgen.api import load
from metalgen.models.layers import QuantizedLinear
from metalgen.serve import warmup


def test_one_layer_of_each_format_at_every_row_class():
    model = load("dummy:tiny-qwen3-4bit")[0]
    products = warmup.quantized_products(model)
    layers = {id(layer) for layer, _ in products}
    assert len(layers) == 1  # every layer is 4-bit, group 64, bf16 scales: one format
    assert [rows for _, rows in products] == list(warmup.ROW_CLASSES)
    assert all(isinstance(layer, QuantizedLinear) for layer, _ in products)
    # a second format (8 bits) gets its own layer
    first = next(m for _, m in model.named_modules() if isinstance(m, QuantizedLinear))
    model.model.layers[0].mlp.down_proj = QuantizedLinear.from_linear(
        _dense_like(model.model.layers[0].mlp.down_proj), first.group_size, 8)
    formats = {(layer.bits, layer.group_size) for layer, _ in warmup.quantized_products(model)}
    assert formats == {(4, 64), (8, 64)}
    assert warmup.quantized_products(load("dummy:tiny-qwen3")[0]) == []


def _dense_like(q: QuantizedLinear):
    from metalgen.models.layers import Linear

    w = mx.dequantize(q["weight"], q["scales"], q["biases"], q.group_size, q.bits)
    lin = Linear(w.shape[1], w.shape[0], bias=False)
    lin.weight = w
    return lin


def test_warm_up_runs_the_products_on_cuda_only(monkeypatch):
    model = load("dummy:tiny-qwen3-4bit")[0]
    shapes = []
    real = K.quantized_linear

    def spy(x, *a, **kw):
        shapes.append(x.shape)
        return real(x, *a, **kw)

    monkeypatch.setattr(K, "quantized_linear", spy)
    lines = []
    monkeypatch.setattr(warmup, "_on_cuda", lambda: False)
    assert warmup.warm_up(model, lines.append) == 0 and shapes == [] and lines == []
    monkeypatch.setattr(warmup, "_on_cuda", lambda: True)
    n = warmup.warm_up(model, lines.append)
    assert n == len(warmup.ROW_CLASSES) and [s[0] for s in shapes] == list(warmup.ROW_CLASSES)
    assert len(lines) == 2 and "minutes the first time" in lines[0] and lines[1].startswith("kernels ready")
    assert warmup.warm_up(load("dummy:tiny-qwen3")[0], lines.append) == 0


def _traced_sizes(monkeypatch):
    """The rows (padding included) of every traced step run from now on."""
    from metalgen import batch_step

    sizes = []
    real = batch_step.BatchStep._hidden

    def spy(self, tokens, cache):
        sizes.append(tokens.shape[0])
        return real(self, tokens, cache)

    monkeypatch.setattr(batch_step.BatchStep, "_hidden", spy)
    return sizes


def test_warm_batch_runs_every_padded_batch_size_on_cuda_when_the_server_batches_past_the_gemv_rows(monkeypatch):
    from metalgen.batch_step import ROW_BUCKET

    model = load("dummy:tiny-qwen3", dtype="float32")[0]
    least = K.GEMV_MAX_ROWS + 1
    sizes = _traced_sizes(monkeypatch)
    lines = []
    monkeypatch.setattr(warmup, "_on_cuda", lambda: False)
    assert warmup.warm_batch(model, 32, lines.append) == 0 and sizes == [] and lines == []
    monkeypatch.setattr(warmup, "_on_cuda", lambda: True)
    assert warmup.warm_batch(model, least - 1, lines.append) == 0 and sizes == []  # never that many rows
    assert warmup.warm_batch(model, 20, lines.append) == 20
    # the batch grows a prefill group (8 rows) a step: 8, 16, then 20 rows padded to 24
    assert sorted(set(sizes)) == [ROW_BUCKET, 2 * ROW_BUCKET, 3 * ROW_BUCKET] and sizes[2] == 24
    assert len(lines) == 2 and lines[1].startswith("batched step ready")


def test_warm_batch_of_a_hybrid_stack_runs_every_padded_size_too(monkeypatch):
    # its Gated DeltaNet states are padded with the step's rows (paged_cache.LinearRowStates.pad)
    from checkpoints import HYBRID_BATCH_CONFIGS, tiny_model

    model = tiny_model(HYBRID_BATCH_CONFIGS["qwen3_next"])
    sizes = _traced_sizes(monkeypatch)
    monkeypatch.setattr(warmup, "_on_cuda", lambda: True)
    assert warmup.warm_batch(model, 12) == 12
    assert sorted(set(sizes)) == [8, 16]
