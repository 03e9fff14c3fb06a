"""``ChatPrompts``: a conversation's prompt tokens, rendered with the checkpoint's chat template
and tokenized as a turn's text is (no special tokens added beyond those the template writes).

A continuation reuses a state: given the tokens a session holds (an earlier prompt and its
reply, EOS included), the prompt of the whole conversation is fed only past the text of those
tokens, when the rendering begins with that text exactly; otherwise (the template rewrote the
past, the client edited a message) the whole rendering is the prompt and nothing is reused.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jinja2

from replica.api import ChatPrompt, InvalidRequestError
from replica.generation.chat_template import ChatTemplate, NoChatTemplateError
from replica.model.tokenizer import Tokenizer


class ChatPrompts:
    def __init__(self, model_path: str | None, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        try:
            self.template: ChatTemplate | None = ChatTemplate.from_checkpoint(model_path)
            self.missing = ""
        except NoChatTemplateError as exc:
            self.template, self.missing = None, str(exc)

    def prompt(
        self, messages: Sequence[Mapping[str, Any]], prior_ids: Sequence[int] | None = None
    ) -> ChatPrompt:
        """The next turn's prompt of ``messages`` (generation prompt added), continuing the
        state of ``prior_ids`` where it can. Raises ``InvalidRequestError`` when the model has
        no template or the template refuses the conversation (its ``raise_exception``)."""
        if self.template is None:
            raise InvalidRequestError(f"{self.missing}; chat endpoints need a chat template")
        try:
            text = self.template.render_chat(messages, add_generation_prompt=True)
        except (jinja2.TemplateError, TypeError, ValueError) as exc:
            raise InvalidRequestError(f"the chat template refused the messages: {exc}") from None
        if prior_ids:
            prior = self.tokenizer.backend.decode(list(prior_ids), skip_special_tokens=False)
            if prior and len(text) > len(prior) and text.startswith(prior):
                rest = self.tokenizer.encode(text[len(prior) :])
                return ChatPrompt(rest, len(prior_ids))
        return ChatPrompt(self.tokenizer.encode(text), 0)
