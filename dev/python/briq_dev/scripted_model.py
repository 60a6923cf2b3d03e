"""A deterministic smolagents `Model` that answers from a script, for tests and the demo.

Each `generate()` call returns the next reply of the script as an assistant message. A reply is
either text (`Thought: ...` followed by a `<code>...</code>` block, as a real model writes it) or
a function of the messages the model was given, returning such text. Every call's messages are
kept in `calls`, so a test can check what the agent showed the model (an error, an observation).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from smolagents.models import ChatMessage, MessageRole, Model

Reply = str | Callable[[list], str]


def action(thought: str, code: str) -> str:
    """A model reply in CodeAgent's format: a thought, then one code block."""
    return f"Thought: {thought}\n<code>\n{code.strip()}\n</code>"


def message_text(message) -> str:
    """The text of one chat message (smolagents keeps content as str or a list of parts)."""
    content = message.content if hasattr(message, "content") else message.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def messages_text(messages: Iterable) -> str:
    return "\n".join(message_text(message) for message in messages)


class ScriptedModel(Model):
    """Replies with `script`, one entry per call; a call past its end fails the agent run."""

    def __init__(self, script: Iterable[Reply], model_id: str = "scripted"):
        super().__init__(model_id=model_id)
        self.script = list(script)
        self.calls: list[list] = []

    def generate(self, messages, stop_sequences=None, response_format=None, **kwargs):
        self.calls.append(list(messages))
        if len(self.calls) > len(self.script):
            raise RuntimeError(
                f"the scripted model has {len(self.script)} replies; call {len(self.calls)} "
                "was not expected"
            )
        reply = self.script[len(self.calls) - 1]
        text = reply(self.calls[-1]) if callable(reply) else reply
        return ChatMessage(role=MessageRole.ASSISTANT, content=text)
