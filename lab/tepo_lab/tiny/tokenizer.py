"""A byte-level BPE tokenizer for tiny Qwen2 models: the 256 byte symbols (no merges) + Qwen's special tokens.

transformers 5 loads any `model_type=qwen2` tokenizer as Qwen2Tokenizer (byte-level BPE), so a vocabulary
must be byte-level to round-trip spaces and newlines; with no merges every byte is one token (so "\\n" is one
token and a k-digit number is k tokens). Ids 0..255 are the bytes in order; the special tokens follow.
"""

from __future__ import annotations

import json
from pathlib import Path

#: Qwen2.5's added tokens, in Qwen's order (ids 256.. here).
QWEN_SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>",
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
    "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>",
]
#: Not "special" in Qwen's tokenizer (they are decoded like text).
NON_SPECIAL = {"<tool_call>", "</tool_call>"}

EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"

#: Qwen's ChatML template (system prompt optional; extra template kwargs such as tools are ignored).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable-character map used by byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1)
    )
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    return dict(zip(printable, (chr(code) for code in codes)))


def vocab() -> dict[str, int]:
    table = bytes_to_unicode()
    return {table[byte]: byte for byte in range(256)}


def vocab_size() -> int:
    return 256 + len(QWEN_SPECIAL_TOKENS)


def build_tokenizer_object():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab=vocab(), merges=[], fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(token, special=token not in NON_SPECIAL, normalized=False) for token in QWEN_SPECIAL_TOKENS]
    )
    return tokenizer


def save_tokenizer(out_dir: str | Path) -> None:
    """Write tokenizer.json, vocab.json, merges.txt and tokenizer_config.json (Qwen2Tokenizer) into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer_object()
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "vocab.json").write_text(json.dumps(vocab(), ensure_ascii=False, sort_keys=True))
    (out_dir / "merges.txt").write_text("#version: 0.2\n")
    added = {
        str(256 + index): {
            "content": token, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": token not in NON_SPECIAL,
        }
        for index, token in enumerate(QWEN_SPECIAL_TOKENS)
    }
    config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in QWEN_SPECIAL_TOKENS if t not in NON_SPECIAL and t != PAD_TOKEN
                                      and t != EOS_TOKEN],
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "errors": "replace",
        "model_max_length": 1024,
        "split_special_tokens": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    (out_dir / "special_tokens_map.json").write_text(
        json.dumps({"eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}, indent=2, sort_keys=True)
    )
