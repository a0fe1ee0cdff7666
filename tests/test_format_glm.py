"""GLM's tool calls (engine/conversation/formats/glm.py): GLM-4.5/4.6 (newlines) and GLM-4.7/5.x (compact).

The parse cases are llama.cpp's own, ported from tests/test-chat.cpp (the peg_testers of
models/templates/GLM-4.6.jinja, models/templates/GLM-4.7-Flash.jinja and models/templates/Spark2.5.jinja,
which writes GLM-4.7's calls, in the llama.cpp that swarmtune pins): the reply, the tools offered, and the
content, reasoning_content and tool_calls llama.cpp expects of it. Left out: the continuation cases, which
parse the prefilled assistant message together with the reply. The rest are this format's own rules: typed
values, what ends a value, a call cut short, what a stream must hold back."""

import json
from typing import Any

import pytest

from swarmtune.engine.conversation.formats.glm import Glm, Ling3
from swarmtune.engine.conversation.formats.reply import Reply, ReplyContext
from swarmtune.engine.conversation.formats.stream import ReplyStream
from tests.chat_cases import ASSIST, INTEGER, SPECIAL, SPECIAL_OPT, STRING, tool
from tests.llama_templates import template

GLM45 = "<|assistant|>"  # GLM-4.5/4.6's generation prompt: the model opens <think> itself
GLM45_NO_THINKING = "<|assistant|>\n<think></think>"
GLM47 = "<|assistant|><think>"  # GLM-4.7's, thinking on: the reply starts in reasoning
GLM47_NO_THINKING = "<|assistant|></think>"
SPARK_NO_THINKING = "<｜start▁of▁sentence｜><|Bot|></think>"




SPECIAL_CALL = ("special_function", {"arg1": 1})
TWO = [SPECIAL_CALL, ("special_function_with_opt", {"arg1": 1, "arg2": 2})]
COMPACT = "<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>"
TWO_COMPACT = (COMPACT + "<tool_call>special_function_with_opt<arg_key>arg1</arg_key><arg_value>1</arg_value>"
               "<arg_key>arg2</arg_key><arg_value>2</arg_value></tool_call>")
SPARK_TOOLS = (tool("magic_int", ref=INTEGER, name=STRING), tool("amount", orig={"type": "number"}),
               tool("toggle", enabled={"type": "boolean"}), tool("set_config", config={"type": "object"}),
               tool("nested_args", tags={"type": "array"}, entries={"type": "array"}), tool("empty_args"))


def calls(r: Reply) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in r.calls]


def ctx(prompt_tail: str, *tools: dict[str, Any]) -> ReplyContext:
    return ReplyContext(prompt_tail=prompt_tail, tools=tools)


