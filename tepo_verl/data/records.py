"""Reading the question and the reference answer out of one raw record, whatever its source's field names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tepo_verl.data.registry import DatasetSpec
from tepo_verl.data.templates import strip_dapo_template


def get_field(record: Mapping[str, Any], dotted: str) -> Any:
    """`record["a"]["b"]` for "a.b"; None when any part is missing."""
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _first_present(record: Mapping[str, Any], fields: Sequence[str]) -> tuple[str | None, Any]:
    for field in fields:
        value = get_field(record, field)
        if value is not None and not (isinstance(value, str) and not value.strip()):
            return field, value
    return None, None


def _is_chat(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, str) and all(
        isinstance(m, Mapping) and "content" in m for m in value
    )


def question_text(record: Mapping[str, Any], spec: DatasetSpec) -> str:
    """The bare question ("" if none). A chat-list prompt gives its last user message, unwrapped from DAPO's
    template when it is in it."""
    _, value = _first_present(record, spec.question_fields)
    if value is None:
        return ""
    if _is_chat(value):
        users = [m["content"] for m in value if m.get("role", "user") == "user"]
        value = users[-1] if users else ""
        return strip_dapo_template(str(value))
    return str(value).strip()


def last_boxed_content(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (or `\\fbox{...}`) in a worked solution, via verl's MATH helpers."""
    from verl.utils.reward_score.math_reward import last_boxed_only_string

    boxed = last_boxed_only_string(text)
    if boxed is None:
        return None
    for left in ("\\boxed{", "\\fbox{", "\\boxed "):
        if boxed.startswith(left):
            return boxed[len(left) : -1 if left.endswith("{") else None].strip()
    return None


def _number_text(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def answer_text(record: Mapping[str, Any], spec: DatasetSpec) -> str:
    """The reference final answer as a string ("" if none).

    Numbers lose a trailing ".0" (AMC's 27.0 -> "27"); lists are joined with ", " (OlympiadBench's multi-part
    answers); GSM8K's worked answers give the number after "####" without thousands commas; a field called
    `solution` gives the content of its last \\boxed{}.
    """
    field, value = _first_present(record, spec.answer_fields)
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        return _number_text(value)
    if isinstance(value, Sequence) and not isinstance(value, str):
        parts = [_number_text(v) if isinstance(v, int | float) and not isinstance(v, bool) else str(v).strip()
                 for v in value]
        return ", ".join(p for p in parts if p)
    text = str(value).strip()
    if field is not None and field.split(".")[-1] == "solution":
        return last_boxed_content(text) or ""
    if "####" in text:
        return text.split("####")[-1].strip().replace(",", "")
    return text
