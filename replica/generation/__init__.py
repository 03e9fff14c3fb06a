"""What a checkpoint says about generation, read from its directory without torch: the defaults
of ``generation_config.json`` and the chat template (the front door renders prompts with it)."""

from replica.generation.chat_template import ChatTemplate, NoChatTemplateError, render_chat
from replica.generation.defaults import GenerationDefaults

__all__ = ["ChatTemplate", "GenerationDefaults", "NoChatTemplateError", "render_chat"]