# (template, reply, prompt tail, tools, content, reasoning, calls): tests/test-chat.cpp's GLM-4.6, GLM-4.7-Flash
# and Spark2.5 peg_testers
LLAMA_CPP = [
    ("GLM-4.6.jinja", "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
     GLM45, (SPECIAL,), "", "", [SPECIAL_CALL]),
    ("GLM-4.7-Flash.jinja", ASSIST, GLM47_NO_THINKING, (), ASSIST, "", []),
    ("GLM-4.7-Flash.jinja", "I'm\nthinking</think>Hello, world!\nWhat's up?", GLM47, (), ASSIST, "I'm\nthinking", []),
    ("GLM-4.7-Flash.jinja", COMPACT, GLM47_NO_THINKING, (SPECIAL,), "", "", [SPECIAL_CALL]),
    ("GLM-4.7-Flash.jinja", "I'm\nthinking</think>" + COMPACT, GLM47, (SPECIAL,), "", "I'm\nthinking",
     [SPECIAL_CALL]),
    ("GLM-4.7-Flash.jinja", TWO_COMPACT, GLM47_NO_THINKING, (SPECIAL, SPECIAL_OPT), "", "", TWO),
    # #20650: a tool with no required arguments, called with no pairs at all
    ("GLM-4.7-Flash.jinja", "Let me read the diff content.</think><tool_call>read_file_diff_md</tool_call>", GLM47,
     (tool("read_file_diff_md", review_id=STRING, file_id=STRING),), "", "Let me read the diff content.",
     [("read_file_diff_md", {})]),
    ("Spark2.5.jinja", ASSIST, SPARK_NO_THINKING, (), ASSIST, "", []),
    ("Spark2.5.jinja", "I'm\nthinking</think>" + COMPACT, "<|Bot|><think>", (SPECIAL,), "", "I'm\nthinking",
     [SPECIAL_CALL]),
    ("Spark2.5.jinja", TWO_COMPACT, SPARK_NO_THINKING, (SPECIAL, SPECIAL_OPT), "", "", TWO),
    ("Spark2.5.jinja",
     "Preparing updates.<tool_call>magic_int<arg_key>ref</arg_key><arg_value>42</arg_value>"
     "<arg_key>name</arg_key><arg_value>上海</arg_value></tool_call>"
     "<tool_call>amount<arg_key>orig</arg_key><arg_value>2.5</arg_value></tool_call>"
     "<tool_call>toggle<arg_key>enabled</arg_key><arg_value>true</arg_value></tool_call>"
     "<tool_call>set_config<arg_key>config</arg_key>"
     "<arg_value>{\"source\": \"spark\", \"options\": {\"strict\": true}}</arg_value></tool_call>"
     "<tool_call>nested_args<arg_key>tags</arg_key><arg_value>[\"alpha\", \"测试\"]</arg_value>"
     "<arg_key>entries</arg_key><arg_value>[{\"id\": 1, \"label\": \"first\"}, {\"id\": 2, \"label\": \"第二\"}]"
     "</arg_value></tool_call>"
     "<tool_call>empty_args</tool_call>", SPARK_NO_THINKING, SPARK_TOOLS, "Preparing updates.", "",
     [("magic_int", {"ref": 42, "name": "上海"}), ("amount", {"orig": 2.5}), ("toggle", {"enabled": True}),
      ("set_config", {"config": {"source": "spark", "options": {"strict": True}}}),
      ("nested_args", {"tags": ["alpha", "测试"], "entries": [{"id": 1, "label": "first"},
                                                              {"id": 2, "label": "第二"}]}),
      ("empty_args", {})]),
]


def fmt_for(name: str) -> Glm:
    fmt = Glm.for_template(template(name))
    assert fmt is not None
    return fmt


@pytest.mark.parametrize(("name", "text", "tail", "tools", "content", "reasoning", "expected"), LLAMA_CPP)
def test_llama_cpp_cases(name: str, text: str, tail: str, tools: tuple[dict[str, Any], ...], content: str,
                         reasoning: str, expected: list[object]) -> None:
    r = fmt_for(name).parse(text, ctx(tail, *tools))
    assert (r.content, r.reasoning, calls(r)) == (content, reasoning, expected)
    assert not r.broken


def test_templates_pick_glm() -> None:
    for name in ("GLM-4.6.jinja", "GLM-4.7-Flash.jinja", "Spark2.5.jinja", "poolside-Laguna-XS.2.jinja"):
        assert type(fmt_for(name)) is Glm
    assert type(fmt_for("inclusionai-ling-3.0-flash.jinja")) is Ling3
    # Qwen's templates write <tool_call> too, but no <arg_key>
    for other in ("Qwen-Qwen3-0.6B.jinja", "Qwen3-Coder.jinja", "Qwen3.5-4B.jinja"):
        assert Glm.for_template(template(other)) is None


def test_registry_picks_glm() -> None:
    from swarmtune.engine.conversation.formats.registry import pick

    assert pick(template("GLM-4.6.jinja")).fmt.name == "glm"
    assert pick(template("GLM-4.7-Flash.jinja")).fmt.name == "glm"


def test_glm45_opens_its_own_thinking_block() -> None:
    text = ("\n<think>Need live data.</think>\nI'll look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
            "<arg_value>Berlin</arg_value>\n</tool_call>")
    r = fmt_for("GLM-4.6.jinja").parse(text, ctx(GLM45, tool("get_weather", city=STRING)))
    assert (r.content, r.reasoning) == ("I'll look.", "Need live data.")
    assert calls(r) == [("get_weather", {"city": "Berlin"})]


