"""One chat turn's text, cut from what an engine's own chat template renders.

Every engine renders whole conversations with its model's template
(:meth:`~c2c.runtime.protocol.Runtime.render_chat`); c2c also needs the text of one
turn as the template writes it mid-conversation (so that a turn can be prefilled on its
own and appended to a cache), and the text that opens the assistant's reply. Both are
cut from renders of a conversation with and without them, the same way on every engine.
"""

from __future__ import annotations


class ChatTurns:
    """Mixin for an engine with ``render_chat``: adds :meth:`render_turn` and :meth:`generation_prompt`."""

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = False, *,
                    tools: list[dict] | None = None) -> str | None:
        raise NotImplementedError

    def render_turn(self, role: str, content: str) -> str:
        """The text of one chat turn, exactly as the model's template writes it mid-conversation."""
        anchor = [{"role": "system", "content": "x"}]
        if role == "system":
            full = self.render_chat([{"role": "system", "content": content}])
            if full is not None:
                return full
        else:
            before = self.render_chat(anchor)
            after = self.render_chat(anchor + [{"role": role, "content": content}])
            if before is not None and after.startswith(before):
                return after[len(before):]
        return f"{role.capitalize()}: {content}\n\n"  # plain template for base models

    def generation_prompt(self) -> str:
        """The text that opens the assistant's reply (``"Assistant:"`` for a model without a template)."""
        anchor = [{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]
        before = self.render_chat(anchor)
        if before is None:
            return "Assistant:"
        return self.render_chat(anchor, add_generation_prompt=True)[len(before):]
