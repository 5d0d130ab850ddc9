"""The rank process's asyncio program: sockets, state, the step loop. Never imports torch."""
