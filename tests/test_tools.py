"""Tool calls without a model: each family's format parsed and written back, the grammars they get, and
Jinja templates of the families rendered with tools (fast)."""

import json

import pytest

from swarmtune.engine.conversation.chat_template import ChatTemplate
from swarmtune.engine.conversation.formats.reader import ReplyReader
from swarmtune.engine.conversation.formats.registry import pick
from swarmtune.engine.conversation.formats.reply import ReplyContext, ToolCall
from swarmtune.engine.conversation.tool_calls import render_call

READ = {"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}}, "required": ["path"]}}}

# The formats as the families' own docs and templates write them (Qwen2.5 / Hermes 2 Pro, Llama 3.1's
# JSON tool calling, Mistral's v3 tokenizer), with the text small models put around them.
HERMES = ('Let me look.\n<tool_call>\n{"name": "read_file", "arguments": {"path": "src/app.py"}}\n</tool_call>\n'
          '<tool_call>\n{"name": "read_file", "arguments": {"path": "setup.cfg", "lines": 20}}\n</tool_call>')
LLAMA3 = '{"name": "read_file", "parameters": {"path": "README.md"}}'
MISTRAL = ('[TOOL_CALLS][{"name": "read_file", "arguments": {"path": "a.py"}}, '
           '{"name": "read_file", "arguments": {"path": "b.py"}}]')


TEMPLATES = {  # the markers that pick each family (engine/conversation/formats/registry.py)
    "qwen3-hermes": "{% if tools %}<tools></tools> <tool_call>{% endif %}",
    "llama": "{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>{{ tools | tojson }}"
             "<|eot_id|>{% endif %}<|python_tag|>",
    "mistral": "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]",
}


def read(text: str, fam: str, tools: tuple = (READ,)) -> tuple[str, list[ToolCall]]:
    picked = pick(TEMPLATES[fam])
    assert picked.known and picked.fmt.name == fam
    r = ReplyReader(picked.fmt, ReplyContext(tools=tools), picked.label).whole(text)
    return r.content, list(r.calls)


@pytest.mark.parametrize(("fam", "text", "paths", "content"), [
    ("qwen3-hermes", HERMES, ["src/app.py", "setup.cfg"], "Let me look."),
    ("llama", LLAMA3, ["README.md"], ""),
    ("llama", "<|python_tag|>" + LLAMA3, ["README.md"], ""),
    ("mistral", MISTRAL, ["a.py", "b.py"], ""),
])
def test_each_family_parses_into_calls(fam, text, paths, content):
    got, calls = read(text, fam)
    assert got.strip() == content and [json.loads(c.arguments)["path"] for c in calls] == paths
    assert all(c.name == "read_file" and c.id for c in calls)


def test_what_is_not_a_call_stays_content():
    for text in ("no tools today", "<tool_call>{not json}</tool_call>", '{"name": 3}'):
        content, calls = read(text, "qwen3-hermes")
        assert calls == [] and content == text


def test_a_call_cut_by_max_tokens_is_not_content():
    text = HERMES + '\n<tool_call>\n{"name": "read_file", "argu'
    content, calls = read(text, "qwen3-hermes")
    assert len(calls) == 2 and content.strip() == "Let me look."


@pytest.mark.parametrize("fam", ["qwen3-hermes", "llama", "mistral"])
def test_a_call_written_back_parses_to_itself(fam):
    text = render_call(fam, "read_file", '{"path": "x.py"}')
    _, calls = read(text, fam)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("read_file", {"path": "x.py"})]


def test_a_stream_holds_a_call_back_and_gives_it_whole_at_the_end():
    picked = pick(TEMPLATES["qwen3-hermes"])
    s = ReplyReader(picked.fmt, ReplyContext(tools=(READ,)), picked.label).stream()
    sent, calls = "", []
    for i in range(0, len(HERMES), 3):
        d = s.feed(HERMES[i : i + 3])
        sent, calls = sent + d.content, calls + list(d.calls)
    end = s.finish()
    sent, calls = sent + end.content, calls + list(end.calls)
    assert sent.strip() == "Let me look." and "<tool" not in sent and len(calls) == 2


