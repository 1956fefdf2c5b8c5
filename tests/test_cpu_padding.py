"""The CPU mode's padding helpers (lab/tepo_lab/cpu/padding.py) and fix 7, which hands them to verl without flash-attn.

The helpers are checked against loops written from flash-attn's definitions (`flash_attn.bert_padding`), on masks
Hypothesis draws; the fix on the installed verl's own `verl.utils.attention_utils` (in a fresh process, so this one
keeps verl's module as it is), where verl 0.9.0 without the fix fails for want of flash-attn.
"""

from __future__ import annotations

import json
import textwrap
import types

import fresh_python
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tepo_lab.cpu import padding, patches

pytestmark = pytest.mark.verl_090


def _masks():
    """(B, S) 0/1 attention masks, each row with at least one token (as verl's batches have)."""
    return st.integers(1, 4).flatmap(lambda b: st.integers(1, 6).flatmap(
        lambda s: st.lists(st.lists(st.integers(0, 1), min_size=s, max_size=s).filter(any), min_size=b, max_size=b)))


def reference_unpad(hidden, mask):
    """Loops over flash-attn's definition: the kept tokens in row-major order and their flat positions."""
    B, S = mask.shape
    tokens, indices, lengths = [], [], []
    for b in range(B):
        kept = [s for s in range(S) if mask[b, s]]
        tokens += [hidden[b, s] for s in kept]
        indices += [b * S + s for s in kept]
        lengths.append(len(kept))
    offsets = [0]
    for length in lengths:
        offsets.append(offsets[-1] + length)
    return torch.stack(tokens), torch.tensor(indices), torch.tensor(offsets, dtype=torch.int32), max(lengths), lengths


@settings(max_examples=60, deadline=None)
@given(_masks(), st.integers(0, 2**31 - 1))
def test_unpad_then_pad_matches_the_definition(mask_rows, seed):
    mask = torch.tensor(mask_rows, dtype=torch.int64)  # (B, S)
    B, S = mask.shape
    hidden = torch.randn(B, S, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    tokens, indices, cu_seqlens, max_len, used = padding.unpad_input(hidden, mask)
    ref_tokens, ref_indices, ref_offsets, ref_max, ref_lengths = reference_unpad(hidden, mask)
    assert torch.equal(tokens, ref_tokens) and torch.equal(indices, ref_indices)
    assert torch.equal(cu_seqlens, ref_offsets) and cu_seqlens.dtype == torch.int32
    assert max_len == ref_max and used.tolist() == ref_lengths
    padded = padding.pad_input(tokens, indices, B, S)  # (B, S, 3)
    for b in range(B):
        for s in range(S):
            expected = hidden[b, s] if mask[b, s] else torch.zeros(3, dtype=torch.float64)
            assert torch.equal(padded[b, s], expected)


def test_unused_tokens_are_kept_but_not_counted_as_used():
    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0]])
    unused = torch.tensor([[0, 0, 1, 0], [0, 0, 0, 0]])
    hidden = torch.arange(8.0).view(2, 4, 1)
    tokens, indices, cu_seqlens, max_len, used = padding.unpad_input(hidden, mask, unused)
    assert indices.tolist() == [0, 1, 2, 4] and tokens.flatten().tolist() == [0.0, 1.0, 2.0, 4.0]
    assert cu_seqlens.tolist() == [0, 3, 4] and max_len == 3 and used.tolist() == [2, 1]


def test_gradients_reach_only_the_kept_positions():
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    hidden = torch.randn(2, 3, 2, dtype=torch.float64, requires_grad=True)
    tokens, indices, *_ = padding.unpad_input(hidden, mask)
    weights = torch.randn_like(tokens)
    (tokens * weights).sum().backward()
    expected = torch.zeros(6, 2, dtype=torch.float64)
    expected[indices] = weights
    assert torch.equal(hidden.grad, expected.view(2, 3, 2))


def test_bad_input_names_the_shape():
    with pytest.raises(ValueError, match=r"2 or more dimensions, got shape \(5,\)"):
        padding.index_first_axis(torch.zeros(5), torch.tensor([0]))


# ------------------------------------------------------------------------------------------------------------
# fix 7 on verl's own module
# ------------------------------------------------------------------------------------------------------------

PROBE = textwrap.dedent(
    """
    import importlib.util, json
    import torch
    import verl.utils.attention_utils as au
    from tepo_lab.cpu import patches

    hidden = torch.arange(12.0).view(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])

    def unpad():
        tokens, indices, cu_seqlens, max_len, _ = au.unpad_input(hidden, mask)
        padded = au.pad_input(tokens, indices, 2, 3)
        first = au.index_first_axis(hidden[0], indices[:1])
        return {"tokens": tokens.tolist(), "indices": indices.tolist(), "cu_seqlens": cu_seqlens.tolist(),
                "max_len": max_len, "padded": padded.tolist(), "first": first.tolist()}

    out = {"flash_attn": importlib.util.find_spec("flash_attn") is not None}
    try:
        out["stock"] = unpad()
    except ImportError as error:
        out["stock_error"] = f"{type(error).__name__}: {error}"
    patches.patch_attention_padding(au)
    out["patched"] = unpad()
    print("PROBE " + json.dumps(out))
    """
)


def test_verl_removes_padding_without_flash_attn_once_fixed():
    result = fresh_python.run(["-c", PROBE])
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads([line for line in result.stdout.splitlines() if line.startswith("PROBE ")][-1][len("PROBE "):])
    hidden = torch.arange(12.0).view(2, 3, 2)  # as in PROBE
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    tokens, indices, offsets, max_len, _ = reference_unpad(hidden, mask)
    assert out["patched"] == {"tokens": tokens.tolist(), "indices": indices.tolist(), "cu_seqlens": offsets.tolist(),
                              "max_len": max_len, "padded": (hidden * mask[..., None]).tolist(),
                              "first": hidden[0][indices[:1]].tolist()}
    if "stock" in out:  # verl falls back by itself (0.9.1) or flash-attn imports: the fix changes no result
        assert out["stock"] == out["patched"]
    else:  # verl 0.9.0 without flash-attn: the reason for the fix
        assert not out["flash_attn"] and "flash_attn" in out["stock_error"], out


def test_the_fix_passes_verls_own_lookup_through_when_it_works():
    found = ("index_first_axis", "pad_input", "rearrange", "unpad_input")
    module = types.SimpleNamespace(_get_attention_functions=lambda: found)
    patches.patch_attention_padding(module)
    patches.patch_attention_padding(module)  # idempotent: wraps verl's function once
    assert module._get_attention_functions() is found
    assert module._get_attention_functions.__tepo_cpu_stock__() is found
