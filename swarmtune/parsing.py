"""The command line: every subcommand's flags, parsed into what the factories and commands take. A bad
flag ends in one line on stderr and exit status 2."""

import argparse
import math
import sys
from collections.abc import Callable
from typing import NoReturn

import swarmtune
from swarmtune.engine.conversation.chunk_reuse import DEFAULT_MIN_TOKENS
from swarmtune.engine.errors import UserError
from swarmtune.engine.kv.types import KVSetting, parse_kv_list
from swarmtune.engine.settings import AUTO_DRAFT_TOKENS, STALL_DECODE_STEPS

EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"swarmtune: {message}", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _positive_int(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number (got {text!r})") from None
        if v < 1:
            raise argparse.ArgumentTypeError(f"{name} must be at least 1 (got {v})")
        return v
    return parse


def _kv_setting(text: str) -> KVSetting:
    """--kv: the KV setting read here, once, where it enters (a bad one is the engine's own line)."""
    try:
        return KVSetting.parse(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _kv_settings(text: str) -> tuple[KVSetting, ...]:
    """A comma-separated list of KV settings, one of each, in the order named."""
    try:
        return parse_kv_list(text)
    except UserError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _whole(name: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a whole number (got {text!r})") from None
    return parse




def _draft(text: str) -> tuple[int, bool]:
    """--draft N or auto: (the most tokens an agent drafts, whether the measured rule picks each one's)."""
    if text == "auto":
        return AUTO_DRAFT_TOKENS, True
    try:
        return int(text), False
    except ValueError:
        raise argparse.ArgumentTypeError(f"--draft must be a whole number or auto (got {text!r})") from None


def _at_least_zero(name: str) -> Callable[[str], int]:
    whole = _whole(name)

    def parse(text: str) -> int:
        n = whole(text)
        if n < 0:
            raise argparse.ArgumentTypeError(f"{name} must be 0 (off) or more (got {n})")
        return n
    return parse


def _stall(text: str) -> float | str | None:
    """--max-stall-ms MS, auto or off: the bound in milliseconds, "auto", or None."""
    if text in ("auto", "off"):
        return "auto" if text == "auto" else None
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"--max-stall-ms must be a number above 0, auto or off (got {text!r})")
    return v


def _finite(name: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = math.nan
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{name} must be a number (got {text!r})")
        return v
    return parse


def _kv_quality(text: str) -> float | str:
    if text.strip().lower() == "off":
        return "off"
    try:
        v = float(text)
    except ValueError:
        v = math.nan
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"--kv-quality takes a KL in nats (a finite number >= 0) or off, not {text!r}")
    return v


def _int_list(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers (got {text!r})") from None
    if not out or min(out) < 0:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers >= 0 (got {text!r})")
    return out


def add_engine_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M)")
    g.add_argument("--sim", metavar="PROFILE", help="no model: simulate a hardware profile ('swarmtune profiles')")
    # agents and the batch cap are checked with the engine's own words (engine/settings.py)
    g.add_argument("--agents", type=_whole("--agents"), default=8)
    g.add_argument("--batch-cap", type=_whole("--batch-cap"), default=None,
                   help="agents per decode step (default: all)")
    g.add_argument("--kv", type=_kv_setting, default="f16",
                   help="KV cache type: f16, q8_0, q4_0, ...; K/V apart: q8_0/f16")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--ctx", type=_positive_int("--ctx"), default=None, help="context limit per agent, tokens")
    g.add_argument("--gen-tokens", type=_positive_int("--gen-tokens"), default=64, help="T: tokens per turn")
    g.add_argument("--tool-tokens", type=_positive_int("--tool-tokens"), default=192, help="M: tool result tokens")
    g.add_argument("--tool-latency", type=_finite("--tool-latency"), default=0.0, metavar="MEDIAN_S",
                   help="agents wait for each tool call: lognormal latency with this median, seconds, drawn from "
                        "the seed (default 0: the result arrives at once)")
    g.add_argument("--tool-latency-sigma", type=_finite("--tool-latency-sigma"), default=1.0,
                   help="the tool latency's lognormal sigma (default 1.0)")
    g.add_argument("--residency", default="keep",
                   help="where a waiting agent's history lives: keep (in the KV cache), swap (to host memory and "
                        "back, no re-prefill) or drop (re-prefilled on return)")
    g.add_argument("--swap-limit-mb", type=_finite("--swap-limit-mb"), default=None,
                   help="host memory for swapped-out histories; past it the least recently served goes (its agent "
                        "is prefilled again on return). Default: no bound")
    g.add_argument("--autotune", metavar="OBJECTIVE", default=None,
                   help="let the tuner hold the best batch cap, KV type and residency: tokens_per_s, "
                        "joules_per_token, or floor:X (tokens/s with no agent below X tok/s); 't' in the dashboard")
    g.add_argument("--tune-kv", type=_kv_settings, default=None, metavar="LIST",
                   help="KV settings the tuner may use, each a type or K/V, e.g. f16,q8_0,q8_0/f16 (default on a "
                        "model: any whose measured KL is within --kv-quality; on --sim: only --kv)")
    g.add_argument("--kv-quality", type=_kv_quality, default=None, metavar="KL",
                   help="the most mean KL divergence (nats per token, against f16/f16, measured live on the "
                        "agents' own histories) a KV setting the tuner picks may cost; 'off': speed alone decides "
                        "(default 0.01 on a model; see 'swarmtune quality')")
    g.add_argument("--power-cap-w", type=_finite("--power-cap-w"), default=None,
                   help="the tuner keeps mean power under this many watts (measured or modeled)")
    g.add_argument("--kv-budget-mb", type=_finite("--kv-budget-mb"), default=None,
                   help="KV memory for the whole swarm (preempts beyond)")
    g.add_argument("--threads", type=_positive_int("--threads"), default=None)
    g.add_argument("--gpu-layers", type=_whole("--gpu-layers"), default=None, metavar="N",
                   help="layers offloaded to the build's GPU (default: all; 0 keeps the model, its cache and "
                        "every op on the CPU). A CPU build offloads none")
    g.add_argument("--extra-bufts", action="store_true",
                   help="llama.cpp's extra buffer types (weight repacking); off by default: they crash AMX CPUs")
    g.add_argument("--host-sampling", action="store_true",
                   help="draw every agent's token on the host from its logits, not in llama.cpp's graph")
    g.add_argument("--moe-routing", action="store_true",
                   help="MoE models: count the distinct experts each decode step routes to (measured, through an "
                        "eval callback; it cost 3-27%% of step time on a 2-core CPU, so off by default: uniform "
                        "routing, modeled)")
    g.add_argument("--no-kv-convert", action="store_true",
                   help="a KV switch prefills every history again instead of converting the cached K and V")
    g.add_argument("--draft", type=_draft, default=(0, False), metavar="N|auto",
                   help="speculation: each agent drafts up to N tokens from its own and the swarm's text (n-gram "
                        "lookup) and a decode step verifies them; greedy output is unchanged (default 0: off). "
                        f"auto: up to {AUTO_DRAFT_TOKENS}, each agent's length where measured step times say it pays")
    g.add_argument("--draft-model", metavar="GGUF", default=None,
                   help="speculation drafts from this smaller model instead of the agents' text (llama-server's "
                        "--model-draft; it must share the model's vocabulary); without --draft, --draft auto")
    g.add_argument("--max-stall-ms", type=_stall, default="auto", metavar="MS|auto|off",
                   help="while agents decode, cut a prefill chunk to what the run's timed chunks say takes at most "
                        "MS, so no decoding agent waits longer between tokens for it; auto: "
                        f"{STALL_DECODE_STEPS}x what a chunk adds to the prompt's wait (a decode step, the call's own "
                        "cost), measured (default); off: whole chunks")
    g.add_argument("--mix", choices=("auto", "on", "off"), default="auto",
                   help="a decode step carries the next prefill chunk in the same call (on), never (off), or where "
                        "the measured step times say it pays, on a device; two calls on the CPU (auto)")
    g.add_argument("--no-reference", action="store_true",
                   help="no interleaved batch-1 reference steps (then no measured speedup)")
    g.add_argument("--check", action="store_true",
                   help="after every step, check that each agent's cache holds exactly its history")
    g.add_argument("--power", default="auto", help="power source: auto, or one 'swarmtune power' lists")


def add_attach_flags(p: argparse.ArgumentParser, required: bool) -> None:
    g = p.add_argument_group("remote engine")
    if required:
        g.add_argument("url", help="e.g. http://gpu-box:8765 (swarmtune serve), :8080 (llama-server), :8000 (vLLM)")
    else:
        g.add_argument("--attach", dest="url", metavar="URL", default=None, help="record a remote engine instead")
    g.add_argument("--token", default=None, help="bearer token for swarmtune serve (or SWARMTUNE_TOKEN)")
    g.add_argument("--gguf", default=None, help="read W and k from this model file (llama-server, vLLM)")
    g.add_argument("--weight-bytes", type=float, default=None, help="W, when the remote does not tell")
    g.add_argument("--kv-bytes-per-token", type=float, default=None, help="k, when the remote does not tell")


def add_serving_flags(p: argparse.ArgumentParser, dashboard: bool) -> None:
    g = p.add_argument_group("serving" if dashboard else "server")
    g.add_argument("--clients", action="store_true",
                   help="the agents are your HTTP clients: each conversation sent to the OpenAI-compatible "
                        "/v1/chat/completions is an agent (default: the synthetic swarm)"
                        + ("; the dashboard serves the API itself" if dashboard else ""))
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    g.add_argument("--token", default=None, help="bearer token, the clients' API key (or SWARMTUNE_TOKEN); "
                                                 "required off loopback")
    g.add_argument("--allow-host", dest="allow_hosts", action="append", default=[], metavar="NAME",
                   help="without a token, also answer requests whose Host is NAME (loopback names always are; "
                        "'*' any); repeatable")
    g.add_argument("--allow-origin", dest="allow_origins", action="append", default=[], metavar="ORIGIN",
                   help="let browser pages from ORIGIN (e.g. http://localhost:3000; '*' any) call the API; "
                        "repeatable")
    g.add_argument("--hide-text", action="store_true",
                   help="the API's step records (/v1/state, /v1/steps) carry no conversation text: each agent's "
                        "tail is empty (a --record file keeps it)")
    g.add_argument("--max-queue", type=_positive_int("--max-queue"), default=64,
                   help="--clients: requests waiting for an agent, at most; past it, 503 with Retry-After")
    g.add_argument("--cache-reuse", type=_at_least_zero("--cache-reuse"), default=DEFAULT_MIN_TOKENS, metavar="N",
                   help="--clients: past the first token a prompt changed, keep runs of at least N of the "
                        "conversation's old cells that reappear later, shifted into place, rather than prefill "
                        f"them (as llama-server's --cache-reuse; default {DEFAULT_MIN_TOKENS}, 0: off)")
    g.add_argument("--on-overflow", choices=("error", "trim-front"), default="error",
                   help="--clients: a chat prompt past an agent's context gets the error its SDK knows (error), or "
                        "loses its oldest messages, system prompt and tools kept, until it fits; the response's "
                        "`swarmtune.trimmed` says how many and their tokens (trim-front)")
    g.add_argument("--reasoning-format", choices=("auto", "none"), default="auto",
                   help="--clients: a reply's reasoning (<think>, a thought channel) goes out apart, as "
                        "reasoning_content, thinking blocks or reasoning items (auto), or stays in the content "
                        "as the model wrote it (none); as llama-server's flag")
    g.add_argument("--chat-template-file", default=None, metavar="FILE",
                   help="--clients: render chats with this Jinja template instead of the GGUF's own (many GGUFs "
                        "ship a broken one); its markers also say which family's tool calls replies are read for")
    g.add_argument("--record", dest="record_path", default=None,
                   help="also write every step and every served request to this file (JSON lines)")
    g.add_argument("--transcript", dest="transcript_path", default=None,
                   help="--clients: append each served turn's tokens (prompt, then what it generated) to this "
                        "JSONL file, for 'swarmtune quality --transcript'")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="swarmtune", description="Tune an agent swarm that shares one GPU (or CPU).")
    p.add_argument("--version", action="version", version=f"swarmtune {swarmtune.__version__}")
    sub = p.add_subparsers(dest="command", parser_class=Parser)
    run = sub.add_parser("run", help="the live dashboard (the default)")
    add_engine_flags(run)
    add_serving_flags(run, dashboard=True)
    rec = sub.add_parser("record", help="run headless, one JSON line per step")
    add_engine_flags(rec)
    rec.add_argument("-o", "--output", required=True, help="recording file (JSON lines)")
    add_attach_flags(rec, required=False)
    lim = rec.add_mutually_exclusive_group()
    lim.add_argument("--steps", type=_positive_int("--steps"), default=None)
    lim.add_argument("--duration", type=_finite("--duration"), default=None, help="seconds")
    sw = sub.add_parser("sweep", help="decode throughput over batch sizes x contexts")
    add_engine_flags(sw)
    sw.add_argument("--batch", type=_int_list, default=None, help="e.g. 1,2,4,8")
    sw.add_argument("--contexts", type=_int_list, default=None, help="e.g. 64,512,2048")
    sw.add_argument("--steps", type=_positive_int("--steps"), default=8, help="timed decode steps per point")
    sw.add_argument("--json", dest="json_path", help="write the rows as JSON")
    sw.add_argument("--png", dest="png_path", help="write a figure of speedup vs context")
    sw.add_argument("--check-copy", action="store_true",
                    help="also time separately prefilled agents at the largest point, against copied caches")
    sv = sub.add_parser("serve", help="the engine headless behind an HTTP API")
    add_engine_flags(sv)
    add_serving_flags(sv, dashboard=False)
    at = sub.add_parser("attach", help="the dashboard on a remote engine: swarmtune serve, llama-server or vLLM")
    add_attach_flags(at, required=True)
    fl = sub.add_parser("fleet", help="every swarmtune node a Prometheus server scrapes, in one dashboard, with "
                                      "controls to one node or to all")
    fl.add_argument("url", help="the Prometheus server, e.g. http://127.0.0.1:9090")
    fl.add_argument("--token", default=None, help="bearer token for every node's /v1/control (or SWARMTUNE_TOKEN)")
    fl.add_argument("--node-token", dest="node_tokens", action="append", default=[], metavar="HOST:PORT=TOKEN",
                    help="one node's token, by its instance as Prometheus scrapes it; repeatable")
    fl.add_argument("--interval", type=_finite("--interval"), default=1.0,
                    help="seconds between reads of Prometheus (default 1; at most your scrape interval)")
    fl.add_argument("--json", action="store_true", help="print one snapshot of the fleet as JSON and exit")
    rp = sub.add_parser("replay", help="play a recording in the dashboard (pause, step, seek, speed)")
    rp.add_argument("file")
    rp.add_argument("--speed", type=_finite("--speed"), default=1.0, help="playback speed (2 = twice as fast)")
    tn = sub.add_parser("tune", help="run the tuner headless; print the best setting as llama-server, vLLM and "
                                     "ZINC flags")
    add_engine_flags(tn)
    tn.add_argument("--duration", type=_finite("--duration"), default=None,
                    help="seconds of the engine's clock to tune for (simulated seconds with --sim; default 600 "
                         "simulated, 120 real)")
    tn.add_argument("--json", dest="json_path", default=None, help="write the result as JSON ('-': stdout)")
    ql = sub.add_parser("quality", help="what each KV setting (K/V apart: q8_0/f16) does to the next-token "
                                        "distribution, against f16/f16: KL divergence and top-1, measured")
    ql.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M)")
    ql.add_argument("--threads", type=_positive_int("--threads"), default=None)
    ql.add_argument("--kv", dest="kv_settings", type=_kv_settings, default="q8_0,q4_0,q8_0/f16,f16/q8_0",
                    help="KV settings to measure, comma-separated: a type (K and V alike) or K/V, e.g. q8_0/f16")
    src = ql.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="a UTF-8 text file (as llama-perplexity -f reads one)")
    src.add_argument("--transcript", default=None,
                     help="a JSONL file, one chat conversation per line: {\"messages\": [{\"role\", \"content\"}]}")
    ql.add_argument("--contexts", type=_int_list, default=None,
                    help="window lengths in tokens (default 512,1024); each scores its second half")
    ql.add_argument("--windows", type=_positive_int("--windows"), default=4,
                    help="windows per context length, at most (default 4)")
    ql.add_argument("--seed", type=int, default=1, help="which swarm-like histories, without --text/--transcript")
    ql.add_argument("--json", dest="json_path", default=None, help="write the figures as JSON ('-': stdout)")
    ql.set_defaults(sim=None, extra_bufts=False)
    sub.add_parser("profiles", help="list the sim backend's hardware profiles")
    pw = sub.add_parser("power", help="list the power sources: available or not, and why")
    pw.add_argument("--sysfs-root", default=None, help="where sysfs is mounted (default /sys)")
    return p
