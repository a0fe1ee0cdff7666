"""A synthetic GGUF for timing: random Q4_0 weights in a chosen attention shape, a real tokenizer.

Decode throughput depends on the bytes a step reads (W, and k per cached token), not on what the
weights mean, so a model of the right shape times like the real one. The tokenizer is copied from
another GGUF (the default model, or the tokenizer-only file `extract-tokenizer` makes from it),
so the chat template and the tokens are real. The header says the model is synthetic.

    python bench/gpu/synth_model.py extract-tokenizer SRC.gguf DST.gguf
    python bench/gpu/synth_model.py write --shape seed --tokenizer TOK.gguf OUT.gguf
"""

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

ARCH = "qwen3"
Q4_0_BLOCK = 32  # values per block
Q4_0_BYTES = 18  # f16 scale + 16 bytes of 4-bit values
MARK_KEY = "swarmtune.synthetic"  # a JSON string: the shape and seed the file was written with
WRITER_VERSION = 1


@dataclass(frozen=True)
class Shape:
    name: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_ctx: int
    about: str

    @property
    def kv_bytes_per_token_f16(self) -> int:
        """K and V, f16, over all layers: what engine.model_facts should read back."""
        return self.n_layer * self.n_head_kv * 2 * self.head_dim * 2

    def weight_bytes(self, n_vocab: int) -> int:
        """W as engine.model_facts counts it (untied output: token_embd is looked up, not read in full)."""
        e, q, kv = self.n_embd, self.n_head * self.head_dim, self.n_head_kv * self.head_dim
        q4 = (2 * e * q + 2 * e * kv + 3 * e * self.n_ff) * Q4_0_BYTES // Q4_0_BLOCK
        norms = (2 * e + 2 * self.head_dim) * 4
        return self.n_layer * (q4 + norms) + n_vocab * e * Q4_0_BYTES // Q4_0_BLOCK + e * 4


SHAPES = {
    # Qwen3-8B's attention (36 layers, 32 query heads, 8 KV heads of 128: k = 147,456 B per f16 token).
    # The FFN is widened from Qwen3-8B's 12,288 to 18,176 so that, with SmolLM2's 49,152-token vocabulary
    # and an untied output head, W is 5.49 GB: the seed's 5.5 GB and 147 KB, so its table compares directly.
    "seed": Shape("seed", 36, 4096, 32, 8, 128, 18176, 40960,
                  "Qwen3-8B attention shape, FFN widened so W matches the seed's 5.5 GB"),
    # small enough for CI on two cores: the same writer, the same tokenizer
    "tiny": Shape("tiny", 2, 256, 4, 2, 64, 512, 4096, "a two-layer model for the CPU path and the tests"),
}


def _gguf():
    try:
        import gguf
    except ImportError:
        sys.exit("synth_model: the gguf package is not installed")
    return gguf


def tokenizer_fields(path: Path):
    """The tokenizer.* fields of a GGUF (a full model or a tokenizer-only file)."""
    gguf = _gguf()
    reader = gguf.GGUFReader(path)
    fields = [f for name, f in reader.fields.items() if name.startswith("tokenizer.")]
    if not any(f.name == "tokenizer.ggml.tokens" for f in fields):
        raise SystemExit(f"synth_model: {path} holds no tokenizer (no tokenizer.ggml.tokens)")
    return reader, fields


def _copy_fields(writer, fields) -> int:
    gguf = _gguf()
    n_tokens = 0
    for f in fields:
        main = f.types[0]
        value = f.contents()
        if main == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(f.name, value, main, sub_type=f.types[-1])
        else:
            writer.add_key_value(f.name, value, main)
        if f.name == "tokenizer.ggml.tokens":
            n_tokens = len(value)
    return n_tokens


def extract_tokenizer(src: Path, dst: Path) -> int:
    """Write a tensor-free GGUF holding only src's tokenizer (llama.cpp can load it vocab-only)."""
    gguf = _gguf()
    reader, fields = tokenizer_fields(src)
    arch = reader.fields["general.architecture"].contents()
    name = reader.fields["general.name"].contents() if "general.name" in reader.fields else src.stem
    tmp = dst.with_name(dst.name + ".part")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(f"tokenizer of {name}")
    w.add_description(f"tokenizer only, extracted from {src.name} by swarmtune's bench/gpu/synth_model.py")
    n = _copy_fields(w, fields)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, dst)
    return n


def q4_0_blocks(rng: np.random.Generator, rows: int, n_in: int) -> np.ndarray:
    """rows x n_in weights as valid Q4_0 bytes: finite f16 scales sized so activations stay O(1)."""
    if n_in % Q4_0_BLOCK:
        raise ValueError(f"Q4_0 needs a multiple of {Q4_0_BLOCK} inputs (got {n_in})")
    nb = n_in // Q4_0_BLOCK
    # value = d * (q - 8) with q uniform on 0..15 has std ~4.61 d; aim at std 0.5 / sqrt(n_in)
    base = 0.5 / (np.sqrt(n_in) * 4.61)
    d = (base * rng.uniform(0.5, 1.5, size=(rows, nb))).astype(np.float16)
    out = np.empty((rows, nb, Q4_0_BYTES), dtype=np.uint8)
    out[:, :, :2] = d.view(np.uint8).reshape(rows, nb, 2)
    out[:, :, 2:] = rng.integers(0, 256, size=(rows, nb, Q4_0_BYTES - 2), dtype=np.uint8)
    return out.reshape(rows, nb * Q4_0_BYTES)


