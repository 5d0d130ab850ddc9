"""Requests in, plans out, outputs back: the scheduler, the block manager and the engine core.
Plain Python: never torch, never a socket."""
