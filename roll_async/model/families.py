"""The family zoo: offline random-init tiny models of real architectures, each with its family's chat template.

Token-exact multi-turn RL breaks in family-specific ways (think blocks dropped
from earlier turns, system prompts merged into a user turn, BOS and turn
closers), so ``roll-async make-tiny-model --family NAME`` builds a tiny model of
each family's architecture class with its special tokens and a template written
from the family's documented rendering, reduced to what a text-only agent
conversation uses, to test against those behaviours without a download.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roll_async.errors import RollAsyncError
from roll_async.model.tiny_build import (
    is_current_build,
    model_cache_dir,
    tiny_shape,
    write_model_dir,
)
from roll_async.model.tiny_tokenizer import train_tokenizer
from roll_async.prompts.tokenizers import ChatTokenizer

if TYPE_CHECKING:
    from transformers import PretrainedConfig

#: Bump when a family's recipe changes, so cached builds rebuild.
ZOO_BUILD_ID = "zoo-v2"
HEAD_DIM = 64

#: ChatML; a default system prompt when none is given; function tools listed in the system turn
#: inside ``<tools>``, calls as ``<tool_call>`` JSON (hermes), tool results wrapped in
#: ``<tool_response>`` inside a user turn.
QWEN2_5_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{- messages[0].content }}"
    "{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, '
    '\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
    "{%- elif messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or (message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{\\"name\\": \\"\' + tool_call.name + \'\\", \\"arguments\\": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: ChatML with think handling (also qwen3_moe): an assistant turn after the last user query keeps
#: (or, as the last message, gains an empty) ``<think>`` block, earlier ones lose it;
#: ``enable_thinking=False`` puts an empty think block into the generation prompt.
QWEN3_TEMPLATE = (
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}"
    "{%- for message in messages[::-1] %}"
    "{%- set index = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.multi_step_tool and message.role == 'user' and message.content is string"
    " and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}"
    "{%- set ns.multi_step_tool = false %}{%- set ns.last_query_index = index %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- for message in messages %}"
    "{%- if message.content is string %}{%- set content = message.content %}{%- else %}{%- set content = '' %}{%- endif %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{%- set reasoning_content = '' %}"
    "{%- if message.reasoning_content is string %}{%- set reasoning_content = message.reasoning_content %}"
    "{%- elif '</think>' in content %}"
    "{%- set reasoning_content = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- endif %}"
    "{%- if loop.index0 > ns.last_query_index %}"
    "{%- if loop.last or (not loop.last and reasoning_content) %}"
    "{{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + content }}{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}"
    "{%- endif %}"
)

#: BOS ``<|begin_of_text|>``, header tokens, a system turn with the knowledge-cutoff lines always
#: present, ``<|eot_id|>`` closes turns, content trimmed; function tools go into the first user
#: message (Llama 3.1's ``tools_in_user_message``), a call is one JSON object with ``parameters``
#: (llama3_json), tool results are ``ipython`` turns.
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if not tools is defined %}{%- set tools = none %}{%- endif %}"
    "{%- if messages[0].role == 'system' %}{%- set system_message = messages[0].content | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system_message = '' %}{%- endif %}"
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{%- endif %}"
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' }}"
    "{{- system_message }}{{- '<|eot_id|>' }}"
    "{%- if tools is not none %}"
    "{%- set first_user_message = messages[0].content | trim %}{%- set messages = messages[1:] %}"
    "{{- '<|start_header_id|>user<|end_header_id|>\\n\\n' }}"
    "{{- 'Given the following functions, please respond with a JSON for a function call with its proper "
    "arguments that best answers the given prompt.\\n\\n' }}"
    '{{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
    "value}.Do not use variables.\\n\\n' }}"
    "{%- for t in tools %}{{- t | tojson(indent=4) }}{{- '\\n\\n' }}{%- endfor %}"
    "{{- first_user_message + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role in ['ipython', 'tool'] %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
    "{%- elif message.tool_calls %}"
    "{%- set tool_call = message.tool_calls[0].function %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{{- '{\"name\": \"' + tool_call.name + '\", \"parameters\": ' + tool_call.arguments | tojson + '}' }}"
    "{{- '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content | trim + '<|eot_id|>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

#: BOS ``<s>``, ``[INST] ... [/INST]``, the system prompt merged into the *last* user message,
#: ``</s>`` after each reply, user/assistant alternation (tool-call turns aside); function tools in
#: ``[AVAILABLE_TOOLS]`` before the last user message, calls as ``[TOOL_CALLS]`` + a JSON list
#: (Mistral 7B v0.3, the pre-v11 mistral parser format), results in ``[TOOL_RESULTS]``.
MISTRAL_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}{%- set system_message = messages[0]['content'] %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- if not tools is defined %}{%- set tools = none %}{%- endif %}"
    "{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}"
    "{%- set ns = namespace(index=0) %}"
    "{%- for message in loop_messages %}"
    "{%- if not (message.role == 'tool' or message.tool_calls) %}"
    "{%- if (message['role'] == 'user') != (ns.index % 2 == 0) %}"
    "{{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- set ns.index = ns.index + 1 %}"
    "{%- endif %}"
    "{%- endfor %}"
    "{{- bos_token }}"
    "{%- for message in loop_messages %}"
    "{%- if message['role'] == 'user' %}"
    "{%- if tools is not none and (message == user_messages[-1]) %}"
    "{{- '[AVAILABLE_TOOLS] [' }}"
    "{%- for tool in tools %}{{- tool | tojson }}{%- if not loop.last %}{{- ', ' }}{%- endif %}{%- endfor %}"
    "{{- '][/AVAILABLE_TOOLS]' }}"
    "{%- endif %}"
    "{%- if loop.last and system_message is defined %}{{- '[INST] ' + system_message + '\\n\\n' + message['content'] + '[/INST]' }}"
    "{%- else %}{{- '[INST] ' + message['content'] + '[/INST]' }}{%- endif %}"
    "{%- elif message.tool_calls %}"
    "{{- '[TOOL_CALLS] [' }}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- set function = tool_call.function %}"
    '{{- \'{"name": "\' + function.name + \'", "arguments": \' + function.arguments | tojson }}'
    "{{- ', \"id\": \"' + tool_call.id + '\"}' }}{%- if not loop.last %}{{- ', ' }}{%- endif %}"
    "{%- endfor %}"
    "{{- ']' + eos_token }}"
    "{%- elif message['role'] == 'assistant' %}{{- ' ' + message['content'] | trim + eos_token }}"
    "{%- elif message['role'] == 'tool' %}"
    "{{- '[TOOL_RESULTS] ' + {'content': message['content'], 'call_id': message['tool_call_id']} | tojson + ' [/TOOL_RESULTS]' }}"
    "{%- else %}{{- raise_exception('Only user, assistant and tool roles are supported, with the exception of an initial optional system message!') }}"
    "{%- endif %}"
    "{%- endfor %}"
)

#: BOS ``<bos>``, no system role (the system prompt is prefixed to the first user message),
#: ``model`` as the assistant role, ``<end_of_turn>``.
GEMMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' %}"
    "{%- set loop_messages = messages[1:] %}{%- else %}{%- set first_user_prefix = '' %}{%- set loop_messages = messages %}{%- endif %}"
    "{%- for message in loop_messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif %}"
    "{%- if message['role'] == 'assistant' %}{%- set role = 'model' %}{%- else %}{%- set role = message['role'] %}{%- endif %}"
    "{{- '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{- message['content'] | trim }}{{- '<end_of_turn>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<start_of_turn>model\\n' }}{%- endif %}"
)

#: ``<|system|>``/``<|user|>``/``<|assistant|>`` + ``<|end|>``; a render without generation
#: prompt ends with ``<|endoftext|>``.
PHI3_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and message['content'] %}{{- '<|system|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- elif message['role'] == 'user' %}{{- '<|user|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- elif message['role'] == 'assistant' %}{{- '<|assistant|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- else %}{{- eos_token }}{%- endif %}"
)

_CHATML = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@dataclass(frozen=True)
class Family:
    """One zoo entry: architecture, tokens and template."""

    name: str
    architecture: str
    chat_template: str
    special_tokens: list[str]
    eos_token: str
    pad_token: str
    bos_token: str | None = None
    #: Extra stop tokens for generation_config.json (turn ends the tokenizer's EOS is not).
    extra_eos_tokens: list[str] = field(default_factory=list)
    added_tokens: list[str] = field(default_factory=list)
    #: What the template does, in one line (README, check-model).
    summary: str = ""
    #: Builds the transformers config from the shared sizes and token ids.
    make_config: (
        Callable[[ChatTokenizer, Family, int, int], PretrainedConfig] | None
    ) = None


def _common(
    tokenizer: ChatTokenizer, family: Family, hidden: int, layers: int
) -> dict[str, Any]:
    eos_ids = [
        tokenizer.convert_tokens_to_ids(t)
        for t in [family.eos_token, *family.extra_eos_tokens]
    ]
    bos = family.bos_token or family.pad_token
    return dict(
        **tiny_shape(len(tokenizer), hidden, layers, HEAD_DIM),
        bos_token_id=tokenizer.convert_tokens_to_ids(bos),
        eos_token_id=eos_ids if len(eos_ids) > 1 else eos_ids[0],
        pad_token_id=tokenizer.convert_tokens_to_ids(family.pad_token),
        torch_dtype="float32",
    )


# Each config maker imports transformers itself: it is heavy and needed only when a model is built.
def _qwen2(
    tokenizer: ChatTokenizer, family: Family, hidden: int, layers: int
) -> PretrainedConfig:
    from transformers import Qwen2Config

    return Qwen2Config(
        **_common(tokenizer, family, hidden, layers),
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )


def _qwen3(
    tokenizer: ChatTokenizer, family: Family, hidden: int, layers: int
) -> PretrainedConfig:
    from transformers import Qwen3Config

    return Qwen3Config(
        **_common(tokenizer, family, hidden, layers),
        rope_theta=1000000.0,
        tie_word_embeddings=True,
    )


def _qwen3_moe(
    tokenizer: ChatTokenizer, family: Family, hidden: int, layers: int
) -> PretrainedConfig:
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        **_common(tokenizer, family, hidden, layers),
        rope_theta=1000000.0,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=hidden,
        decoder_sparse_step=1,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    )


def _llama(
    tokenizer: ChatTokenizer, family: Family, hidden: int, layers: int
) -> PretrainedConfig:
    from transformers import LlamaConfig

    return LlamaConfig(
        **_common(tokenizer, family, hidden, layers),
        rope_theta=500000.0,
        tie_word_embeddings=False,
    )


def _mistral(
    tokenizer: ChatTokenizer, family: Family, hidden: int, layers: int
) -> PretrainedConfig:
    from transformers import MistralConfig

    return MistralConfig(
        **_common(tokenizer, family, hidden, layers),
        rope_theta=1000000.0,
        sliding_window=None,
        tie_word_embeddings=False,
    )


def _gemma3(
    tokenizer: ChatTokenizer, family: Family, hidden: int, layers: int
) -> PretrainedConfig:
    from transformers import Gemma3TextConfig

    # One sliding-window layer and one global layer, as in Gemma 3's interleaving (5:1 at full size).
    return Gemma3TextConfig(
        **_common(tokenizer, family, hidden, layers),
        sliding_window=128,
        layer_types=["sliding_attention"] * (layers - 1) + ["full_attention"],
        query_pre_attn_scalar=HEAD_DIM,
        rope_theta=1000000.0,
        rope_local_base_freq=10000.0,
        tie_word_embeddings=True,
    )


def _phi3(
    tokenizer: ChatTokenizer, family: Family, hidden: int, layers: int
) -> PretrainedConfig:
    from transformers import Phi3Config

    kwargs = _common(tokenizer, family, hidden, layers)
    kwargs.pop("head_dim")  # Phi3 derives it from hidden_size / num_attention_heads
    return Phi3Config(
        **kwargs, rope_theta=10000.0, sliding_window=None, tie_word_embeddings=False
    )


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "qwen2_5",
            "Qwen2ForCausalLM",
            QWEN2_5_TEMPLATE,
            _CHATML,
            "<|im_end|>",
            "<|endoftext|>",
            added_tokens=["<tool_call>", "</tool_call>"],
            summary="ChatML, default system prompt, append-only; hermes <tool_call> tools",
            make_config=_qwen2,
        ),
        Family(
            "qwen3",
            "Qwen3ForCausalLM",
            QWEN3_TEMPLATE,
            _CHATML,
            "<|im_end|>",
            "<|endoftext|>",
            added_tokens=["<think>", "</think>"],
            summary="ChatML, strips <think> from earlier replies, enable_thinking",
            make_config=_qwen3,
        ),
        Family(
            "qwen3_moe",
            "Qwen3MoeForCausalLM",
            QWEN3_TEMPLATE,
            _CHATML,
            "<|im_end|>",
            "<|endoftext|>",
            added_tokens=["<think>", "</think>"],
            summary="Qwen3 template, mixture-of-experts MLP (4 experts, top-2)",
            make_config=_qwen3_moe,
        ),
        Family(
            "llama3",
            "LlamaForCausalLM",
            LLAMA3_TEMPLATE,
            [
                "<|begin_of_text|>",
                "<|end_of_text|>",
                "<|start_header_id|>",
                "<|end_header_id|>",
                "<|eot_id|>",
                "<|finetune_right_pad_id|>",
                "<|python_tag|>",
                "<|eom_id|>",
            ],
            "<|eot_id|>",
            "<|finetune_right_pad_id|>",
            bos_token="<|begin_of_text|>",
            extra_eos_tokens=["<|end_of_text|>"],
            summary="BOS, header tokens, system turn always rendered, content trimmed; JSON tool calls",
            make_config=_llama,
        ),
        Family(
            "mistral",
            "MistralForCausalLM",
            MISTRAL_TEMPLATE,
            [
                "<unk>",
                "<s>",
                "</s>",
                "[INST]",
                "[/INST]",
                "[TOOL_CALLS]",
                "[AVAILABLE_TOOLS]",
                "[/AVAILABLE_TOOLS]",
                "[TOOL_RESULTS]",
                "[/TOOL_RESULTS]",
            ],
            "</s>",
            "<unk>",
            bos_token="<s>",
            summary="BOS, [INST] turns, system prompt merged into the last user message; [TOOL_CALLS]",
            make_config=_mistral,
        ),
        Family(
            "gemma3",
            "Gemma3ForCausalLM",
            GEMMA3_TEMPLATE,
            ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>"],
            "<eos>",
            "<pad>",
            bos_token="<bos>",
            extra_eos_tokens=["<end_of_turn>"],
            summary="BOS, no system role (prefixed to the first user turn), sliding-window layers",
            make_config=_gemma3,
        ),
        Family(
            "phi3",
            "Phi3ForCausalLM",
            PHI3_TEMPLATE,
            ["<|endoftext|>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"],
            "<|endoftext|>",
            "<|endoftext|>",
            extra_eos_tokens=["<|end|>"],
            summary="<|role|> tags + <|end|>; EOS appended when no generation prompt",
            make_config=_phi3,
        ),
    ]
}


class UnknownFamilyError(RollAsyncError, ValueError):
    """``--family`` names no zoo family."""


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise UnknownFamilyError(
            f"unknown --family {name!r}; choose one of: {', '.join(FAMILIES)} (or omit --family for the default tiny Qwen2 model)"
        )
    return FAMILIES[name]


def default_family_dir(name: str) -> Path:
    """Beside the default tiny model (``$ROLL_ASYNC_CACHE`` or ~/.cache/roll_async), one directory per family."""
    return model_cache_dir() / f"{ZOO_BUILD_ID}-{name}"


def build_family_model(
    name: str,
    out_dir: str | os.PathLike[str] | None = None,
    *,
    vocab_size: int = 1024,
    hidden_size: int = 128,
    num_layers: int = 2,
    seed: int = 0,
    force: bool = False,
) -> Path:
    """Build (or reuse) the tiny model of family ``name`` and return its directory.

    Hidden 128 and head_dim 64 (vLLM's CPU attention rejects smaller heads), 2 layers by default.
    """
    # torch and transformers are heavy: loaded only when a model is built.
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    family = get_family(name)
    out = Path(out_dir) if out_dir is not None else default_family_dir(name)
    build_info = {
        "build_id": ZOO_BUILD_ID,
        "family": name,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "seed": seed,
    }
    if not force and is_current_build(out, build_info):
        return out
    tokenizer = train_tokenizer(
        vocab_size,
        special_tokens=family.special_tokens,
        chat_template=family.chat_template,
        eos_token=family.eos_token,
        pad_token=family.pad_token,
        bos_token=family.bos_token,
        additional_special_tokens=[],
        added_tokens=family.added_tokens,
    )
    assert family.make_config is not None, name  # every zoo family has one
    config = family.make_config(tokenizer, family, hidden_size, num_layers)
    config.architectures = [family.architecture]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
    )
    return write_model_dir(out, build_info, model, tokenizer)
