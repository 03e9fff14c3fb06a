"""``ChatTemplate``: a checkpoint's chat template, rendered as transformers'
``apply_chat_template(..., tokenize=False)`` renders it.

The template comes from where transformers takes it: ``chat_template.jinja`` and the named
``additional_chat_templates/*.jinja`` first, else ``tokenizer_config.json``'s ``chat_template`` (a
string, or a list of ``{"name", "template"}``). The special tokens the template sees
(``bos_token``, ``eos_token``, ...) are the tokenizer config's (else ``special_tokens_map.json``'s).
The environment is transformers': sandboxed and immutable, ``trim_blocks`` and ``lstrip_blocks``,
loop controls, a ``{% generation %}`` block (rendered as its body), ``raise_exception``,
``strftime_now``, a ``tojson`` that does not escape HTML, and the guarded ``dict`` and
``namespace``. Messages lose their ``None`` values and get their reasoning under the names
templates read (``reasoning_content``, ``thinking``); everything the template sees is rebuilt out
of plain JSON values. Torch-free; immutable once loaded (compiled templates are cached).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")  # fmt: skip
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class NoChatTemplateError(ValueError):
    """The checkpoint has no chat template (chat endpoints cannot build its prompts)."""


@dataclass(frozen=True)
class ChatTemplate:
    templates: Mapping[str, str]  # by name; a checkpoint with one template has "default"
    special_tokens: Mapping[str, str]  # bos_token, eos_token, ... as the template sees them

    @classmethod
    def from_checkpoint(cls, model_path: str | None) -> ChatTemplate:
        """The template of the checkpoint directory ``model_path``; raises
        ``NoChatTemplateError`` when it has none (a built-in model has none)."""
        if not model_path:
            raise NoChatTemplateError("a built-in model has no chat template; send tokens or text")
        config = _json(os.path.join(model_path, "tokenizer_config.json"))
        templates = _template_files(model_path) or _config_templates(config)
        if not templates:
            raise NoChatTemplateError(
                f"{model_path} has no chat template (no chat_template.jinja, no chat_template in "
                "tokenizer_config.json); send text or tokens that are already a prompt"
            )
        tokens_map = _json(os.path.join(model_path, "special_tokens_map.json"))
        special = {}
        for name in SPECIAL_TOKENS:
            token = _token_text(config.get(name, tokens_map.get(name)))
            if token is not None:
                special[name] = token
        return cls(templates, special)

    def source(self, name: str | None = None, tools: Sequence[Any] | None = None) -> str:
        """The template text: ``name`` (a template name or a whole template), else the only
        one, else ``tool_use`` when there are tools, else ``default`` (as transformers picks)."""
        if name is not None:
            return self.templates.get(name, name)
        if len(self.templates) == 1 and "default" in self.templates:
            return self.templates["default"]
        if tools is not None and "tool_use" in self.templates:
            return self.templates["tool_use"]
        if "default" in self.templates:
            return self.templates["default"]
        raise NoChatTemplateError(
            f"the checkpoint has several chat templates and no default: {sorted(self.templates)}"
        )

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        tools: Sequence[Mapping[str, Any]] | None = None,
        documents: Sequence[Mapping[str, Any]] | None = None,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt of ``messages`` (dicts with ``role`` and ``content``); ``tools`` are JSON
        schemas; extra ``kwargs`` (``enable_thinking``, ...) reach the template and override the
        special tokens. A template's ``raise_exception`` raises ``jinja2.TemplateError``."""
        if not messages:
            raise ValueError("cannot render an empty conversation; give at least one message")
        if tools is not None and any(not isinstance(t, Mapping) for t in tools):
            raise TypeError("tools must be JSON schemas (dicts)")
        if documents is not None and any(not isinstance(d, Mapping) for d in documents):
            raise TypeError("documents must be dicts with 'title' and 'text' keys")
        chat = []
        for message in messages:
            if not isinstance(message, Mapping):
                raise TypeError(f"chat messages must be dicts, got {message!r}")
            chat.append(_with_reasoning({k: v for k, v in message.items() if v is not None}))
        template = _compile(self.source(chat_template, tools))
        return template.render(
            messages=_plain(chat),
            tools=_plain(list(tools) if tools is not None else None),
            documents=_plain(list(documents) if documents is not None else None),
            add_generation_prompt=add_generation_prompt,
            **_plain({**self.special_tokens, **kwargs}),
        )


def render_chat(
    model_path: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    **kwargs: Any,
) -> str:
    """``ChatTemplate.from_checkpoint(model_path).render_chat(...)`` (the checkpoint's files are
    read each call: keep the ``ChatTemplate`` to render many)."""
    template = ChatTemplate.from_checkpoint(model_path)
    return template.render_chat(messages, add_generation_prompt, tools, **kwargs)


# ----- reading the checkpoint ------------------------------------------------------------------


def _json(path: str) -> dict[str, Any]:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else {}


def _template_files(model_path: str) -> dict[str, str]:
    templates = {}
    main = os.path.join(model_path, "chat_template.jinja")
    if os.path.exists(main):
        with open(main, encoding="utf-8") as f:
            templates["default"] = f.read()
    extra = os.path.join(model_path, "additional_chat_templates")
    if os.path.isdir(extra):
        for name in sorted(os.listdir(extra)):
            if name.endswith(".jinja"):
                with open(os.path.join(extra, name), encoding="utf-8") as f:
                    templates[name.removesuffix(".jinja")] = f.read()
    return templates


def _config_templates(config: dict[str, Any]) -> dict[str, str]:
    value = config.get("chat_template")
    if isinstance(value, str):
        return {"default": value}
    if isinstance(value, list):
        return {t["name"]: t["template"] for t in value}
    return {}


def _token_text(token: Any) -> str | None:
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


# ----- what the template sees ------------------------------------------------------------------


def _with_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """The message's reasoning under ``reasoning_content`` and ``thinking`` too."""
    reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None), None)
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


def _plain(value: Any) -> Any:
    """``value`` rebuilt from plain JSON types (anything else becomes ``"<TypeName>"``), so the
    sandbox never sees an object with methods it does not know to be dangerous."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    return f"<{type(value).__name__}>"


class _Generation(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's text for training
    masks in transformers; rendering it gives its body."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.CallBlock:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return caller()


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _TemplateDict:
    """``dict(...)`` for templates, without the attributes of the type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """jinja's ``namespace`` refusing underscore names (no way to CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - jinja's signature trick
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore attributes on a namespace: {name!r}"
            )


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["dict"] = _TemplateDict()
    env.globals["namespace"] = _Namespace
    return env.from_string(source)
