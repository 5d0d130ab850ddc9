"""The small-rows kernels on the GPU at the shapes of configs/models/ and their TP=2 shards, in
bf16, e4m3, int8 and int4 (bytes, int32 words and the blocks layout), with the tiles production picks, and with the
residual add and RMSNorm fused in; a CUDA graph of them equals eager."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu

MODELS = Path(__file__).resolve().parents[4] / "configs" / "models"


def projection_shapes() -> set[tuple[int, int, bool]]:
    """(output channels, K, gated) of every dense projection, whole and split over 2 ranks."""
    shapes = set()
    for config_file in MODELS.glob("*/config.json"):
        c = json.loads(config_file.read_text())
        d = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
        q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
        for tp in (1, 2):
            shapes |= {
                ((q + 2 * kv) // tp, c["hidden_size"], False),
                (c["hidden_size"], q // tp, False),
                (2 * c["intermediate_size"] // tp, c["hidden_size"], True),
                (c["hidden_size"], c["intermediate_size"] // tp, False),
            }
    return shapes | {(1000, 4000, False), (2 * 777, 1000, True)}  # no multiple of any tile


def stored(dense: torch.Tensor, fmt: str):
    """(the weight as the kernel reads it, its channel scale, int4 groups, the values it means)."""
    from aioworker.compute.layers.quantized.fp8 import quantize_rows
    from aioworker.compute.layers.quantized.weight_only import (
        dequantize_int4_rows,
        quantize_int4_rows,
    )
    from aioworker.compute.layers.weight_only import quantize_int8

    if fmt == "bf16":
        return dense, None, None, dense.float()
    if fmt == "e4m3":
        q, scale = quantize_rows(dense.float())
        return q, scale, None, q.float() * scale[:, None]
    if fmt == "int8":
        q, scale = quantize_int8(dense.float())
        return q, scale, None, q.float() * scale.float()[:, None]
    packed, scales, offsets = quantize_int4_rows(dense.float())
    groups = (scales.to(torch.bfloat16), offsets.to(torch.bfloat16))
    values = dequantize_int4_rows(packed, *groups)
    if fmt == "int4-words":  # a compressed-tensors checkpoint's int32 words
        from aioworker.compute.layers.quantized.weight_only import unpack_nibbles
        from tests.quantized_checkpoints import pack_int32

        packed = pack_int32(unpack_nibbles(packed).to(torch.int32) - 8, 1)
    return packed, None, groups, values


def int4_blocks(packed: torch.Tensor) -> torch.Tensor:
    """int4's bytes, or a checkpoint's int32 words, in the blocks layout the blocks tiles read
    (derived at load time from the values either holds)."""
    from aioworker.compute.layers.quantized.checkpoint_int4 import unpack_int32
    from aioworker.compute.layers.quantized.weight_only import pack_int4_blocks, unpack_nibbles

    words = packed.dtype == torch.int32
    return pack_int4_blocks(unpack_int32(packed, 1) if words else unpack_nibbles(packed))


def reference(x, values, gated):
    y = x.float() @ values.T
    if gated:
        gate, up = y.chunk(2, dim=-1)
        y = F.silu(gate) * up
    return y


@pytest.mark.parametrize("fmt", ["bf16", "e4m3", "int8", "int4", "int4-words"])
def test_every_shape_and_row_count_equals_the_reference(fmt: str) -> None:
    from aioworker.compute.layers.gemv.choice import rule_tiles, tiles_for
    from aioworker.compute.layers.gemv.product import small_rows_product

    failures = []
    for channels, depth, gated in sorted(projection_shapes()):
        if fmt.startswith("int4") and depth % 32:
            continue  # int4's groups of 32 must divide K
        dense = torch.randn(channels, depth, device="cuda", dtype=torch.bfloat16) / depth**0.5
        weight, scale, groups, values = stored(dense, fmt)
        for rows in range(1, 9):
            x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
            # Where the table leaves a shape to torch (None), the rule's tiles are checked.
            tiles = tiles_for(rows, weight, gated) or rule_tiles(channels, depth, gated, 132)
            want = reference(x, values, gated)
            # Split K both ways: a second kernel adds the partials, or the last program (fold).
            for fold in {tiles.fold, tiles.splits > 1}:
                cut = dataclasses.replace(tiles, fold=fold)
                read = int4_blocks(weight) if cut.blocks else weight  # as the method passes it
                got = small_rows_product(x, read, cut, scale, gated, int4_groups=groups)
                error = ((got.float() - want).norm() / want.norm()).item()
                # a8 tiles quantize x's rows to e4m3 (three mantissa bits): ~3% from x alone,
                # against the bf16 rows of the reference; a wrong kernel is off by ~100%.
                if error > (4e-2 if cut.a8 else 1e-2):
                    failures.append((channels, depth, gated, rows, cut, error))
    assert not failures


@pytest.mark.parametrize("fmt", ["bf16", "e4m3", "int4"])
def test_the_add_and_norm_fused_in_equal_the_unfused_kernels(fmt: str) -> None:
    """Every product that reads a norm (qkv and gate/up: K is the hidden size): its output
    within bf16's rounding of the add-and-norm kernel then the product, its sum exact."""
    from aioworker.compute.layers.fused import add_rms_norm
    from aioworker.compute.layers.gemv.add_norm_input import AddNorm
    from aioworker.compute.layers.gemv.choice import rule_tiles, tiles_for
    from aioworker.compute.layers.gemv.product import small_rows_product

    hidden_sizes = {channels for channels, _, gated in projection_shapes() if not gated}
    failures = []
    for channels, depth, gated in sorted(projection_shapes()):
        if depth not in hidden_sizes or fmt == "int4" and depth % 32:
            continue
        dense = torch.randn(channels, depth, device="cuda", dtype=torch.bfloat16) / depth**0.5
        weight, scale, groups, _ = stored(dense, fmt)
        norm_weight = torch.rand(depth, device="cuda", dtype=torch.bfloat16) + 0.5
        for rows in (1, 3, 8):
            x = 4 * torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
            residual = 4 * torch.randn_like(x)
            tiles = tiles_for(rows, weight, gated) or rule_tiles(channels, depth, gated, 132)
            if tiles.blocks and not tiles.dot:  # take no norm: the method norms first for them
                tiles = rule_tiles(channels, depth, gated, 132)
            read = int4_blocks(weight) if tiles.blocks else weight  # as the method passes it
            normed, summed = add_rms_norm(x, residual, norm_weight, 1e-6)
            want = small_rows_product(normed, read, tiles, scale, gated, int4_groups=groups)
            add_norm = AddNorm(residual, norm_weight, 1e-6, torch.empty_like(x))
            got = small_rows_product(x, read, tiles, scale, gated, None, groups, add_norm)
            error = ((got.float() - want.float()).norm() / want.float().norm()).item()
            # a8 tiles quantize the rows to e4m3: one rounding of the normed row apart, an
            # element near an e4m3 step lands on the other side (2% measured at 8B shapes).
            bound = 5e-2 if tiles.a8 else 1e-2
            if error > bound or not torch.equal(add_norm.residual_out, summed):
                failures.append((channels, depth, gated, rows, error))
    assert not failures


