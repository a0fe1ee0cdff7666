"""A chat message as the engine takes it, whichever API it came from (OpenAI's chat completions and
responses, Anthropic's messages, a transcript, the synthetic agents' turns): what engine/agents/prompt.py renders
into the model's prompt. Checked by mypy where it is built and where it is read."""

from typing import NotRequired, TypedDict

from swarmtune.engine.conversation.formats.reply import ToolCall


class ChatMessage(TypedDict):
    role: str  # system | user | assistant | tool (OpenAI's "developer" is "system" here)
    content: str
    tool_calls: NotRequired[list[ToolCall]]  # an assistant's calls
    tool_call_id: NotRequired[str]  # a tool message: the call whose result it is
    reasoning: NotRequired[str]  # an assistant's reasoning, sent back by a client (reasoning_content, thinking)
