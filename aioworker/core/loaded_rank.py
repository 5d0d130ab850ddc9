"""What a built rank tells the torch-free side: cache geometry, lengths, the model's config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aioworker.checkpoint.model_config import ModelConfig


@dataclass(frozen=True)
class RankSpec:
    model_dir: Path
    model_config: ModelConfig
    device: str
    dtype: str
    num_blocks: int
    block_size: int
    max_model_len: int
    load_seconds: float