def test_a_template_of_no_known_family_is_read_as_hermes_and_says_so():
    picked = pick("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}")
    assert not picked.known and picked.fmt.name == "qwen3-hermes"
    assert picked.label == "unknown (read as qwen3-hermes)"


def test_without_tools_a_call_stays_content_and_reasoning_is_still_split():
    picked = pick(TEMPLATES["qwen3-hermes"])
    r = ReplyReader(picked.fmt, ReplyContext(calls=False), picked.label).whole("<think>hm</think>\n" + HERMES)
    assert r.reasoning == "hm" and r.calls == () and "<tool_call>" in r.content


def test_the_grammars_parse_in_llama_cpp(llama_backend):
    from swarmtune.engine.conversation.tool_calls import json_grammar

    for fam in ("qwen3-hermes", "llama", "mistral"):
        for parallel in (True, False):
            grammar = pick(TEMPLATES[fam]).fmt.call_grammar([READ], parallel)
            assert grammar is not None and llama_backend.text.check_grammar(grammar) is None
    assert llama_backend.text.check_grammar(json_grammar(None)) is None
    assert llama_backend.text.check_grammar(json_grammar(READ["function"]["parameters"])) is None
    assert llama_backend.text.check_grammar("root ::= nope") is not None


@pytest.mark.parametrize(("fam", "source"), [
    ("qwen3-hermes", "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
               "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"),
    ("llama", "{{ bos_token }}{% if tools %}<|start_header_id|>system<|end_header_id|>\n"
              "Respond with {\"name\": ..., \"parameters\": ...}.{% for t in tools %}"
               "{{ t | tojson }}{% endfor %}<|eot_id|>{% endif %}{% for m in messages %}<|start_header_id|>"
               "{{ m.role }}<|end_header_id|>\n{{ m.content }}<|eot_id|>{% endfor %}"),
    ("mistral", "{% for m in messages %}{% if m.role == 'user' %}[INST]{{ m.content }}[/INST]{% endif %}"
                "{% if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}{% endif %}{% endfor %}"),
])
def test_family_templates_render_tools_and_calls(fam, source):
    t = ChatTemplate(source, bos_token="<s>")
    assert pick(source).fmt.name == fam or (fam == "qwen3-hermes" and not pick(source).known)
    msgs = [{"role": "user", "content": "read it"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "id": "call_1", "function": {"name": "read_file", "arguments": {"path": "a"}}}]}]
    out = t.render(msgs, [READ])
    assert "read it" in out
    if fam != "mistral":
        assert "read_file" in out  # the tools are offered
    else:
        assert "[TOOL_CALLS]" in out  # the call is written back


def test_a_template_without_tools_offers_them_in_the_system_message():
    t = ChatTemplate("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}")
    out = t.render([{"role": "user", "content": "hi"}], [READ])
    assert out.startswith("<|im_start|>system\n# Tools") and '"name": "read_file"' in out and "<tool_call>" in out


def test_a_template_that_refuses_says_why_in_one_line():
    from swarmtune.engine.conversation.chat_template import TemplateError

    t = ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}")
    with pytest.raises(TemplateError, match="roles must alternate"):
        t.render([{"role": "user", "content": "x"}])


def test_tool_call_to_openai_shape():
    c = ToolCall("read_file", '{"path": "a"}', "call_x")
    assert c.to_openai(0) == {"index": 0, "id": "call_x", "type": "function",
                              "function": {"name": "read_file", "arguments": '{"path": "a"}'}}


