"""Token sampling: greedy, temperature, top-k, top-p, per-request seeds, the
logit controls of compute/sampling/controls.py where a step's rows use them, and the sampled tokens'
logprobs (compute/sampling/logprobs.py).

Sampling draws Exp(1) noise and takes argmax(p / noise), which picks token i with probability
p_i. A seeded request draws its noise from a key derived from (seed, position of the token), so
its tokens depend on nothing else in the batch and survive preemption and recompute. On CUDA one
Triton pass draws every row from its key (compute/sampling/sample_kernel.py); on the CPU a torch generator
per seeded row does. The two draw different noise: a seed reproduces on the same kind of device.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from aioworker.compute.sampling.controls import StepControls
from aioworker.compute.sampling.logprobs import LogprobTensors, token_logprobs
from aioworker.compute.small_copies import to_device
from aioworker.core.plan import SamplingSettings

_MASK64 = (1 << 64) - 1
# Keeps the acceptance draws of speculative decoding apart from a seed's noise draws.
_UNIFORM_SALT = 0x5851F42D4C957F2D


@dataclass(slots=True)
class SampleRow:
    sampling: SamplingSettings
    position: int  # index of the token being sampled in its sequence
    num_output_tokens: int  # outputs before this one


def derive_seed(seed: int, position: int) -> int:
    """A well-mixed 63-bit seed for one (request seed, token position) pair (splitmix64)."""
    z = (seed + 0x9E3779B97F4A7C15 * (position + 1)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) >> 1


class Sampler:
    def __init__(self, seed: int, device: torch.device, one_pass: bool | None = None) -> None:
        """`one_pass`: draw with the Triton kernel (default: on CUDA)."""
        self.device = device
        self.batch_generator = torch.Generator(device=device).manual_seed(seed)
        self.unseeded_keys = random.Random(seed)
        self.draw_rows = None  # the one-pass kernel's entry, where it is used
        self.argmax_kernel = None  # and the few-rows argmax's module
        if one_pass is None:
            one_pass = device.type == "cuda"
        if one_pass:
            from aioworker.compute.sampling import argmax_kernel  # Triton enters here
            from aioworker.compute.sampling.sample_kernel import draw_rows

            self.draw_rows = draw_rows
            self.argmax_kernel = argmax_kernel

    def warm_up(self, vocab_size: int, dtype: torch.dtype = torch.float32) -> None:
        """Compile the one-pass kernel, the argmax's and the logprobs' now (the rank's WARMING
        phase), not in the step of the first request that samples or asks for logprobs.
        `dtype`: the model's, its logits'."""
        if self.draw_rows is not None:
            zeros = torch.zeros(1, vocab_size, device=self.device)
            self.draw_rows(zeros, torch.zeros(1, dtype=torch.int64, device=self.device))
            for logits in (zeros, zeros.to(dtype)):  # greedy steps read either as they are
                if self.argmax_kernel.takes(logits):
                    self.argmax_kernel.argmax_rows(logits)
            from aioworker.compute.sampling import logprob_kernel

            logprob_kernel.warm_up(vocab_size, self.device)

    def __call__(self, logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """logits: [S, V] -> sampled token ids [S] (on the logits' device)."""
        return self.sample(logits, rows)[0]

    def sample(
        self, logits: torch.Tensor, rows: list[SampleRow], controls: StepControls | None = None
    ) -> tuple[torch.Tensor, LogprobTensors | None]:
        """The sampled token ids, and their logprobs where any row asked for them. `logits`: the
        step pipeline's logits stage's output (masks applied). `controls`: the step's rows that
        use logit controls (None where none does)."""
        k = max(row.sampling.logprobs for row in rows)
        greedy = all(row.sampling.temperature == 0.0 for row in rows)
        if greedy and controls is None and k < 0:  # the argmax alone, of the logits as they are
            return self.greedy(logits), None
        logits = logits.float()
        if controls is not None:
            controls.process_logits(logits)
        if greedy:
            token_ids, scaled = self.greedy(logits), logits  # temperature 1 for logprobs
        else:
            temperatures = [row.sampling.temperature or 1.0 for row in rows]
            scaled = logits  # temperature 1 everywhere (GRPO's default) skips a pass
            if any(t != 1.0 for t in temperatures):
                scaled = logits / to_device(logits.device, temperatures)[:, None]
            token_ids = self._draw(logits, scaled, rows, controls)
        if controls is not None:
            controls.record(token_ids)
        if k < 0:
            return token_ids, None
        return token_ids, token_logprobs(scaled, token_ids, k)

    def greedy(self, logits: torch.Tensor) -> torch.Tensor:
        """Each row's first maximal token id: by the few-rows kernel where it takes the rows
        (a decode step of up to 16 on CUDA), else torch. Either dtype: widening is exact."""
        kernel = self.argmax_kernel
        if kernel is not None and kernel.takes(logits):
            return kernel.argmax_rows(logits)
        return logits.argmax(dim=-1)

    def _draw(
        self,
        logits: torch.Tensor,
        scaled: torch.Tensor,
        rows: list[SampleRow],
        controls: StepControls | None,
    ) -> torch.Tensor:
        """`scaled`: logits / temperature, 1 where greedy (those rows take the argmax)."""
        sampled_ids = self.draw(self.truncate(scaled, rows, controls), rows)
        is_greedy = [row.sampling.temperature == 0.0 for row in rows]
        if not any(is_greedy):
            return sampled_ids
        return torch.where(to_device(logits.device, is_greedy), self.greedy(logits), sampled_ids)

    @staticmethod
    def truncate(
        scaled: torch.Tensor, rows: list[SampleRow], controls: StepControls | None
    ) -> torch.Tensor:
        """min_p, top-k and top-p: -inf where a row may not draw."""
        truncated = scaled if controls is None else controls.truncate(scaled)
        return _apply_top_k_top_p(truncated, rows)

    def draw(self, truncated: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
        """One token per row, token i with probability softmax(truncated)_i (seeded rows from
        their (seed, position) key)."""
        if self.draw_rows is not None:
            return self.draw_rows(truncated, to_device(truncated.device, self._keys(rows)))
        probs = torch.softmax(truncated, dim=-1)
        return (probs / self._noise(rows, probs.shape[-1])).argmax(dim=-1)

    def uniforms(self, rows: list[SampleRow]) -> list[float]:
        """One uniform draw in [0, 1) per row: from (seed, position) where seeded, so that a
        seeded request's speculative acceptances reproduce; a stream apart from the noise."""
        return [
            random.Random(derive_seed(row.sampling.seed ^ _UNIFORM_SALT, row.position)).random()
            if row.sampling.seed is not None
            else self.unseeded_keys.random()
            for row in rows
        ]

    def _keys(self, rows: list[SampleRow]) -> list[int]:
        """Each row's 63-bit noise key: from (seed, position) where seeded, else fresh."""
        return [
            derive_seed(row.sampling.seed, row.position)
            if row.sampling.seed is not None
            else self.unseeded_keys.getrandbits(63)
            for row in rows
        ]

    def _noise(self, rows: list[SampleRow], vocab_size: int) -> torch.Tensor:
        noise = torch.empty(len(rows), vocab_size, device=self.device)
        seeded = [
            i
            for i, row in enumerate(rows)
            if row.sampling.seed is not None and row.sampling.temperature > 0.0
        ]
        if len(seeded) < len(rows):  # a batch of seeded rows skips the draw it would overwrite
            _exponentials(noise, self.batch_generator)
        for i in seeded:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(derive_seed(rows[i].sampling.seed, rows[i].position))
            _exponentials(noise[i], generator)
        return noise.clamp_min_(torch.finfo(noise.dtype).tiny)


def _exponentials(out: torch.Tensor, generator: torch.Generator) -> None:
    """Exp(1) draws in place, as -log(1 - U): torch's vectorised uniforms and log1p took a
    49,152-token row 0.18 ms on the CPU, against 0.86 for exponential_ (60 seeded rows of the
    embedded model decode 1.55x faster: docs/benchmarks.md)."""
    out.uniform_(generator=generator).neg_().log1p_().neg_()


def _apply_top_k_top_p(logits: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    top_k = [row.sampling.top_k for row in rows]
    top_p = [row.sampling.top_p for row in rows]
    if not any(top_k) and all(p >= 1.0 for p in top_p):
        return logits
    sorted_logits, sorted_ids = logits.sort(dim=-1, descending=True, stable=True)
    ranks = torch.arange(logits.shape[-1], device=logits.device)[None, :]
    k = to_device(logits.device, [k or logits.shape[-1] for k in top_k])[:, None]
    sorted_logits = sorted_logits.masked_fill(ranks >= k, float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    # top_p == 1 must keep everything, even where rounding pushes the cumulative mass past 1.
    p = to_device(logits.device, [p if p < 1.0 else float("inf") for p in top_p])[:, None]
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    sorted_logits = sorted_logits.masked_fill(mass_before >= p, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, sorted_ids, sorted_logits)
