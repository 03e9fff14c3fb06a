# ruff: noqa: E501 - chat templates are long lines of Jinja, as in real checkpoints
"""Chat templates in the style of each family's instruct checkpoints (Bamba, Granite-4.0-H,
Nemotron-H, Falcon-H1, Qwen3-Next), written for the tests (the real ones cannot be downloaded
here). They use what real templates use: whitespace control, ``namespace``, loop variables,
``tojson``, ``raise_exception``, ``strftime_now``, ``bos_token``/``eos_token``, tools, tool calls
and tool results, reasoning, and extra keyword arguments (``enable_thinking``)."""

from __future__ import annotations

# Bamba-9B-v2 instruct: Granite 3 roles, a dated default system prompt.
BAMBA = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = "Knowledge Cutoff Date: April 2024.\nToday's Date: " + strftime_now('%B %d, %Y') + ".\nYou are Bamba, developed by IBM." %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\n' }}
{%- if tools %}
    {{- '<|start_of_role|>available_tools<|end_of_role|>' }}
    {%- for tool in tools %}
        {{- tool | tojson(indent=4) }}
        {%- if not loop.last %}{{- '\n\n' }}{%- endif %}
    {%- endfor %}
    {{- '<|end_of_text|>\n' }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}
        {{- '<|start_of_role|>user<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}
    {%- elif message['role'] == 'assistant' %}
        {{- '<|start_of_role|>assistant<|end_of_role|>' + message['content'] | default('') }}
        {%- if message.tool_calls is defined %}
            {{- '<|tool_call|>' + message.tool_calls | map(attribute='function') | list | tojson }}
        {%- endif %}
        {{- '<|end_of_text|>\n' }}
    {%- elif message['role'] == 'tool' %}
        {{- '<|start_of_role|>tool_response<|end_of_role|>' + message['content'] + '<|end_of_text|>\n' }}
    {%- else %}
        {{- raise_exception('Bamba templates take system, user, assistant and tool roles') }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_of_role|>assistant<|end_of_role|>' }}
{%- endif %}"""

# Granite-4.0-H: tools described in the system message, tool calls in <tool_call> tags.
GRANITE_4_H = r"""{%- set tools_prefix = 'You are a helpful assistant with access to the following tools. You may call one or more tools to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>' %}
{%- set tools_suffix = '\n</tools>\n\nFor each tool call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>.' %}
{%- if messages[0].role == 'system' %}
    {%- set system_message = messages[0].content %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = '' %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if tools %}
    {%- set ns = namespace(text=tools_prefix) %}
    {%- for tool in tools %}
        {%- set ns.text = ns.text + '\n' + (tool | tojson) %}
    {%- endfor %}
    {%- set system_message = (system_message + '\n\n' if system_message else '') + ns.text + tools_suffix %}
{%- endif %}
{%- if system_message %}
    {{- '<|start_of_role|>system<|end_of_role|>' + system_message + '<|end_of_text|>\n' }}
{%- endif %}
{%- for message in loop_messages %}
    {%- if message.role == 'assistant' %}
        {{- '<|start_of_role|>assistant<|end_of_role|>' }}
        {%- if message.content %}{{- message.content }}{%- endif %}
        {%- for call in message.tool_calls | default([]) %}
            {%- set fn = call.function if call.function is defined else call %}
            {{- '<tool_call>\n{"name": "' + fn.name + '", "arguments": ' + (fn.arguments | tojson) + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|end_of_text|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or loop_messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|start_of_role|>user<|end_of_role|>' }}
        {%- endif %}
        {{- '<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or loop_messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|end_of_text|>\n' }}
        {%- else %}
            {{- '\n' }}
        {%- endif %}
    {%- else %}
        {{- '<|start_of_role|>' + message.role + '<|end_of_role|>' + message.content + '<|end_of_text|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_of_role|>assistant<|end_of_role|>' }}
{%- endif %}"""

# Nemotron-H (Nano v2): /think and /no_think in the system message, <think> in the prompt.
NEMOTRON_H = r"""{%- set ns = namespace(system='', thinking=true) %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- set ns.system = message.content %}
        {%- if '/no_think' in message.content %}{%- set ns.thinking = false %}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if enable_thinking is defined and not enable_thinking %}{%- set ns.thinking = false %}{%- endif %}
{{- bos_token }}
{{- '<SPECIAL_10>System\n' + ns.system.replace('/think', '').replace('/no_think', '').strip() }}
{%- if tools %}
    {{- '\n\n# Tools\n\nYou have access to the following functions:\n\n<AVAILABLE_TOOLS>[' }}
    {%- for tool in tools %}{{- tool | tojson }}{%- if not loop.last %}, {% endif %}{%- endfor %}
    {{- ']</AVAILABLE_TOOLS>' }}
{%- endif %}
{{- '\n' }}
{%- for message in messages if message.role != 'system' %}
    {%- if message.role == 'user' %}
        {{- '<SPECIAL_11>User\n' + message.content + '\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set content = message.content | default('') %}
        {%- if '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip() %}{%- endif %}
        {{- '<SPECIAL_11>Assistant\n' + content }}
        {%- for call in message.tool_calls | default([]) %}
            {{- '<TOOLCALL>[' + (call.function | tojson) + ']</TOOLCALL>' }}
        {%- endfor %}
        {{- '\n<SPECIAL_12>\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<SPECIAL_11>User\n<TOOL_RESPONSE>[' + message.content + ']</TOOL_RESPONSE>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<SPECIAL_11>Assistant\n' + ('<think>\n' if ns.thinking else '<think></think>') }}
{%- endif %}"""

# Falcon-H1 instruct: <|system|> / <|user|> / <|assistant|> turns, tools as a JSON list.
FALCON_H1 = r"""{{- bos_token }}
{%- if tools %}
    {{- '<|system|>\n' }}
    {%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
    {{- 'You can call these tools:\n' + (tools | tojson(indent=2)) + '\n' }}
{%- elif messages[0].role == 'system' %}
    {{- '<|system|>\n' + messages[0].content + '\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {{- '<|user|>\n' + message.content + '\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|assistant|>\n' }}
        {%- if message.tool_calls is defined %}
            {{- message.tool_calls | map(attribute='function') | list | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- eos_token + '\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|tool|>\n' + message.content + '\n' }}
    {%- elif message.role != 'system' %}
        {{- raise_exception('unknown role ' + message.role) }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|assistant|>\n' }}
{%- endif %}"""

# Qwen3-Next: ChatML, <tools> in the system message, reasoning kept for the last turn only.
QWEN3_NEXT = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if message.role == 'user' and ns.last_query_index == messages|length - 1 %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == 'assistant' %}
        {%- set reasoning = message.reasoning_content | default('') %}
        {%- if loop.index0 > ns.last_query_index and reasoning %}
            {{- '<|im_start|>assistant\n<think>\n' + reasoning.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
        {%- else %}
            {{- '<|im_start|>assistant\n' + content }}
        {%- endif %}
        {%- for call in message.tool_calls | default([]) %}
            {%- if loop.first and content %}{{- '\n' }}{%- endif %}
            {{- '<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' }}
            {{- call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\n' }}{%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}"""

FAMILY_TEMPLATES = {
    "bamba": (BAMBA, "<|end_of_text|>", "<|end_of_text|>"),
    "granitemoehybrid": (GRANITE_4_H, "<|end_of_text|>", "<|end_of_text|>"),
    "nemotron_h": (NEMOTRON_H, "<s>", "<SPECIAL_12>"),
    "falcon_h1": (FALCON_H1, "<|begin_of_text|>", "<|end_of_text|>"),
    "qwen3_next": (QWEN3_NEXT, None, "<|im_end|>"),
}  # family: (template, bos token, eos token)
