"""Chat templates for tests of rendering: :data:`MERGING_USER_TURNS` is not prefix-stable, and
:data:`ALTERNATING_ONLY` refuses two messages of one role in a row (as Llama 2's and Mistral's templates do).

It writes ChatML, but merges consecutive user messages into one turn (as templates that require alternating
roles do), so the turn of a user message is written differently once another user message follows it: the case
:func:`c2c.conversation.render.template_stability` names, where every conversation is rendered whole.
"""

MERGING_USER_TURNS = (
    "{% for m in messages %}"
    "{%- if loop.index0 > 0 and messages[loop.index0 - 1]['role'] == 'user' and m['role'] == 'user' -%}"
    "{{ '\\n' + m['content'] }}"
    "{%- else -%}{%- if loop.index0 > 0 %}<|im_end|>\n{% endif -%}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{%- endif -%}{% endfor %}{% if messages %}<|im_end|>\n{% endif %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

ALTERNATING_ONLY = (
    "{% for m in messages %}"
    "{%- if loop.index0 > 0 and messages[loop.index0 - 1]['role'] == m['role'] -%}"
    "{{ raise_exception('Conversation roles must alternate') }}{%- endif -%}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
