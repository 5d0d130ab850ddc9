"""How a rank's device computes: the device, the attention backend, the small-batch kernels and
the CUDA launch choices, each measured where a comment says (docs/benchmarks.md)."""

from __future__ import annotations

from typing import Literal

from aioworker.config.section import Section


class DeviceOptions(Section):
    kind: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: triton (our paged kernel) on CUDA; on the CPU, torch with our C decode kernel where a
    # C compiler builds it. xformers: its paged decode kernel. torch: torch alone, any device.
    attention_backend: Literal["auto", "torch", "triton", "xformers"] = "auto"
    # CPU threads for torch; 0 = a worker's share of its host's cores (cores // ranks on the
    # host), the offline engine's torch default.
    num_threads: int = 0
    # CPU: reorder linear weights once into oneDNN's layout (faster matmuls, a second copy in memory).
    cpu_packed_weights: bool = True
    # CUDA: multiply decode's batches of 1 to 8 rows with our Triton kernels (each weight read
    # once by enough programs to fill the device; gate/up fused with SiLU) where the tuned table
    # measured them faster than the format's torch product (docs/benchmarks.md, W4).
    small_batch_kernels: bool = True
    # CUDA, with small_batch_kernels: each layer's residual add and RMSNorm computed inside the
    # qkv and gate/up products that read them (two launches fewer a layer). Off: W4 on the H200
    # measured it 1.05x on Qwen3-0.6B but 0.96x (8B bf16) and 0.81x (8B fp8).
    fused_norm_products: bool = False
    # CUDA, with small_batch_kernels, one rank: the RMSNorm after each o and down product split
    # between the products around it, so that it launches no kernel of its own: the product's
    # finish adds the residual and multiplies by the norm's weight, the next product scales by
    # 1 / rms (gemv/add_norm_input.py, PreNormed). W4, three runs a side: 1.02x on the 8B in
    # fp8 and on Qwen3-0.6B in bf16 (H100 and H200), 1.00-1.03x elsewhere, never slower. It
    # follows small_batch_kernels: with those off it does nothing.
    norms_in_product_finish: bool = True
    # CUDA, with small_batch_kernels: the products' finishing steps issue every load before
    # they use any (gemv/finish.py): the split-K reduce loads the model's per-channel
    # constants before it waits on the product (PDL), then all splits' sums and the residual
    # at once; a product that finishes itself fetches its constants into L2 while it waits.
    # Off: W4 on an H100 (2026-12-07, three runs a side) measured 1.01x on the 8B in bf16 and
    # fp8 but 0.92x in wint4 (docs/benchmarks.md).
    early_epilogue_loads: bool = False
    # CUDA, Hopper and later (ignored before): decode graphs of up to four sequences launch our
    # kernels with programmatic dependent launch, so each may start while the one before it
    # finishes (compute/layers/pdl.py). W4 on the H200: 1.13-1.20x on Qwen3-0.6B and
    # 1.02-1.05x on the 8B at batch 1; batch 8, captured without it, no slower. Not for the
    # formats of pdl_off_formats.
    pdl: bool = True
    # With pdl: projection formats (model.quantization) whose ranks launch without it all the
    # same. wint8: an H100 measured its batch-1 step 0.92x with PDL (W4, three runs a side,
    # 2026-12-06), where every other format gained 1.03-1.11x; no H200 has measured it. []
    # launches wint8 with PDL too.
    pdl_off_formats: tuple[Literal["none", "fp8", "wint8", "wint4"], ...] = ("wint8",)
    # With pdl: decode graphs of at most this many sequences launch with it (larger ones as
    # usual). With 8, the batch-8 step measured: H200 (2026-12-05) 8B bf16 6-7% slower, 0.6B
    # 1.10x faster; H100 (2026-12-06) 1.02-1.11x faster, but wint8 0.94x. 4 until an H200
    # measures 8 on this code.
    pdl_max_batch: int = 4
    # CUDA, attention_backend auto or triton (other backends ignore it): a decode step's q/k
    # norms, rotary and KV cache write done inside the paged decode kernel, one launch fewer a
    # layer (W4 on the H200: 2-3% faster at batch 1, docs/benchmarks.md).
    fused_rope_attention: bool = True
    # CUDA, attention_backend auto or triton: warps a decode attention program runs with (4: 126
    # registers a thread for sm_90, 8: 79; neither spills). The H100 measured 8 slower
    # (docs/benchmarks.md, 2026-12-06).
    decode_attention_warps: Literal[4, 8] = 4
    # CUDA, attention_backend auto or triton: the decode attention kernel's pipelining depth
    # (Triton's num_stages; 0: Triton's default, which copies one key tile ahead; 5: two). The
    # H100 measured 5 no faster (W1 0.998x, docs/benchmarks.md); an H200 has yet to.
    decode_attention_stages: int = 0
    # CUDA, attention_backend auto or triton: keys a decode attention program takes a tile, in
    # every decode step. The H100 timed 128 faster alone from 128 sequences of spread contexts
    # and 5% slower at 64 (docs/benchmarks.md, 2026-12-07); W1 1.025x with it everywhere.
    decode_attention_tile: Literal[64, 128] = 64
    # With decode_attention_tile 64: decode steps with at least this many (sequence, KV head)
    # pairs on the rank, each a program of decode attention, take keys in tiles of 128 all the
    # same. 320 is 40 sequences of a model with 8 KV heads: timed alone on an H100, tiles of 128
    # were 1-15% faster at spread contexts from 40 sequences, except 5% slower at 64 (512
    # programs; docs/benchmarks.md, 2026-12-07 19:23). W1 on an H100: 1,024 measured 1.012x
    # against none, and 320 1.009x against 1,024 (2026-12-07 21:17). Counted in programs,
    # fewer KV heads a rank (tensor parallel) need more sequences.
    decode_attention_tile_128_from_programs: int = 320
    # CUDA: capture decode steps as graphs for batch sizes up to max_capture_batch_size.
    cuda_graphs: bool = True
    max_capture_batch_size: int = 256
