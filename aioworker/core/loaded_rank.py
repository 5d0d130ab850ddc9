"""What a built rank tells the torch-free side: the model's vocabulary, stop tokens and
tokenizer, the longest sequence, the KV cache's geometry, and what its weights amount to."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aioworker.core.detokenizer import Decodes
from aioworker.core.expert_load import ExpertLoad
from aioworker.core.grammar import GrammarBackend


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
    # The decoder projections' linear method ("none", "wint4", ...: shown as it is), the bytes of
    # every weight tensor this rank holds (derived copies and a separate draft's included), and
    # the bytes of weight one decode step reads (compute/weights/summary.py).
    quantization: str = ""
    weight_bytes_held: int = 0
    weight_bytes_read: int = 0
    # Compiles guided requests' grammars against the tokenizer (on the driver), else None.
    grammars: GrammarBackend | None = None
    # MoE models: the latest reading of tokens routed to this rank's experts (any thread).
    expert_load: Callable[[], ExpertLoad] | None = None
    # The host KV tier (cache.host_kv_bytes): its blocks (0: none), and one block's bytes on
    # this rank, every layer's K and V.
    num_host_blocks: int = 0
    kv_block_bytes: int = 0
