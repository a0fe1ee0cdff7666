"""What a KV setting costs the agents: KL divergence against f16/f16 on llama-perplexity's windows, the texts it
reads, and the live check with its ledger."""