def test_a_mistral_template_gets_nine_character_call_ids_for_the_call_and_its_result():
    from swarmtune.engine.agents.prompt import PromptRenderer

    class Text:  # what PromptRenderer reads of a backend's text
        jinja_template = ("{% for m in messages %}{% for c in m.tool_calls or [] %}[CALL {{ c.id }}]{% endfor %}"
                          "{% if m.tool_call_id %}[RESULT {{ m.tool_call_id }}]{% endif %}{% endfor %}"
                          "{% if tools %}[TOOL_CALLS]{% endif %}")

        def special_text(self, which: str) -> str:
            return ""

    class Model:
        text = Text()

    r = PromptRenderer(Model())  # type: ignore[arg-type]
    long_id = "call_0123456789abcdef01234567"
    out = r.render([{"role": "assistant", "content": "", "tool_calls": [ToolCall("read_file", "{}", long_id)]},
                    {"role": "tool", "content": "ok", "tool_call_id": long_id}], [READ])
    call_id = out.split("[CALL ")[1].split("]")[0]
    assert len(call_id) == 9 and call_id.isalnum() and f"[RESULT {call_id}]" in out


def test_what_llama_cpps_jinja_accepts_renders_here_too():
    """{% break %}, Hugging Face's {% generation %}, a list a template appends to, a missing field added to
    text, tojson after |safe: each rendered as llama.cpp's Jinja renders it (bench/templates_vs_llama_server.py
    compares whole templates)."""
    source = ("{% set seen = [] %}{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
              "{{ seen.append(m.role) or '' }}"
              "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}|{{ seen | join(',') }}|"
              "{{ '(' + messages[0].nothing + ')' }}|{{ 'x'|safe + {'a': '<b>'} | tojson }}")
    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]
    assert ChatTemplate(source).render(msgs) == 'ab|user,assistant|()|x{"a": "<b>"}'


def test_every_vendored_template_renders_a_tool_conversation_or_refuses_in_one_line():
    """Every template of the pinned llama.cpp's models/templates/, with tools, a call and its result: a
    prompt, or the template's own refusal (Mistral's and Gemma 2's conversation rules), said in one line."""
    from llama_templates import templates_dir

    from swarmtune.engine.conversation.chat_template import TemplateError

    msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Open a.py."},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "call12345", "function": {
                "name": "read_file", "arguments": {"path": "a.py"}}}]},
            {"role": "tool", "tool_call_id": "call12345", "content": "print('hi')"},
            {"role": "user", "content": "Run it."}]
    refused = {}
    for path in sorted(templates_dir().glob("*.jinja")):
        try:
            out = ChatTemplate(path.read_text(), bos_token="<s>", eos_token="</s>").render(msgs, [READ])
            assert "Open a.py." in out, path.name
        except TemplateError as e:
            assert "\n" not in str(e)
            refused[path.name] = str(e)
    assert len(refused) <= 7, refused  # measured: 7 of 71 (the same refused or differ in llama-server)


def test_a_template_that_opened_thinking_holds_the_call_only_past_its_end(tmp_path):
    """Qwen3's template opens `<think>` in the prompt: a call drafted while thinking stays free (auto), and a
    forced call (required) is held from `</think>` on, so the reasoning before it is the model's own."""
    from grammar_check import GrammarCheck
    from llama_templates import template

    from swarmtune.server.bridge import Bridge, plan_tools

    picked = pick(template("Qwen-Qwen3-0.6B.jinja"))
    ctx = ReplyContext(prompt_tail="<|im_start|>assistant\n<think>\n", tools=(READ,))
    reader = ReplyReader(picked.fmt, ctx, picked.label)
    call = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    drafted = 'Maybe <tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call> no.\n</think>\n\n'
    check = GrammarCheck(tmp_path)
    try:
        auto = Bridge.held(plan_tools([READ], "auto", picked.fmt), reader)
        assert auto[1] and check.accepts(auto[0], drafted + call, auto[1])
        assert not check.accepts(auto[0], drafted + call.replace("read_file", "rm"), auto[1])
        forced = Bridge.held(plan_tools([READ], "required", picked.fmt), reader)
        assert check.accepts(forced[0], drafted + call, forced[1])
        assert not check.accepts(forced[0], drafted + "No call after all.", forced[1])
        assert reader.whole(drafted + call).calls[0].name == "read_file"
    finally:
        check.close()


