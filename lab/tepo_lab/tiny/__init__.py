"""Tiny, offline, seeded building blocks for CPU runs of verl: a small Qwen2 policy with a byte-level tokenizer,
a verifiable addition task in verl's parquet schema, and its reward function. See build.py."""

from tepo_lab.tiny.build import TinySpec, build, default_cache_root

__all__ = ["TinySpec", "build", "default_cache_root"]
