"""Each model family's reply format: how its tool calls and its reasoning are written, read back into
OpenAI's `tool_calls`, `reasoning_content` and `content`, whole or as a stream (formats/stream.py).

One module a family; registry.py picks one from the model's chat template, as llama.cpp's server does."""
