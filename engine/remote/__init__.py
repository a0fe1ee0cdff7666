"""Remote engines: serve this engine over HTTP, and read engines elsewhere (swarmtune, llama-server, vLLM)."""