def test_values_are_typed_by_the_schema_and_strings_stay_verbatim() -> None:
    text = ("<tool_call>f<arg_key>n</arg_key><arg_value>3</arg_value><arg_key>s</arg_key><arg_value>3</arg_value>"
            "<arg_key>j</arg_key><arg_value>{\"a\": 1}</arg_value>"
            "<arg_key>w</arg_key><arg_value>  two\n lines </arg_value></tool_call>")
    r = fmt_for("GLM-4.7-Flash.jinja").parse(text, ctx(GLM47_NO_THINKING, tool("f", n=INTEGER, s=STRING, j=STRING,
                                                                                w=STRING)))
    assert calls(r) == [("f", {"n": 3, "s": "3", "j": "{\"a\": 1}", "w": "  two\n lines "})]


def test_markers_inside_a_value_are_its_text() -> None:
    value = "Wrap each call in <tool_call> and </tool_call>; keys go in <arg_key>."
    text = f"<tool_call>write<arg_key>content</arg_key><arg_value>{value}</arg_value></tool_call>"
    r = fmt_for("GLM-4.7-Flash.jinja").parse(text, ctx(GLM47_NO_THINKING, tool("write", content=STRING)))
    assert calls(r) == [("write", {"content": value})]


def test_an_unclosed_value_ends_where_the_next_pair_or_the_call_ends() -> None:
    weather = tool("get_weather", city=STRING, unit=STRING)
    glm = fmt_for("GLM-4.7-Flash.jinja")
    last = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin</arg_value>"
            "<arg_key>unit</arg_key><arg_value>celsius</tool_call>")
    assert calls(glm.parse(last, ctx(GLM47_NO_THINKING, weather))) == [
        ("get_weather", {"city": "Berlin", "unit": "celsius"})]
    first = ("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin"
             "<arg_key>unit</arg_key><arg_value>celsius</arg_value></tool_call>")
    assert calls(glm.parse(first, ctx(GLM47_NO_THINKING, weather))) == [
        ("get_weather", {"city": "Berlin", "unit": "celsius"})]
    # while the reply may go on, a </tool_call> could still be a value's text
    assert glm.parse(last, ctx(GLM47_NO_THINKING, weather), final=False).calls == ()


def test_a_call_cut_short_is_dropped_and_said() -> None:
    glm = fmt_for("GLM-4.7-Flash.jinja")
    full = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin</arg_value></tool_call>"
    for n in range(len("<tool_call>"), len(full)):
        r = glm.parse("Checking." + full[:n], ctx(GLM47_NO_THINKING, tool("get_weather", city=STRING)))
        assert (r.content, r.calls) == ("Checking.", ()), full[:n]
        assert r.broken


def test_a_tool_call_inside_unclosed_reasoning_is_reasoning() -> None:
    """llama.cpp reads GLM's thinking to </think>; Ling 3.0's ends at a call (its own parser)."""
    text = "Let me look.<tool_call>get_time</tool_call>"
    r = fmt_for("GLM-4.7-Flash.jinja").parse(text, ctx(GLM47, tool("get_time")))
    assert (r.reasoning, r.calls) == (text, ())
    r = fmt_for("inclusionai-ling-3.0-flash.jinja").parse(text, ctx("<role>ASSISTANT</role>\n<think>",
                                                                      tool("get_time")))
    assert (r.reasoning, calls(r)) == ("Let me look.", [("get_time", {})])


