"""Every message on the wire: versioned msgspec Structs, one tagged union per channel.

A message travels as two frames: the protocol version (one byte) and the msgpack body. Decoders
are built once per channel; anything that fails to decode raises `ProtocolError` with a reason
the receiver can send back or count. No pickle anywhere.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from aioworker.core.outputs import RequestOutput
from aioworker.core.plan import StepPlan
from aioworker.core.sampling_params import SamplingParams
from aioworker.core.weights_phase import IpcTensor, WeightsOp, WeightsPhase
from aioworker.wire.admin_commands import ADMIN_COMMANDS

# 2: outputs are core RequestOutputs; weights phases travel as one core WeightsPhase.
# 3: logprobs, stop strings and error kinds. 4: parallel samples (n, sample_index) and prefix
# cache figures in heartbeats. 5: the driver's max_model_len in heartbeats; a submit's reply_to
# before its prompt (wire/submit_head.py); logit controls in SamplingParams and the plan's
# sampling settings; NewSeq carries the tokens seen where penalties or bad words need them.
# 6: speculative decoding: plans carry draft counts (StepPlan.num_draft_tokens), results are
# ragged (StepResult.num_sampled), and speculation figures travel in heartbeats. 7: drafts
# made on the executor (StepPlan.num_next_drafts asks, StepResult.next_drafts answers).
# 8: each rank's quantization and weight bytes (held, read per step) in heartbeats and PeerReady.
# 9: guided decoding (SamplingParams.guided; SamplingSettings.guided in plans).
# 10: the driver's host KV tier figures in heartbeats (a monitor of 9 would refuse the fields).
PROTOCOL_VERSION = 10
VERSION_FRAME = bytes([PROTOCOL_VERSION])

# Upper bounds checked at decode time so a hostile frame cannot make us allocate without limit.
MAX_FRAME_BYTES = 64 << 20
MAX_REQUEST_ID_LENGTH = 256


class ProtocolError(ValueError):
    """A frame could not be decoded; the message says why."""


class _Message(
    msgspec.Struct, frozen=True, kw_only=True, tag_field="type", forbid_unknown_fields=True
):
    pass


# -- task channel: clients -> driver (PUSH -> PULL) ---------------------------------------------


class SubmitRequest(_Message, tag="submit"):
    # request_id and reply_to come first: encoded in this order, a frame too large to decode is
    # still answered from its head (wire/submit_head.py reads them and the prompt's length).
    request_id: str
    # Where the driver PUSHes this request's outputs (the client's bound PULL endpoint).
    reply_to: str
    prompt_token_ids: list[int]
    params: SamplingParams
    # Seconds after admission when the group aborts the request, finished or not.
    timeout_s: float | None = None


class AbortRequest(_Message, tag="abort"):
    request_id: str


TaskMessage = SubmitRequest | AbortRequest

# -- results: driver -> client (PUSH -> the client's PULL) ----------------------------------------


class Outputs(_Message, tag="outputs"):
    """What one step produced for one client's requests (or one request's terminal output)."""

    group: int
    outputs: list[RequestOutput]


class Rejected(_Message, tag="rejected"):
    """A task frame refused without ending any request: one that could not be decoded, or a
    second submit of a request id this client has in flight (`request_id` names it; the first
    request runs on, and its stream is not touched)."""

    reason: str
    request_id: str = ""


ResultMessage = Outputs | Rejected

# -- control: driver -> peers (XPUB -> SUB) -------------------------------------------------------


class PlanMessage(_Message, tag="plan"):
    plan: StepPlan


class TensorMeta(msgspec.Struct, frozen=True, array_like=True, forbid_unknown_fields=True):
    """A tensor sent as a raw little-endian frame beside the message."""

    name: str
    dtype: str
    shape: list[int]


class WeightsStatus(_Message, tag="weights"):
    """Driver -> peers: one phase of a weights update, or a memory release / resume."""

    phase: WeightsPhase


class Shutdown(_Message, tag="shutdown"):
    reason: str = ""
    # The driver failed: peers exit non-zero too, so a supervisor restarts the whole group.
    failed: bool = False


ControlMessage = PlanMessage | WeightsStatus | Shutdown

# -- acks: peers -> driver (PUSH -> PULL) ---------------------------------------------------------


class PeerReady(_Message, tag="ready"):
    rank: int
    num_blocks: int
    # What the peer's weights amount to, as in its heartbeats (the driver's `admin status`).
    quantization: str = ""
    weight_bytes_held: int = 0
    weight_bytes_read: int = 0


class PeerFailed(_Message, tag="failed"):
    rank: int
    step_id: int
    reason: str


class WeightsAck(_Message, tag="weights_ack"):
    rank: int
    op: WeightsOp
    version: int
    ok: bool
    error: str = ""
    freed_bytes: int = 0


AckMessage = PeerReady | PeerFailed | WeightsAck

# -- admin: CLI -> driver (DEALER -> ROUTER) ------------------------------------------------------

AdminCommand = Literal[tuple(ADMIN_COMMANDS)]  # type: ignore[valid-type]
UpdateMode = Literal["wait", "keep", "abort"]


class AdminRequest(_Message, tag="admin"):
    command: AdminCommand
    # The argument of commands that take one: a request id for abort, a level for set-log-level,
    # a deadline in seconds for drain, a safetensors directory for update-weights.
    argument: str = ""
    # update-weights: the new weights' version (default: the current one + 1), and what happens
    # to running requests: wait (finish them first), keep (continue them on the new weights),
    # abort. The weights come from `argument` (a directory), `ipc_tensors` (a trainer on this
    # host), or `pushed` tensors sent as raw frames after the message.
    version: int | None = None
    mode: UpdateMode = "wait"
    ipc_tensors: list[IpcTensor] = []
    pushed: list[TensorMeta] = []
    # release-memory: what to free.
    weights: bool = True
    kv_cache: bool = True


class AdminReply(_Message, tag="admin_reply"):
    ok: bool
    message: str = ""
    data: dict[str, Any] = {}


AdminMessage = AdminRequest

# -- heartbeat: every rank -> monitors (PUB -> SUB) -----------------------------------------------


class Heartbeat(_Message, tag="heartbeat"):
    group: int
    rank: int
    pid: int
    state: str
    step_id: int
    # Seconds the current step has been running (0 between steps).
    step_elapsed_s: float
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    tokens_per_s: float
    weights_version: int
    interval_s: float
    sent_at: float
    # Why the rank failed, when state is FAILED.
    detail: str = ""
    # Prefix caching (driver only): blocks with a content address; prompt tokens found already
    # computed, and looked up, since the rank started.
    kv_blocks_cached: int = 0
    prefix_hit_tokens: int = 0
    prefix_queried_tokens: int = 0
    # The longest prompt plus output the group takes (driver only, once loaded; 0 before): a
    # client refuses a longer prompt itself instead of sending it.
    max_model_len: int = 0
    # Speculative decoding (driver only, since the rank started): drafts verified, drafts
    # accepted, and sequences verified (one per sequence per step with drafts).
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_verified: int = 0
    # Every rank, once loaded ("" and 0 before): the linear method of its decoder projections
    # (shown as it is), the bytes of every weight tensor it holds, and those a decode step reads.
    quantization: str = ""
    weight_bytes_held: int = 0
    weight_bytes_read: int = 0
    # MoE models (every rank): its experts ("experts 0-63 of 128 (expert parallel)"), the first
    # one's index, tokens routed to each since it started (summed over its MoE layers), and the
    # steps and MoE layers those counts cover: core/expert_load.py reads them.
    expert_layout: str = ""
    expert_first: int = 0
    expert_tokens: list[int] = []
    expert_steps: int = 0
    expert_layers: int = 0
    # The host KV tier (driver only; 0 without one). Its blocks: all, in use (cached prefixes,
    # swapped-out sequences, copies in flight), holding cached prefixes. Since the rank started:
    # prefix blocks loaded back from the host and copied to it, preempted sequences swapped out
    # and back in, copies that failed, and the bytes and milliseconds of copies each way (of the
    # driver's shard under tensor parallelism).
    host_kv_blocks_total: int = 0
    host_kv_blocks_used: int = 0
    host_kv_blocks_cached: int = 0
    host_kv_hit_blocks: int = 0
    host_kv_saved_blocks: int = 0
    host_kv_swaps_out: int = 0
    host_kv_swaps_in: int = 0
    host_kv_copy_failures: int = 0
    host_kv_bytes_saved: int = 0
    host_kv_bytes_loaded: int = 0
    host_kv_ms_saving: float = 0.0
    host_kv_ms_loading: float = 0.0

    @property
    def spec_acceptance_rate(self) -> float:
        return self.spec_accepted_tokens / self.spec_draft_tokens if self.spec_draft_tokens else 0.0

    @property
    def spec_mean_accepted_length(self) -> float:
        """Tokens a sequence gets per verifying step: its accepted drafts and one more."""
        return 1.0 + self.spec_accepted_tokens / self.spec_verified if self.spec_verified else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return (
            self.prefix_hit_tokens / self.prefix_queried_tokens
            if self.prefix_queried_tokens
            else 0.0
        )


# -- encoding -------------------------------------------------------------------------------------

_ENCODER = msgspec.msgpack.Encoder()


def encode(message: msgspec.Struct) -> list[bytes]:
    return [VERSION_FRAME, _ENCODER.encode(message)]


class Decoder:
    """Decodes [version, body] frames into one channel's union; raises ProtocolError."""

    def __init__(self, union: Any) -> None:
        self._decoder = msgspec.msgpack.Decoder(union)

    def decode(self, frames: list[bytes]) -> Any:
        if len(frames) != 2:
            raise ProtocolError(f"expected 2 frames (version, body), got {len(frames)}")
        version, body = frames
        if version != VERSION_FRAME:
            shown = version[0] if len(version) == 1 else repr(bytes(version[:8]))
            raise ProtocolError(
                f"unsupported protocol version {shown}; this worker speaks {PROTOCOL_VERSION}"
            )
        if len(body) > MAX_FRAME_BYTES:
            raise ProtocolError(
                f"message of {len(body)} bytes exceeds the limit of {MAX_FRAME_BYTES}"
            )
        try:
            return self._decoder.decode(body)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"malformed message: {exc}") from exc


TASK_DECODER = Decoder(TaskMessage)
RESULT_DECODER = Decoder(ResultMessage)
CONTROL_DECODER = Decoder(ControlMessage)
ACK_DECODER = Decoder(AckMessage)
ADMIN_DECODER = Decoder(AdminMessage)
ADMIN_REPLY_DECODER = Decoder(AdminReply)
HEARTBEAT_DECODER = Decoder(Heartbeat)
