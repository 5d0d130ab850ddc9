"""The OpenAI-compatible HTTP server: a separate, torch-free process that tokenizes, speaks the
ZeroMQ protocol to any number of worker groups through the client library, and streams answers
back as server-sent events. `aioworker api` runs it; `aioworker serve --api-port` starts it
beside the ranks."""