STREAMED = [
    ("GLM-4.6.jinja", ctx(GLM45, SPECIAL),
     "\n<think>Think.</think>\nI'll call.\n<tool_call>special_function\n<arg_key>arg1</arg_key>\n"
     "<arg_value>1</arg_value>\n</tool_call>\n<tool_call>special_function\n</tool_call>after"),
    ("GLM-4.7-Flash.jinja", ctx(GLM47, SPECIAL, SPECIAL_OPT), "I'm\nthinking</think>Checking." + TWO_COMPACT),
    ("GLM-4.7-Flash.jinja", ctx(GLM47_NO_THINKING, tool("write", content=STRING)),
     "<tool_call>write<arg_key>content</arg_key><arg_value>a </tool_call> b <arg_key> c</arg_value></tool_call>"),
    ("GLM-4.7-Flash.jinja", ctx(GLM47_NO_THINKING, tool("get_weather", city=STRING, unit=STRING)),
     "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Berlin</arg_value><arg_key>unit</arg_key>"
     "<arg_value>celsius</tool_call>"),
    ("GLM-4.7-Flash.jinja", ctx(GLM47_NO_THINKING, SPECIAL), "Sure." + COMPACT[:50]),
]


@pytest.mark.parametrize(("name", "context", "text"), STREAMED)
def test_streamed_one_character_at_a_time_equals_the_whole(name: str, context: ReplyContext, text: str) -> None:
    fmt = fmt_for(name)
    whole = fmt.parse(text, context)
    stream = ReplyStream(fmt, context)
    for ch in text:
        stream.feed(ch)
    stream.finish()
    got = stream.result()
    assert (got.content, got.reasoning, calls(got), got.broken) == (whole.content, whole.reasoning, calls(whole),
                                                                   whole.broken)


# The call grammar (Glm.call_grammar): llama.cpp's own sampler over the replies these models write, and every
# text it lets through read back by the parser into the same call.

NUM, BOOL = {"type": "number"}, {"type": "boolean"}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": STRING, "days": INTEGER, "metric": BOOL,
                                     "unit": {"enum": ["celsius", "fahrenheit"]},
                                     "where": {"type": "object", "properties": {"lat": NUM, "lon": NUM},
                                               "required": ["lat", "lon"]}, "tags": {"type": "array"}},
    "required": ["city", "days"]}}}
WRITE = {"type": "function", "function": {"name": "write", "parameters": {
    "type": "object", "properties": {"path": STRING, "content": STRING}, "required": ["path", "content"]}}}
GRAMMAR_TOOLS = [WEATHER, WRITE, SPECIAL, tool("get_time")]
# what a model asks of them, as the templates render it (its arguments in the schema's order)
ASKED = [
    ("get_weather", {"city": "Paris", "days": 3}),
    ("get_weather", {"city": "São Paulo\n(BR)", "days": -2, "metric": True, "unit": "celsius",
                     "where": {"lat": -23.5, "lon": -46.6}, "tags": ["a", {"b": None}]}),
    ("get_weather", {"city": "", "days": 0, "metric": False}),
    ("write", {"path": "a.c", "content": "#include <stdio.h>\nint main() { return 1 < 2; }\n"}),
    ("write", {"path": "x.md", "content": "Wrap each call in <tool_call> and </tool_call>; keys go in <arg_key>"
                                          "…</arg_key>, values in <arg_value>.\n\n  indented "}),
    ("write", {"path": "</arg_value", "content": "</arg_key> <arg_key>k</arg_key> </tool_call>\n"}),
    ("special_function", {"arg1": 1}),
    ("get_time", {}),
]
VARIANTS = [("GLM-4.6.jinja", GLM45), ("GLM-4.7-Flash.jinja", GLM47_NO_THINKING)]


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.grammar_check import GrammarCheck

    g = GrammarCheck(tmp_path_factory.mktemp("vocab"))
    yield g
    g.close()


