"""What a built rank tells the torch-free side: the model's vocabulary, stop tokens and
tokenizer, the longest sequence, and the KV cache's geometry."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aioworker.core.detokenizer import Decodes


@dataclass(frozen=True)
class LoadedRank:
    model_dir: Path
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    num_blocks: int
    block_size: int
    device: str
    dtype: str
    load_seconds: float
    # The model's tokenizer where its directory has one (stop strings need it).
    tokenizer: Decodes | None = None