def read_mark(path: Path) -> dict | None:
    """The shape and seed a synthetic model was written with, or None for any other file."""
    if not path.is_file():
        return None
    try:  # swarmtune's header reader skips the tokenizer's arrays: 0.01 s, where GGUFReader takes 2-4 s
        from swarmtune.engine.model.gguf_header import GGUFHeader as Reader
    except ImportError:
        Reader = _gguf().GGUFReader
    try:
        f = Reader(path).fields.get(MARK_KEY)
    except Exception:
        return None
    return json.loads(f.contents()) if f is not None else None


def write_model(out: Path, shape: Shape, tokenizer: Path, seed: int = 0) -> dict:
    """Write the model (to a .part file, renamed when complete). Returns what was written."""
    gguf = _gguf()
    t0 = time.perf_counter()
    _, fields = tokenizer_fields(tokenizer)
    rng = np.random.default_rng(seed)
    tmp = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(str(tmp), ARCH)
    w.add_name(f"synthetic {shape.name}: random Q4_0 weights, not a language model")
    w.add_description(
        f"SYNTHETIC model for timing only, written by swarmtune's bench/gpu/synth_model.py: random Q4_0 weights "
        f"({shape.about}), tokenizer copied from {tokenizer.name}. Its output is noise.")
    mark = {"writer": WRITER_VERSION, "seed": seed, "tokenizer": tokenizer.name, **asdict(shape)}
    w.add_string(MARK_KEY, json.dumps(mark, sort_keys=True))
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    n_vocab = _copy_fields(w, fields)

    # One random block pattern per weight shape, shared by every layer: the bytes are what a step reads.
    pool: dict[tuple[int, int], np.ndarray] = {}

    def q4(name: str, rows: int, n_in: int) -> None:
        if (rows, n_in) not in pool:
            pool[(rows, n_in)] = q4_0_blocks(rng, rows, n_in)
        w.add_tensor(name, pool[(rows, n_in)], raw_dtype=gguf.GGMLQuantizationType.Q4_0)

    def ones(name: str, n: int) -> None:
        w.add_tensor(name, np.ones(n, dtype=np.float32))

    e, q_out, kv_out = shape.n_embd, shape.n_head * shape.head_dim, shape.n_head_kv * shape.head_dim
    q4("token_embd.weight", n_vocab, e)
    ones("output_norm.weight", e)
    q4("output.weight", n_vocab, e)  # untied, like Qwen3-8B's
    for i in range(shape.n_layer):
        ones(f"blk.{i}.attn_norm.weight", e)
        q4(f"blk.{i}.attn_q.weight", q_out, e)
        q4(f"blk.{i}.attn_k.weight", kv_out, e)
        q4(f"blk.{i}.attn_v.weight", kv_out, e)
        q4(f"blk.{i}.attn_output.weight", e, q_out)
        ones(f"blk.{i}.attn_q_norm.weight", shape.head_dim)
        ones(f"blk.{i}.attn_k_norm.weight", shape.head_dim)
        ones(f"blk.{i}.ffn_norm.weight", e)
        q4(f"blk.{i}.ffn_gate.weight", shape.n_ff, e)
        q4(f"blk.{i}.ffn_up.weight", shape.n_ff, e)
        q4(f"blk.{i}.ffn_down.weight", e, shape.n_ff)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    return {"path": str(out), "bytes": out.stat().st_size, "n_vocab": n_vocab, "seconds": time.perf_counter() - t0,
            "kv_bytes_per_token_f16": shape.kv_bytes_per_token_f16, **mark}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="synth_model.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("extract-tokenizer", help="copy a GGUF's tokenizer into a tensor-free GGUF")
    ex.add_argument("src", type=Path)
    ex.add_argument("dst", type=Path)
    wr = sub.add_parser("write", help="write a synthetic model")
    wr.add_argument("out", type=Path)
    wr.add_argument("--shape", choices=sorted(SHAPES), required=True)
    wr.add_argument("--tokenizer", type=Path, required=True, help="a GGUF whose tokenizer.* fields to copy")
    wr.add_argument("--seed", type=int, default=0)
    wr.add_argument("--reuse", action="store_true", help="keep OUT if it was written with this shape and seed")
    args = p.parse_args(argv)
    if args.cmd == "extract-tokenizer":
        if not args.src.is_file():
            sys.exit(f"synth_model: no such file: {args.src}")
        n = extract_tokenizer(args.src, args.dst)
        print(f"tokenizer: {n} tokens from {args.src.name} -> {args.dst} ({args.dst.stat().st_size:,} B)")
        return 0
    if not args.tokenizer.is_file():
        sys.exit(f"synth_model: no such tokenizer file: {args.tokenizer}")
    if not args.out.parent.is_dir():
        sys.exit(f"synth_model: folder {args.out.parent} does not exist")
    shape = SHAPES[args.shape]
    mark = read_mark(args.out) if args.reuse else None
    if mark is not None and mark == {"writer": WRITER_VERSION, "seed": args.seed, "tokenizer": args.tokenizer.name,
                                     **asdict(shape)}:
        print(f"model: reusing {args.out} ({args.out.stat().st_size / 1e9:.2f} GB, shape {shape.name})")
        return 0
    info = write_model(args.out, shape, args.tokenizer, args.seed)
    print(f"model: wrote {args.out} ({info['bytes'] / 1e9:.3f} GB, shape {shape.name}, {info['n_vocab']} tokens, "
          f"k(f16) {info['kv_bytes_per_token_f16']:,} B/token) in {info['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