def rendered(name: str, asked: list[tuple[str, dict[str, Any]]]) -> str:
    """The calls as the template renders an assistant message that makes them: from the first <tool_call>."""
    from swarmtune.engine.conversation.chat_template import ChatTemplate

    msgs = [{"role": "user", "content": "go"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": n, "arguments": a}} for n, a in asked]}]
    text = ChatTemplate(template(name)).render(msgs, GRAMMAR_TOOLS, add_generation_prompt=False)
    reply = text[text.rindex("<|assistant|>"):]
    return reply[reply.index("<tool_call>"):].rstrip()


@pytest.mark.parametrize(("name", "tail"), VARIANTS)
def test_grammar_accepts_the_templates_calls_and_they_read_back(checker: Any, name: str, tail: str) -> None:
    fmt = fmt_for(name)
    one, many = fmt.call_grammar(GRAMMAR_TOOLS, parallel=False), fmt.call_grammar(GRAMMAR_TOOLS, parallel=True)
    for asked in ASKED:
        text = rendered(name, [asked])
        assert checker.accepts(one, text) and checker.accepts(many, text), text
        assert calls(fmt.parse(text, ctx(tail, *GRAMMAR_TOOLS))) == [asked]
    text = rendered(name, ASKED)  # the template's parallel calls
    assert checker.accepts(many, text) and not checker.accepts(one, text)
    assert calls(fmt.parse(text, ctx(tail, *GRAMMAR_TOOLS))) == ASKED


@pytest.mark.parametrize(("name", "text", "tail", "tools", "content", "reasoning", "expected"), LLAMA_CPP)
def test_grammar_holds_llama_cpps_calls(checker: Any, name: str, text: str, tail: str,
                                        tools: tuple[dict[str, Any], ...], content: str, reasoning: str,
                                        expected: list[object]) -> None:
    """llama.cpp's cases, lazily: the reasoning and content before the calls free, the calls held."""
    fmt = fmt_for(name)
    g = fmt.call_grammar(list(tools) or [SPECIAL], parallel=True)
    assert checker.accepts(g, text, fmt.triggers())
    if expected and not reasoning and not content:  # the reply is the calls alone: held from its first token
        assert checker.accepts(g, text)


def test_grammar_rejects_what_is_no_call_of_an_offered_tool(checker: Any) -> None:
    for name, _ in VARIANTS:
        g = fmt_for(name).call_grammar(GRAMMAR_TOOLS, parallel=True)
        ok = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value>" \
             "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
        assert checker.accepts(g, ok)
        days = "<arg_key>days</arg_key><arg_value>3</arg_value>"
        for bad in (ok.replace("get_weather", "get_wether"),  # a tool not offered
                    ok.replace(days, ""),  # a required parameter missing
                    ok.replace("<arg_key>city</arg_key><arg_value>Paris</arg_value>", ""),
                    ok.replace(">3<", ">three<"),  # wrongly typed
                    ok.replace(">3<", ">3.5<"),
                    ok.replace(">3<", '>"3"<'),
                    ok.replace(days, days + "<arg_key>metric</arg_key><arg_value>yes</arg_value>"),
                    ok.replace(days, days + "<arg_key>unit</arg_key><arg_value>kelvin</arg_value>"),
                    ok.replace(days, days + '<arg_key>where</arg_key><arg_value>{"lat": 1}</arg_value>'),
                    ok.replace(days, days + '<arg_key>tags</arg_key><arg_value>["a\tb"]</arg_value>'),
                    ok.replace(days, days + "<arg_key>nope</arg_key><arg_value>1</arg_value>"),  # not a parameter
                    ok.replace(days, days + days),
                    ok + " And done.",  # the reply ends with the call
                    ok.replace("<tool_call>", "<tool_call> "),
                    "<tool_call>get_time<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>"):
            assert not checker.accepts(g, bad), bad


def test_grammar_writes_either_layout(checker: Any) -> None:
    """GLM-4.5/4.6 (and Ling 3, Laguna) put a newline after the name, each tag pair and each call; 4.7 none."""
    g = fmt_for("GLM-4.7-Flash.jinja").call_grammar(GRAMMAR_TOOLS, parallel=True)
    for text in ("<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
                 "<tool_call>special_function<arg_key>arg1</arg_key>\n<arg_value>1</arg_value></tool_call>\n"
                 "<tool_call>get_time\n</tool_call>",
                 "<tool_call>special_function\n<arg_key>arg1</arg_key><arg_value>1</arg_value>\n</tool_call>"):
        assert checker.accepts(g, text)
        assert calls(fmt_for("GLM-4.6.jinja").parse(text, ctx(GLM45, *GRAMMAR_TOOLS)))[0] == SPECIAL_CALL
    assert not checker.accepts(g, COMPACT.replace("special_function", "special_function\n\n"))


def test_random_string_values_read_back_whenever_the_grammar_takes_them(checker: Any) -> None:
    """Texts made of the closers' pieces: the grammar refuses exactly those holding a closer (its stand-in:
    `</arg_key>` then `<arg_value>` for a whole next pair), and the parser reads back whole every text it
    takes."""
    import random
    import re

    rng = random.Random(7)
    pieces = ["</arg_value>", "<arg_value>", "</arg_key>", "<arg_key>", "</tool_call>", "<tool_call>", "\n", " ",
              "\u3000", "<", "/", ">", "a", "</", "arg_", "value", "é"]
    closers = re.compile(r"</arg_value>|</arg_key>\s*<arg_value>|</tool_call>\s*<tool_call>")
    fmt = fmt_for("GLM-4.7-Flash.jinja")
    g = fmt.call_grammar([WRITE], parallel=True)
    taken = 0
    for _ in range(300):
        value = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))
        text = (f"<tool_call>write<arg_key>path</arg_key><arg_value>p</arg_value><arg_key>content</arg_key>"
                f"<arg_value>{value}</arg_value></tool_call>")
        accepted = checker.accepts(g, text)
        assert accepted == (closers.search(value) is None), repr(value)
        if accepted:
            taken += 1
            got = calls(fmt.parse(text + text, ctx(GLM47_NO_THINKING, WRITE)))  # the call's end, and a next call
            assert got == [("write", {"path": "p", "content": value})] * 2, repr(value)
    assert taken > 100