def test_a8_tiles_equal_their_rows_quantized_per_slice() -> None:
    """e4m3 weights times rows quantized to e4m3 per step of K (hardware rounding), at the 8B
    shapes: within float32 summation of the same products done in torch."""
    from aioworker.compute.layers.gemv.product import small_rows_product
    from aioworker.compute.layers.gemv.tiles import Tiles

    failures = []
    for channels, depth, gated in [(6144, 4096, False), (28672, 4096, True), (4096, 14336, False)]:
        dense = torch.randn(channels, depth, device="cuda", dtype=torch.bfloat16) / depth**0.5
        weight, scale, _, values = stored(dense, "e4m3")
        for tiles in (Tiles(block_n=64, block_k=128, splits=4, a8=True),
                      Tiles(block_n=128, block_k=256, a8=True)):  # fmt: skip
            for rows in (1, 5, 8):
                x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
                slices = x.float().view(rows, -1, tiles.block_k)
                step_scale = slices.abs().amax(-1, keepdim=True).clamp_min(1e-30) / 448
                quantized = (slices / step_scale).to(torch.float8_e4m3fn).float() * step_scale
                want = reference(quantized.view(rows, depth), values, gated)
                got = small_rows_product(x, weight, tiles, scale, gated)
                error = ((got.float() - want).norm() / want.norm()).item()
                if error > 1e-2:  # bf16 rounding of the output; A16 differs by ~3e-2
                    failures.append((channels, depth, gated, tiles, rows, error))
    assert not failures


