import torch

from aioworker.compute.sampling.sampler import SampleRow
from aioworker.compute.step.logits import logits_stage
from aioworker.core.plan import SamplingSettings


def test_stop_tokens_are_masked_until_min_tokens_is_reached() -> None:
    logits = torch.zeros(2, 10, dtype=torch.bfloat16)
    logits[:, 3] = 100.0  # the stop token dominates
    settings = SamplingSettings(0.0, 0, 1.0, None, min_tokens=4, stop_token_ids=[3])
    early, late = SampleRow(settings, 10, 3), SampleRow(settings, 11, 4)
    staged = logits_stage(logits, [early, late])
    assert staged.dtype == torch.float32
    assert staged.argmax(dim=-1).tolist()[0] != 3 and staged[0, 3] == float("-inf")
    assert staged.argmax(dim=-1).tolist()[1] == 3
