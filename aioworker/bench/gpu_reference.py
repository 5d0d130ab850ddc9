"""transformers `generate` on the same configuration, random bf16 weights, on the same GPU."""

from __future__ import annotations

import time
from pathlib import Path

import torch


def load(model_dir: Path):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


@torch.inference_mode()
def _timed(model, ids: torch.Tensor, new_tokens: int) -> float:
    torch.cuda.synchronize()
    started = time.perf_counter()
    model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    torch.cuda.synchronize()
    return time.perf_counter() - started


def decode_and_prefill(
    model, batch: int, vocab: int, prompt_len: int = 1024, new_tokens: int = 128
) -> tuple[float, float]:
    """(ms per decode step, prefill tokens/s) for `batch` prompts of `prompt_len` tokens."""
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, min(vocab, 10000), (batch, prompt_len), generator=generator).cuda()
    _timed(model, ids[:, :64], 2)  # warm-up
    first = min(_timed(model, ids, 1) for _ in range(2))
    total = _timed(model, ids, new_tokens)
    return (total - first) / (new_tokens - 1) * 1000, batch * prompt_len / first


def free(model) -> None:
    del model
    torch.cuda.empty_cache()
