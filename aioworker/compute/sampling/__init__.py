"""Sampling on the device: the sampler and its one-pass kernel, logprobs and their kernel, and
the logit controls (penalties, min_p, bias and allowed ids, bad words) with the per-sequence slots
that hold their state."""
