"""Placeholder."""


class NoChatTemplateError(ValueError):
    pass


class ChatTemplate:
    pass


def render_chat(*a, **k):
    raise NotImplementedError
