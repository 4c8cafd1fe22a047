"""Qwen3 from scratch against the reference implementation's outputs on tiny checkpoints."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash.qwen3 import Qwen3

FIXTURES = Path(__file__).parent / "fixtures"
CHECKPOINTS = ["qwen3-tiny", "qwen3-tiny-sharded"]


@pytest.fixture(scope="module", params=CHECKPOINTS)
def model_and_reference(request):
    folder = FIXTURES / request.param
    return Qwen3.from_pretrained(folder), load_file(folder / "reference.safetensors")


@torch.no_grad()
def test_logits_match_reference(model_and_reference):
    model, ref = model_and_reference
    logits = model(ref["input_ids"])
    assert logits.shape == ref["logits"].shape
    assert (logits - ref["logits"]).abs().max() <= 1e-4


@torch.no_grad()
def test_every_layer_matches_reference(model_and_reference):
    model, ref = model_and_reference
    layers = model.config.num_hidden_layers
    _, features = model(ref["input_ids"], capture_layers=range(layers))
    per_layer = features.split(model.config.hidden_size, dim=-1)
    assert (model.embed_tokens(ref["input_ids"]) - ref["hidden_states"][0]).abs().max() <= 1e-4
    for layer in range(layers - 1):
        assert (per_layer[layer] - ref["hidden_states"][layer + 1]).abs().max() <= 1e-4, layer
    # The reference's last entry is taken after the final norm.
    assert (model.norm(per_layer[-1]) - ref["hidden_states"][layers]).abs().max() <= 1e-4


@torch.no_grad()
def test_captured_layers_come_in_the_order_asked(model_and_reference):
    model, ref = model_and_reference
    hidden = model.config.hidden_size
    _, ascending = model(ref["input_ids"], capture_layers=[0, 2])
    _, descending = model(ref["input_ids"], capture_layers=[2, 0])
    assert torch.equal(ascending[..., :hidden], descending[..., hidden:])


@torch.no_grad()
def test_greedy_continuation_matches_reference(model_and_reference):
    model, ref = model_and_reference
    prompt, expected = ref["greedy_prompt"], ref["greedy_output"]
    cache = model.new_cache(expected.shape[1])
    logits = model(prompt, cache=cache, logits_at=slice(-1, None))
    tokens = prompt[0].tolist()
    while len(tokens) < expected.shape[1]:
        tokens.append(int(logits[0, -1].argmax()))
        position = torch.tensor([len(tokens) - 1])
        logits = model(torch.tensor([tokens[-1:]]), positions=position, cache=cache, num_keys=len(tokens))
    assert tokens == expected[0].tolist()


@torch.no_grad()
def test_logits_at_selects_positions(model_and_reference):
    model, ref = model_and_reference
    full = model(ref["input_ids"])
    assert torch.allclose(model(ref["input_ids"], logits_at=slice(-1, None)), full[:, -1:], atol=1e-6)
    picked = torch.tensor([0, 5])
    assert torch.allclose(model(ref["input_ids"], logits_at=picked), full[:, picked], atol=1e-6)


@pytest.mark.parametrize("chunks", [[23], [10, 1, 1, 1, 10], [1] * 23, [4, 7, 12]])
@pytest.mark.parametrize("fixed_shape", [False, True])
@torch.no_grad()
def test_incremental_decoding_matches_full_forward(model_and_reference, chunks, fixed_shape):
    """Prefill then chunks of any size through the cache == one pass without a cache."""
    model, ref = model_and_reference
    ids = ref["input_ids"]
    full = model(ids)
    cache = model.new_cache(32, batch=ids.shape[0])
    start, pieces = 0, []
    for size in chunks:
        positions = torch.arange(start, start + size)
        num_keys = None if fixed_shape else start + size  # whole buffer, or only the filled prefix
        pieces.append(model(ids[:, start:start + size], positions=positions, cache=cache, num_keys=num_keys))
        start += size
    assert (torch.cat(pieces, dim=1) - full).abs().max() <= 1e-5


@torch.no_grad()
def test_trim_forgets_rejected_tokens(model_and_reference):
    """Write a chunk of wrong tokens, trim them away, continue: as if never written."""
    model, ref = model_and_reference
    ids = ref["input_ids"][:1]
    full = model(ids)
    cache = model.new_cache(40)
    model(ids[:, :12], cache=cache)
    cache.trim(12)
    wrong = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    model(wrong, positions=torch.arange(12, 21), cache=cache)
    cache.trim(12)  # O(1): the wrong keys are still in memory, but can no longer be seen
    rest = model(ids[:, 12:], positions=torch.arange(12, ids.shape[1]), cache=cache)
    assert (rest - full[:, 12:]).abs().max() <= 1e-5
    assert cache.length == 12


def test_trim_moves_a_length_only(model_and_reference):
    model, _ = model_and_reference
    cache = model.new_cache(16)
    buffers = [k.data_ptr() for k in cache.keys]
    cache.trim(7)
    assert cache.length == 7 and [k.data_ptr() for k in cache.keys] == buffers
    with pytest.raises(ValueError):
        cache.trim(17)


@torch.no_grad()
def test_left_padding_with_key_mask_is_exact(model_and_reference):
    """Batched generation pads prompts on the left; the padding mask must hide it."""
    model, ref = model_and_reference
    short = ref["input_ids"][:1, :15]
    alone = model(short)
    padded = torch.cat([torch.zeros(1, 8, dtype=torch.long), short], dim=1)  # (1, 23)
    real = torch.arange(23)[None, :] >= 8  # (1, 23): True for real tokens
    logits = model(padded, key_padding=real)
    assert (logits[:, 8:] - alone).abs().max() <= 1e-4


def test_weights_load_in_the_requested_dtype():
    model = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not any(p.is_meta for p in model.parameters())
    logits = model(torch.tensor([[1, 2, 3]]))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_save_and_reload_is_bit_identical(tmp_path):
    model = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny")
    model.save_pretrained(tmp_path)
    again = Qwen3.from_pretrained(tmp_path)
    for (name, ours), (_, theirs) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(ours, theirs), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
