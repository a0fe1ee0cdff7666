"""The model and what a step reads of it: KV types (K and V apart), the bytes model (weights, cache, windows,
experts, recurrent state), the GGUF header and llama.cpp's per-architecture rules, the facts a run starts
from, the simulated cards' profiles, the default model, a setting as other engines' flags."""
