"""Size the GPU KV cache from measured memory: after loading, run the largest step the scheduler
may issue (a prefill of max_num_batched_tokens, and sampling for max_num_seqs rows with every
logit control on), take the peak, and give the cache what is left of `gpu_memory_utilization`
of the device."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from aioworker.compute.kv_cache import allocate_kv_cache, bytes_per_block
from aioworker.compute.sampling.sampler import SampleRow
from aioworker.compute.step.cuda_graphs import MAX_VERIFY_GRAPH_BATCH
from aioworker.core.plan import LogitControls, NewSeq, SamplingSettings, StepPlan

log = logging.getLogger(__name__)

# cuBLAS workspaces, NCCL buffers and allocator slack the profile run does not show.
_UNSEEN_BYTES = 512 << 20


@dataclass(frozen=True)
class MemoryProfile:
    total_bytes: int
    used_before_bytes: int  # by this process (weights, context) and any other, before profiling
    activation_peak_bytes: int  # what a largest step allocates on top
    graph_reserve_bytes: int
    kv_budget_bytes: int
    num_blocks: int


@torch.inference_mode()
def profile_num_blocks(
    runner_factory, layers: list, config, model_config, dtype, device
) -> MemoryProfile:
    """`runner_factory(num_blocks)` builds a runner over a cache of that many blocks (graphs
    off); `layers`: every attention layer with a cache, a separate draft's too."""
    block_size = config.cache.block_size
    num_tokens = config.scheduler.step_token_budget(device.type)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free_before, total = torch.cuda.mem_get_info(device)
    allocated_before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)

    provisional_blocks = -(-num_tokens // block_size) + 1
    allocate_kv_cache(layers, provisional_blocks, block_size, dtype, device)
    runner = runner_factory(provisional_blocks - 1)
    runner.execute(
        _largest_prefill(num_tokens, block_size, config.model.max_model_len or num_tokens)
    )
    _largest_sampling(runner, model_config.vocab_size, config.scheduler.max_num_seqs, device)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - allocated_before
    for layer in layers:
        layer.k_cache = layer.v_cache = torch.empty(0)
    del runner
    torch.cuda.empty_cache()

    block_bytes = bytes_per_block(layers, block_size, dtype)
    graph_reserve = _graph_reserve(config, model_config, dtype)
    budget = int(total * config.cache.gpu_memory_utilization) - (total - free_before)
    budget -= peak + graph_reserve + _UNSEEN_BYTES
    profile = MemoryProfile(
        total, total - free_before, peak, graph_reserve, budget, max(0, budget // block_bytes) - 1
    )
    log.info("KV cache from profiling: %s", profile)
    return profile


def _largest_prefill(num_tokens: int, block_size: int, max_len: int) -> StepPlan:
    """Prefill chunks that fill the token budget, each within max_model_len."""
    lengths = [max_len] * (num_tokens // max_len) + (
        [num_tokens % max_len] if num_tokens % max_len else []
    )
    greedy = SamplingSettings(0.0, 0, 1.0, None, 0, [])
    next_block, new_block_ids = 0, []
    for length in lengths:
        count = -(-length // block_size)
        new_block_ids.append(list(range(next_block, next_block + count)))
        next_block += count
    return StepPlan(
        step_id=-1,
        seq_ids=[-1 - i for i in range(len(lengths))],
        num_scheduled_tokens=lengths,
        start_positions=[0] * len(lengths),
        new_block_ids=new_block_ids,
        sample=[True] * len(lengths),
        input_token_ids=[1] * num_tokens,
        new_seqs=[NewSeq(-1 - i, n, greedy) for i, n in enumerate(lengths)],
        released_seq_ids=[],
    )


def _largest_sampling(runner, vocab_size: int, num_rows: int, device) -> None:
    """Every row with every control (their per-sequence state, for max_num_seqs sequences,
    counts in the peak), a temperature, min_p, and top-p, which sorts the whole vocabulary:
    the sampler's largest working set."""
    controls = LogitControls(
        repetition_penalty=1.1,
        presence_penalty=0.1,
        frequency_penalty=0.1,
        min_p=0.01,
        logit_bias={0: 1.0},
        bad_words_token_ids=[[0], [0, 1]],
    )
    nucleus = SamplingSettings(0.7, 0, 0.9, None, 0, [], controls=controls)
    seq_ids = [-1 - i for i in range(num_rows)]
    for seq_id in seq_ids:
        runner.controls.admit(NewSeq(seq_id, 1, nucleus, [1]))
    logits = torch.randn(num_rows, vocab_size, device=device)
    rows = [SampleRow(nucleus, 1, 1)] * num_rows
    runner.sampler.sample(logits, rows, runner.controls.for_step(seq_ids))
    runner.controls.release(seq_ids)


def _graph_reserve(config, model_config, dtype) -> int:
    """Decode graphs' pool, and the verify graphs' where speculation is on: logits and a few
    activations per captured row."""
    if not config.device.cuda_graphs:
        return 0
    rows = min(config.device.max_capture_batch_size, config.scheduler.max_num_seqs)
    if config.speculative.method:
        rows += min(rows, MAX_VERIFY_GRAPH_BATCH) * (config.speculative.num_tokens + 1)
    element = torch.empty(0, dtype=dtype).element_size()
    return rows * (model_config.vocab_size + 32 * model_config.hidden_size) * element
