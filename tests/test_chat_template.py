"""The chat template of a checkpoint is rendered exactly as transformers'
``apply_chat_template(..., tokenize=False)`` renders it from the same directory: for a template
in each family's style, with system/user/assistant (and tool) messages, ``add_generation_prompt``
both ways, with and without tools, and extra keyword arguments; named templates, the
``chat_template.jinja`` file, and a checkpoint without a template."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from replica.generation import ChatTemplate, NoChatTemplateError, render_chat
from tests.support.chat_templates import FAMILY_TEMPLATES

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Météo d'une ville <à jour> & précise",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "la ville"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now", "description": "the time", "parameters": {}}},
]
CHAT = [
    {"role": "system", "content": "You are terse. /no_think"},
    {"role": "user", "content": "Hello! ✓"},
    {"role": "assistant", "content": "Hi.", "reasoning_content": "greet back"},
    {"role": "user", "content": "Weather in Paris?"},
]
TOOL_CHAT = [
    *CHAT,
    {
        "role": "assistant",
        "content": None,  # as the OpenAI API sends it: dropped before rendering
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "tool", "content": '{"wind": 3}'},
]
CASES = [
    (CHAT[1:], {}),  # no system message: the template's default (Bamba dates it)
    (CHAT, {}),
    (CHAT, {"enable_thinking": False}),
    (TOOL_CHAT, {"tools": TOOLS}),
]


def write_checkpoint(path: Path, config: dict, files: dict[str, str] | None = None) -> str:
    """A tokenizer directory transformers' ``AutoTokenizer`` loads: a small BPE
    ``tokenizer.json``, ``tokenizer_config.json`` = ``config``, and ``files``."""
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", *{v for k, v in config.items() if k.endswith("_token") and v}]
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(["hello there, how is the weather in Paris"] * 8, trainer)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", **config})
    )
    for name, text in (files or {}).items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return str(path)


def hf_render(path: str, messages, add_generation_prompt: bool, **kwargs) -> str:
    tok = transformers.AutoTokenizer.from_pretrained(path)
    return tok.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )


@pytest.mark.parametrize("family", sorted(FAMILY_TEMPLATES))
def test_family_templates_render_as_transformers_renders_them(family, tmp_path):
    template, bos, eos = FAMILY_TEMPLATES[family]
    config = {"chat_template": template, "bos_token": bos, "eos_token": eos, "pad_token": "<pad>"}
    path = write_checkpoint(tmp_path / family, config)
    ours = ChatTemplate.from_checkpoint(path)
    for messages, kwargs in CASES:
        got = {}
        for add_generation_prompt in (True, False):
            expected = hf_render(path, messages, add_generation_prompt, **kwargs)
            got[add_generation_prompt] = ours.render_chat(messages, add_generation_prompt, **kwargs)
            assert got[add_generation_prompt] == expected, (messages, kwargs, add_generation_prompt)
        assert got[True] != got[False] and "Weather in Paris?" in got[False]
        assert ("get_weather" in got[False]) == ("tools" in kwargs)
    assert render_chat(path, CHAT, tools=TOOLS) == hf_render(path, CHAT, True, tools=TOOLS)


def test_the_template_file_and_named_templates(tmp_path):
    plain = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    tooled = "TOOLS {{ tools | tojson }}\n" + plain
    # chat_template.jinja and additional_chat_templates/ take priority over the config's entry
    path = write_checkpoint(
        tmp_path / "files",
        {"chat_template": "ignored {{ messages }}", "eos_token": "</s>"},
        {"chat_template.jinja": plain, "additional_chat_templates/tool_use.jinja": tooled},
    )
    ours = ChatTemplate.from_checkpoint(path)
    for tools in (None, TOOLS):
        assert ours.render_chat(CHAT, tools=tools) == hf_render(path, CHAT, True, tools=tools)
    assert "TOOLS" in ours.render_chat(CHAT, tools=TOOLS)
    # a list of named templates in tokenizer_config.json; "tool_use" is picked when tools are given
    named = [{"name": "default", "template": plain}, {"name": "tool_use", "template": tooled}]
    path = write_checkpoint(tmp_path / "named", {"chat_template": named, "eos_token": "</s>"})
    ours = ChatTemplate.from_checkpoint(path)
    for tools in (None, TOOLS):
        assert ours.render_chat(CHAT, tools=tools) == hf_render(path, CHAT, True, tools=tools)
    by_name = ours.render_chat(CHAT, chat_template="tool_use", tools=[])
    assert by_name == hf_render(path, CHAT, True, chat_template="tool_use", tools=[])


def test_errors_are_clear(tmp_path):
    path = write_checkpoint(tmp_path / "none", {"eos_token": "</s>"})
    with pytest.raises(NoChatTemplateError, match="no chat template"):
        ChatTemplate.from_checkpoint(path)
    with pytest.raises(NoChatTemplateError, match="built-in"):
        ChatTemplate.from_checkpoint(None)
    template, bos, eos = FAMILY_TEMPLATES["falcon_h1"]
    path = write_checkpoint(tmp_path / "falcon", {"chat_template": template, "eos_token": eos})
    bad = [{"role": "narrator", "content": "once upon a time"}]
    with pytest.raises(jinja2.TemplateError, match="unknown role narrator") as ours:
        ChatTemplate.from_checkpoint(path).render_chat(bad)
    with pytest.raises(jinja2.TemplateError) as theirs:
        hf_render(path, bad, True)
    assert str(ours.value) == str(theirs.value)
    with pytest.raises(ValueError, match="empty conversation"):
        ChatTemplate.from_checkpoint(path).render_chat([])
    # the sandbox: no way from a template to Python internals
    evil = write_checkpoint(
        tmp_path / "evil",
        {"chat_template": "{{ messages.__class__.__mro__ }}{% set ns = namespace(_x=1) %}"},
    )
    with pytest.raises(jinja2.exceptions.SecurityError):
        ChatTemplate.from_checkpoint(evil).render_chat(CHAT)
