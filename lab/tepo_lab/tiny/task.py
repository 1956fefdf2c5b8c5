"""The synthetic verifiable maths task: multi-digit addition, "What is 37+45?" -> "82".

Rows follow verl's RL dataset schema: data_source, prompt (chat list), ability, reward_model.ground_truth
(and style), extra_info. With the default operands 10..49 the answer (20..98) has 2 digits, i.e. 2 tokens with the
byte-level tokenizer.
"""

from __future__ import annotations

import random

DATA_SOURCE = "tepo_tiny_addition"
ABILITY = "math"
A_RANGE = (10, 49)  # first operand, inclusive (TinySpec overrides)
B_RANGE = (10, 49)  # second operand, inclusive


def question(a: int, b: int) -> str:
    return f"What is {a}+{b}?"


def problems(count: int, seed: int, exclude: set[tuple[int, int]] | None = None, a_range=A_RANGE,
             b_range=B_RANGE) -> list[tuple[int, int]]:
    """`count` distinct (a, b) pairs, seeded; none from `exclude`."""
    rng = random.Random(seed)
    exclude = exclude or set()
    seen: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []
    limit = len(set(all_problems(a_range, b_range)) - exclude)
    if count > limit:
        raise ValueError(f"only {limit} distinct problems are available, asked for {count}")
    while len(out) < count:
        pair = (rng.randint(*a_range), rng.randint(*b_range))
        if pair in seen or pair in exclude:
            continue
        seen.add(pair)
        out.append(pair)
    return out


def all_problems(a_range=A_RANGE, b_range=B_RANGE) -> list[tuple[int, int]]:
    return [(a, b) for a in range(a_range[0], a_range[1] + 1) for b in range(b_range[0], b_range[1] + 1)]


def row(a: int, b: int, split: str, index: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question(a, b)}],
        "ability": ABILITY,
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index, "a": a, "b": b, "answer": str(a + b)},
    }
