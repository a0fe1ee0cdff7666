"""What runs the steps: the backend protocol and its clock, llama.cpp's (through ctypes), a simulated card's, and
the KV conversions and splices a live switch and a reuse past an edit need."""
