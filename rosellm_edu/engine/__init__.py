"""The engine: `LLMEngine` takes requests, the `Scheduler` batches them over the `BlockManager`'s KV blocks, the
`ModelRunner` runs the model, the sampler picks tokens; `AsyncLLMEngine` runs it in a thread for a server."""