def shape_failures(depth_multiple: int, operands, cases) -> list[tuple]:
    """(channels, depth, gated, rows, tiles, error) wherever a product of bf16 rows is off by
    more than 1%: every shape of configs/models/ and its TP=2 shards whose K is a multiple of
    `depth_multiple`, each of `cases` ((rows, tiles)); `operands(channels, depth)` gives the
    weight as the kernels read it, its channel scale, its int4 groups and the values it means."""
    from aioworker.compute.layers.gemv.product import small_rows_product

    failures = []
    for channels, depth, gated in sorted(projection_shapes()):
        if depth % depth_multiple:
            continue
        weight, scale, groups, values = operands(channels, depth)
        for rows, tiles in cases:
            if depth // tiles.splits < tiles.block_k:
                continue
            x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
            want = reference(x, values, gated)
            got = small_rows_product(x, weight, tiles, scale, gated, int4_groups=groups)
            error = ((got.float() - want).norm() / want.norm()).item()
            if error > 1e-2:
                failures.append((channels, depth, gated, rows, tiles, error))
    return failures


def _dense(channels: int, depth: int) -> torch.Tensor:
    return torch.randn(channels, depth, device="cuda", dtype=torch.bfloat16) / depth**0.5


def test_int4_blocks_tiles_equal_the_reference_at_each_shape() -> None:
    """int4's blocks layout by its PTX widenings: on FMA tiles at one row (int4_blocks.py, eight
    float32 values a word) and on tensor cores at 1, 3 and 8 (int4_blocks_dot.py, four bf16
    pairs), every shape of configs/models/ and its TP=2 shards, split K added by a second kernel
    and folded."""
    from aioworker.compute.layers.gemv.tiles import Tiles

    def operands(channels, depth):
        packed, _, groups, values = stored(_dense(channels, depth), "int4")
        return int4_blocks(packed), None, groups, values

    cases = ((1, Tiles(False, 64, 256, 1, 2, blocks=True)),
             (1, Tiles(False, 128, 256, 4, 4, blocks=True)),
             (1, Tiles(False, 32, 512, 2, 2, blocks=True, fold=True)),
             (1, Tiles(False, 16, 512, 2, 4, blocks=True, pipelined=True)),
             (1, Tiles(False, 64, 256, 4, 2, blocks=True, ahead=True)),
             (1, Tiles(True, 128, 256, 1, 4, num_stages=1, blocks=True)),
             (3, Tiles(True, 64, 256, 2, 4, num_stages=1, blocks=True, ahead=True)),
             (3, Tiles(True, 64, 128, 4, 4, blocks=True, fold=True)),
             (8, Tiles(True, 128, 256, 2, 4, num_stages=1, blocks=True)))  # fmt: skip
    assert not shape_failures(32, operands, cases)


