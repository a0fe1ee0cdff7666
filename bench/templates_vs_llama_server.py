"""Every chat template the pinned llama.cpp vendors (models/templates/), rendered by swarmtune and by
llama-server's POST /apply-template (`--jinja --chat-template-file T`), on the same conversation: a system
prompt, a user's ask, an assistant's tool call, its result and the next ask, with two tools offered.

Prints, per template, whether the two prompts are the same text, else where they first differ; a template
one side refuses to render is listed with the side's one-line reason. Both sides load the default model, so
bos/eos are the same tokens' text. Builds llama-server first where missing (~11 minutes).

    python bench/templates_vs_llama_server.py [--only NAME_PIECE] [--show]"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from llama_templates import templates_dir  # noqa: E402
from llama_tools import build_tool, engine_buffer_flags  # noqa: E402

from swarmtune.engine.agents.prompt import PromptRenderer  # noqa: E402
from swarmtune.engine.backends.llama_backend import LlamaBackend  # noqa: E402
from swarmtune.engine.conversation.formats.reply import ToolCall  # noqa: E402
from swarmtune.engine.model.default_model import default_model_path  # noqa: E402
from swarmtune.engine.model.model_facts import read_model_facts  # noqa: E402

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {
                                               "path": {"type": "string"}}, "required": ["path"]}}},
         {"type": "function", "function": {"name": "run_tests", "description": "Run tests",
                                           "parameters": {"type": "object", "properties": {
                                               "k": {"type": "string"}, "n": {"type": "integer"}},
                                               "required": ["k"]}}}]
CALL_ID = "call12345"  # nine letters and digits: Mistral's templates refuse others
MESSAGES = [{"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Open src/app.py."},
            {"role": "assistant", "content": "", "tool_calls": [{"id": CALL_ID, "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"path": "src/app.py"})}}]},
            {"role": "tool", "tool_call_id": CALL_ID, "content": "print('hi')"},
            {"role": "user", "content": "Now run the tests about app."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_server_prompt(server: str, model: str, template: Path) -> str:
    port = free_port()
    proc = subprocess.Popen([server, "-m", model, "--jinja", "--chat-template-file", str(template), "--port",
                             str(port), "-c", "2048", "-t", "2", *engine_buffer_flags()],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            if proc.poll() is not None:
                err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
                return "!" + next((ln for ln in reversed(err) if "error" in ln.lower()), err[-1] if err else "exited")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        r = httpx.post(url + "/apply-template", json={"messages": MESSAGES, "tools": TOOLS}, timeout=60)
        body = r.json()
        return str(body["prompt"]) if r.status_code == 200 else "!" + json.dumps(body)[:200]
    finally:
        proc.terminate()
        proc.wait(30)


def swarmtune_prompt(backend: LlamaBackend, template: Path) -> str:
    msgs = [{"role": m["role"], "content": m["content"]} for m in MESSAGES]
    msgs[2]["tool_calls"] = [ToolCall("read_file", json.dumps({"path": "src/app.py"}), CALL_ID)]
    msgs[3]["tool_call_id"] = CALL_ID
    try:
        return PromptRenderer(backend, template.read_text()).render(msgs, TOOLS)  # type: ignore[arg-type]
    except Exception as e:  # noqa: BLE001 - every template's refusal is a row of the table
        return "!" + str(e).splitlines()[0][:200]


def first_difference(a: str, b: str) -> str:
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    return f"at char {i}: swarmtune {a[i:i + 40]!r} vs llama-server {b[i:i + 40]!r}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="only templates whose file name holds this")
    ap.add_argument("--show", action="store_true", help="print both prompts where they differ")
    a = ap.parse_args()
    server = build_tool("llama-server")
    model = str(default_model_path())
    os.environ.setdefault("SWARMTUNE_CHECK", "0")
    backend = LlamaBackend(read_model_facts(model), n_threads=2)
    same = differ = refused = 0
    try:
        for t in sorted(templates_dir().glob("*.jinja")):
            if a.only not in t.name:
                continue
            ours, theirs = swarmtune_prompt(backend, t), llama_server_prompt(server, model, t)
            if ours == theirs:
                same += 1
                print(f"same     {t.name}")
            elif ours.startswith("!") or theirs.startswith("!"):
                refused += 1
                print(f"refused  {t.name}: swarmtune {ours[:100]!r} / llama-server {theirs[:100]!r}")
            else:
                differ += 1
                print(f"DIFFER   {t.name}: {first_difference(ours, theirs)}")
                if a.show:
                    print(f"--- swarmtune\n{ours}\n--- llama-server\n{theirs}\n---")
    finally:
        backend.close()
    print(f"templates: {same} the same prompt, {differ} differ, {refused} refused by a side "
          f"(default model's bos/eos, measured)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
