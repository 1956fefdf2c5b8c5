"""Prompt templates: how a question becomes verl's `prompt` column (a chat list of {role, content})."""

from __future__ import annotations

import dataclasses

QWEN_MATH_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
DAPO_PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n"
)
DAPO_SUFFIX = '\n\nRemember to put your answer on its own line after "Answer:"'


@dataclasses.dataclass(frozen=True)
class Template:
    """A system message (or None) and a user message with a `{question}` slot."""

    description: str
    user: str
    system: str | None = None

    def messages(self, question: str) -> list[dict[str, str]]:
        chat = [{"role": "system", "content": self.system}] if self.system else []
        # str.replace, not str.format: questions are full of LaTeX braces
        chat.append({"role": "user", "content": self.user.replace("{question}", question)})
        return chat


TEMPLATES: dict[str, Template] = {
    "qwen_math": Template(
        "question, newline, then the Qwen maths CoT instruction in the user turn (no system message: the chat "
        "template adds its own, which for Qwen2.5-Math is that same instruction, so it appears twice there)",
        "{question}\n" + QWEN_MATH_INSTRUCTION,
    ),
    "qwen_math_system": Template(
        "Qwen2.5-Math's official CoT prompt: the instruction as the system message, the bare question as user "
        "(default; the instruction appears once with every Qwen chat template)",
        "{question}",
        system=QWEN_MATH_INSTRUCTION,
    ),
    "dapo": Template("DAPO-Math-17k's template (final line 'Answer: ...')", DAPO_PREFIX + "{question}" + DAPO_SUFFIX),
    "plain": Template("the bare question, no instruction", "{question}"),
}
#: The prompt of Qwen2.5-Math's model card and evaluation toolkit, and of public R1-Zero-style RL on these models
#: (Dr. GRPO's and SEED-GRPO's `qwen_math` template): rendered by Qwen2.5-Math's chat template, it is exactly what
#: that template renders for the bare question with no system message.
DEFAULT_TEMPLATE = "qwen_math_system"


def get_template(name: str) -> Template:
    """The template called `name`; ValueError naming the valid ones otherwise."""
    try:
        return TEMPLATES[name]
    except KeyError:
        raise ValueError(f"unknown prompt template {name!r}; valid: {', '.join(TEMPLATES)}") from None


def strip_dapo_template(text: str) -> str:
    """The bare question of a DAPO-Math-17k prompt (the text unchanged if it is not wrapped in that template)."""
    if text.startswith(DAPO_PREFIX):
        text = text[len(DAPO_PREFIX) :]
        if text.endswith(DAPO_SUFFIX):
            text = text[: -len(DAPO_SUFFIX)]
    return text.strip()
