"""A checkpoint tensor's name -> the parameter that holds it here, and which part of that
parameter it is (its shard id), for every architecture in the registry.

- q/k/v and gate/up are merged into one parameter each (the model's `packed_modules`);
- experts stored one by one, `...experts.{e}.{gate_proj|up_proj|down_proj}.{suffix}` (Mixtral
  names them w1, w3, w2), go to the stacked `experts.w13_{suffix}` / `experts.w2_{suffix}`
  with shard id (e, part); stacked ones (`experts.gate_up_proj`, `experts.down_proj`) load whole;
- a few modules are named differently by one family: Mixtral's `block_sparse_moe` is our `mlp`,
  ERNIE's `shared_experts` our `shared_expert`, its `moe_statics` bias part of our `gate`.
"""

from __future__ import annotations

import re

from aioworker.compute.layers.moe.experts import DOWN, GATE, UP

_RENAMES = (
    (".block_sparse_moe.", ".mlp."),
    (".shared_experts.", ".shared_expert."),
    (".moe_statics.e_score_correction_bias", ".gate.e_score_correction_bias"),
)
_EXPERT = re.compile(
    r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<proj>gate_proj|up_proj|down_proj|w1|w3|w2)\.(?P<suffix>\w+)$"
)
_STACKED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)$")
_PARTS = {
    "gate_proj": ("w13", GATE),
    "w1": ("w13", GATE),
    "up_proj": ("w13", UP),
    "w3": ("w13", UP),
    "down_proj": ("w2", DOWN),
    "w2": ("w2", DOWN),
}


def resolve(name: str, packed: dict[str, tuple[str, int]]) -> tuple[str, object]:
    """(our parameter's name, its shard id or None)."""
    for old, new in _RENAMES:
        name = name.replace(old, new)
    expert = _EXPERT.match(name)
    if expert is not None:
        which, part = _PARTS[expert["proj"]]
        return f"{expert['prefix']}.{which}_{expert['suffix']}", (int(expert["expert"]), part)
    stacked = _STACKED.match(name)
    if stacked is not None:
        which = "w13" if stacked["proj"] == "gate_up_proj" else "w2"
        return f"{stacked['prefix']}.{which}_weight", None
    for part, (merged, shard_id) in packed.items():
        if f".{part}." in name:
            return name.replace(f".{part}.", f".{merged}."), shard_id
    return name, None


def expert_tensor_name(param_name: str, shard_id: tuple[int, str]) -> str:
    """The checkpoint name (Hugging Face's per-expert form) of one expert's part, for errors."""
    prefix, _, leaf = param_name.rpartition(".")
    suffix = leaf.split("_", 1)[1]
    expert, part = shard_id
    return f"{prefix}.{expert}.{part}_proj.{suffix}"
