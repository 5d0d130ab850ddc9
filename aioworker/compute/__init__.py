"""The device side: the executor thread, model runners, layers, models, KV cache, sampler and
weights. The only folder that imports torch; it never touches a socket."""