def test_grammar_lazily_after_prose_or_reasoning(checker: Any) -> None:
    for name, _ in VARIANTS:
        fmt = fmt_for(name)
        g, triggers = fmt.call_grammar(GRAMMAR_TOOLS, parallel=True), fmt.triggers()
        assert triggers == ("<tool_call>",)
        assert checker.accepts(g, "Let me look.\n" + COMPACT, triggers)
        assert checker.accepts(g, "\n<think>Need data.</think>\nI'll look.\n" + COMPACT, triggers)
        assert checker.accepts(g, "No call needed: it is sunny <b>today</b>.", triggers)
        assert not checker.accepts(g, "Calling." + COMPACT.replace("special_function", "nope"), triggers)
        assert not checker.accepts(g, "Calling." + COMPACT + " Done.", triggers)
    text = "I'm\nthinking</think>Checking." + COMPACT
    glm47 = fmt_for("GLM-4.7-Flash.jinja")
    assert checker.accepts(glm47.call_grammar(GRAMMAR_TOOLS, parallel=False), text, glm47.triggers())
    assert calls(glm47.parse(text, ctx(GLM47, *GRAMMAR_TOOLS))) == [SPECIAL_CALL]


def test_grammar_refuses_names_the_parser_could_not_read_back() -> None:
    from swarmtune.engine.errors import UserError

    for bad in (tool("two words"), tool("a<b"), tool("ok", **{"k<": STRING})):
        with pytest.raises(UserError):
            fmt_for("GLM-4.7-Flash.jinja").call_grammar([bad], parallel=False)


@pytest.mark.parametrize("name", ["GLM-4.6.jinja", "GLM-4.7-Flash.jinja"])
def test_a_random_model_under_the_grammar_makes_a_call_that_validates(tmp_path: Any, name: str) -> None:
    """End to end, as tests/test_tool_families.py: the real template on a tiny random-weight GGUF, one served
    request under the grammar, which ends the reply with the call. GLM-4.7 with thinking off: with it on, the
    server holds the call only after the reasoning (Bridge.held)."""
    from tests.grammar_check import one_call_under_grammar
    from tests.test_tool_families import TOOL

    r = one_call_under_grammar(tmp_path, name, TOOL, name, variables={"enable_thinking": False}, choice=None,
                               tail=40, steps=800)
    assert r.renderer.family == "glm"