def test_a_call_cut_inside_its_closer_is_neither_a_call_nor_content():
    """max_tokens cut a third call in `</tool_`: the two whole calls stand, the third is dropped and said."""
    one = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>'
    reader = ReplyReader(pick(TEMPLATES["qwen3-hermes"]).fmt, ReplyContext(tools=(READ,)), "qwen3-hermes")
    r = reader.whole(f"{one}\n{one}\n\n{one[:-5]}")
    assert len(r.calls) == 2 and r.content == "" and "ended inside a call" in r.broken


def test_without_tools_nothing_is_held_as_a_call_and_channels_are_still_read():
    """No tools offered: a Llama 3 reply that is JSON streams as it comes (nothing waits to be a call), and
    gpt-oss's analysis is still reasoning and its final channel the content."""
    from llama_templates import template

    llama = pick(template("meta-llama-Llama-3.3-70B-Instruct.jinja")).fmt
    s = ReplyReader(llama, ReplyContext(calls=False), "llama").stream()
    assert s.feed('{"name": "Ada", "age": 3').content == '{"name": "Ada", "age": 3'
    harmony = pick(template("openai-gpt-oss-120b.jinja")).fmt
    r = ReplyReader(harmony, ReplyContext(calls=False), "gpt-oss").whole(
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi.")
    assert (r.reasoning, r.content, r.calls) == ("Think.", "Hi.", ())


def test_a_reply_no_parser_can_read_is_content_not_a_crash():
    """A number past Python's 4,300-digit limit (json and int() raise ValueError): content, said."""
    big = "9" * 5000
    for text in (f'<tool_call>\n{{"name": "read_file", "arguments": {{"lines": {big}}}}}\n</tool_call>',):
        r = ReplyReader(pick(TEMPLATES["qwen3-hermes"]).fmt, ReplyContext(tools=(READ,)), "qwen3-hermes").whole(text)
        assert r.calls == () and r.content


@pytest.mark.model
def test_a_token_completing_a_trigger_the_grammar_refuses_never_reaches_llama_cpp(llama_backend):
    """SmolLM2 spells `<tool_call>` in pieces and has a `><` token: after `<tool_call`, `><` completes the lazy
    grammar's trigger with a `<` the call's grammar refuses. Accepted, llama.cpp's grammar throws from inside
    the sampler and the process aborts (tests/test_tools.py's subprocess below shows it); the watch on the host
    (engine/backends/lazy_trigger.py) refuses it first, in draws and in drafts alike."""
    import subprocess
    import sys

    from swarmtune.engine.conversation.formats.hermes import Hermes
    from swarmtune.engine.conversation.sampling import SamplingParams
    from swarmtune.engine.kv.types import KVSetting

    b = llama_backend
    b.open(KVSetting.parse("f16"), 1, 256)
    fmt = Hermes()
    grammar = fmt.call_grammar([READ], False)
    b.steps.set_sampler(0, SamplingParams(temperature=0.0, grammar=grammar, grammar_triggers=fmt.triggers()))
    head, glued = b.text.tokenize("Sure <tool_call"), b.text.tokenize("><")
    assert len(glued) == 1, "the vocabulary has a `><` token"
    assert b.samplers.grammar_allows(0, head + glued) == len(head)  # the draft is cut before it
    ok = b.text.tokenize('>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>')
    assert b.samplers.grammar_allows(0, head + ok) == len(head + ok)
    # without the watch: llama.cpp itself, given that token, aborts the process
    script = ("import llama_cpp as ll, ctypes, sys\\n"
              "p = ll.llama_model_default_params(); p.vocab_only = True\\n"
              "m = ll.llama_model_load_from_file(sys.argv[1].encode(), p); v = ll.llama_model_get_vocab(m)\\n"
              "pats = (ctypes.c_char_p * 1)(b'<tool_call>')\\n"
              "g = ll.llama_sampler_init_grammar_lazy_patterns(v, sys.argv[2].encode(), b'root', pats, 1, None, 0)\\n"
              "for t in map(int, sys.argv[3].split(',')): ll.llama_sampler_accept(g, t)\\n"
              "print('survived')\\n")
    out = subprocess.run([sys.executable, "-c", script, str(b.facts.path), grammar, ",".join(map(str, head + glued))],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "survived" not in out.stdout and "grammar" in out.stderr