def test_raw_int4_tiles_in_groups_of_128_equal_the_reference_at_each_shape() -> None:
    """int4's raw tiles (Tiles.bits on int4's blocks, int4_blocks_dot.py: the PTX's 128 + 8 q
    multiplied by bf16 rows, each step's sums scaled) at 1, 3 and 8 rows, every shape whose K
    holds groups of 128, split K added by a second kernel, folded, and read a step ahead."""
    from aioworker.compute.layers.gemv.tiles import Tiles
    from aioworker.compute.layers.quantized.weight_only import (
        dequantize_int4_values,
        pack_int4_blocks,
    )

    def operands(channels, depth):
        values = torch.randint(0, 16, (channels, depth), device="cuda", dtype=torch.uint8)
        scales = (torch.rand(channels, depth // 128, device="cuda") * 0.02).bfloat16()
        offsets = (torch.randn(channels, depth // 128, device="cuda") * 0.002).bfloat16()
        dense = dequantize_int4_values(values, scales, offsets)
        return pack_int4_blocks(values), None, (scales, offsets), dense

    cases = ((1, Tiles(True, 128, 128, 1, 4, num_stages=1, blocks=True, bits=True)),
             (3, Tiles(True, 64, 64, 2, 4, blocks=True, bits=True, fold=True)),
             (8, Tiles(True, 128, 128, 4, 4, num_stages=1, blocks=True, bits=True,
                       ahead=True)))  # fmt: skip
    assert not shape_failures(128, operands, cases)


@pytest.mark.parametrize("fmt", ["e4m3", "int8", "int4", "int4-words"])
def test_bits_tiles_equal_the_reference_in_bf16(fmt: str) -> None:
    """Weights widened by bit operations (widening.py), on the FMA tiles at one row and on the
    tensor cores at 1 to 8 (int4 there: bf16 0x4300 | q, group sums scaled), 8B shapes."""
    from aioworker.compute.layers.gemv.product import small_rows_product
    from aioworker.compute.layers.gemv.tiles import Tiles

    failures = []
    for channels, depth, gated in [(6144, 4096, False), (28672, 4096, True), (4096, 14336, False)]:
        dense = torch.randn(channels, depth, device="cuda", dtype=torch.bfloat16) / depth**0.5
        weight, scale, groups, values = stored(dense, fmt)
        cuts = [Tiles(dot=False, block_n=16, block_k=512, splits=2, bits=True),
                Tiles(dot=False, block_n=16, block_k=512, splits=2, bits=True, pipelined=True),
                Tiles(block_n=64, block_k=32, splits=4, bits=True)]  # fmt: skip
        if fmt == "int8":  # and a word at a time by PTX (words), the values' order included:
            # four float32 on FMA tiles, two bf16 pairs on tensor cores (also at one stage)
            cuts.insert(0, Tiles(dot=False, block_n=16, block_k=256, words=True, wide_x=True))
            cuts.insert(
                0,
                Tiles(dot=False, block_n=16, block_k=256, words=True, wide_x=True, pipelined=True),
            )  # W's words copied to shared memory ahead
            cuts += [Tiles(block_n=128, block_k=128, splits=2, num_stages=1, words=True),
                     Tiles(block_n=64, block_k=256, splits=4, words=True, fold=True)]  # fmt: skip
        for rows in (1, 3, 8):
            x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
            want = reference(x, values, gated)
            for tiles in [t for t in cuts if t.dot or rows == 1]:
                got = small_rows_product(x, weight, tiles, scale, gated, int4_groups=groups)
                error = ((got.float() - want).norm() / want.norm()).item()
                if error > 1e-2:
                    failures.append((channels, depth, gated, rows, tiles, error))
    assert not failures


@pytest.mark.parametrize("pdl_on", [False, True])
def test_a_graph_of_the_products_equals_eager(pdl_on: bool) -> None:
    """Back to back in a graph, as a step's products run: split, folded, normed; with
    programmatic dependent launch, each overlapping the one before (and prefetching W), the
    products equal eager ones launched without it."""
    from aioworker.compute.layers import pdl
    from aioworker.compute.layers.gemv.add_norm_input import AddNorm
    from aioworker.compute.layers.gemv.product import small_rows_product
    from aioworker.compute.layers.gemv.tiles import Tiles

    weight = torch.randn(2 * 1536, 4096, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(4, 4096, device="cuda", dtype=torch.bfloat16)
    residual, norm_weight = torch.randn_like(x), torch.rand(4096, device="cuda").bfloat16()
    cuts = [Tiles(splits=1), Tiles(splits=4), Tiles(block_n=32, splits=8),
            Tiles(splits=4, fold=True), Tiles(splits=2, prefetch=True)]  # fmt: skip

    def run():
        plain = [small_rows_product(x, weight, t, gated=g) for t in cuts for g in (False, True)]
        add_norm = AddNorm(residual, norm_weight, 1e-6, torch.empty_like(x))
        normed = [small_rows_product(x, weight, t, add_norm=add_norm) for t in cuts]
        return plain + normed + [add_norm.residual_out]

    eager = run()
    try:
        pdl.enable(pdl_on)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = run()
    finally:
        pdl.enable(False)
    x.copy_(torch.randn_like(x))
    graph.replay()
    for got, want in zip(captured, run(), strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(eager[0], captured[0])  # the replay read the new rows


def tiny_engine(model_dir, quantization: str, kernels: bool, **settings):
    from tests.conftest import make_engine

    return make_engine(
        model_dir,
        **{
            "cache.num_blocks": 64,
            "model.max_model_len": 256,
            "model.dtype": "float32",
            "model.quantization": quantization,
            "device.small_batch_kernels": kernels,
            **settings,
        },
    )


def prompts() -> list[list[int]]:
    g = torch.Generator().manual_seed(5)
    return [torch.randint(0, 384, (n,), generator=g).tolist() for n in (4, 19, 33, 60)]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])  # qwen3: q/k norms in the fused rotary
def test_greedy_tokens_with_the_kernels_equal_the_torch_path_in_float32(arch, tmp_path) -> None:
    """The whole model in float32, where both paths multiply in float32 (no TF32), in CUDA
    graphs: the kernels off, on with every fusion off, and with each fusion added in turn (the
    add and norm in the products, rotary and the cache write in decode attention,
    programmatic dependent launch, the norms split between the products around them)."""
    from aioworker.core.sampling_params import SamplingParams
    from tests.tiny_models import build_tiny_model

    build_tiny_model(arch, tmp_path, logit_scale=4.0)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    added = ["device.fused_norm_products", "device.fused_rope_attention", "device.pdl",
             "device.norms_in_product_finish"]  # fmt: skip
    outputs = []
    for kernels, on in ((False, 0), (True, 0), (True, 1), (True, 2), (True, 3), (True, 4)):
        switches = {name: i < on for i, name in enumerate(added)}
        engine = tiny_engine(tmp_path, "none", kernels, **switches)
        try:
            outputs.append([c.token_ids for c in engine.generate(prompts(), params)])
        finally:
            engine.close()
    assert all(tokens == outputs[0] for tokens in outputs[1:])


def dequantized_values(layer) -> torch.Tensor:
    """A quantized-on-load layer's weight as the values it means (float32)."""
    from aioworker.compute.layers.quantized.weight_only import dequantize_int4_rows

    if layer.weight.dtype == torch.uint8:
        return dequantize_int4_rows(layer.weight, layer.weight_scale, layer.weight_offset).float()
    return layer.weight.float() * layer.weight_scale.float()[:, None]


def blocks_tiles(rows, weight, gated, int4_group=0):
    """int4's blocks layout for every product: FMA tiles at one row, tensor cores above."""
    from aioworker.compute.layers.gemv.tiles import Tiles

    if rows == 1:
        return Tiles(False, 16, 64, 2, 2, blocks=True)
    return Tiles(True, 32, 64, 2, 4, num_stages=1, blocks=True)


@pytest.mark.parametrize("quantization", ["fp8", "wint8", "wint4", "wint4-blocks"])
def test_quantized_formats_multiply_as_their_dequantized_weights(
    quantization, tmp_path, monkeypatch
) -> None:
    """Each format through the whole model (float32), the same token sequences scored in passes
    of 8 rows (chunked prefill, so the kernels multiply every pass) against the model whose
    products are x times the dequantized weights in float32. The format's own torch path is no
    reference here: fp8's quantizes the rows too (W8A8), the weight-only ones round them to bf16.
    wint4-blocks: int4's products all on its blocks layout (tiny shapes are on no table)."""
    from aioworker.compute.layers.gemv import method as gemv_method
    from aioworker.compute.layers.quantized.fp8 import Fp8OnLoad
    from aioworker.compute.layers.quantized.weight_only import Int4OnLoad, Int8OnLoad
    from aioworker.core.sampling_params import SamplingParams
    from tests.tiny_models import build_tiny_model

    build_tiny_model("llama", tmp_path, logit_scale=4.0)
    params = SamplingParams(max_tokens=1, prompt_logprobs=1)
    blocks = quantization == "wint4-blocks"
    quantization = "wint4" if blocks else quantization
    scored = []
    for kernels in (False, True):
        if not kernels:
            for cls in (Fp8OnLoad, Int8OnLoad, Int4OnLoad):
                monkeypatch.setattr(cls, "apply", lambda self, layer, x, bias=None: F.linear(
                    x.float(), dequantized_values(layer), bias
                ).to(x.dtype))  # fmt: skip
        else:
            monkeypatch.undo()
            if blocks:
                monkeypatch.setattr(gemv_method, "tiles_for", blocks_tiles)
        engine = tiny_engine(
            tmp_path, quantization, kernels, **{"scheduler.max_num_batched_tokens": 8}
        )
        try:
            scored.append([c.prompt_logprobs[1:] for c in engine.generate(prompts(), params)])
        finally:
            engine.close()
    pairs = [(a, b) for off, on in zip(*scored, strict=True) for a, b in zip(off, on, strict=True)]
    agree = sum(a.top_token_ids[0] == b.top_token_ids[0] for a, b in pairs) / len(pairs)
    drift = max(abs(a.logprob - b.logprob) for a, b in pairs)
    print(f"{quantization}: top-1 agreement {agree:.3f}, largest |logprob change| {drift:.2e}")
    assert agree >= 0.98 and drift < 1e-3
