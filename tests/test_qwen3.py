"""Qwen3 from scratch against the reference implementation's outputs on tiny checkpoints."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dflash.qwen3 import Qwen3, Qwen3Config
from tests.reference import as_the_reference_was_made, logits_of

FIXTURES = Path(__file__).parent / "fixtures"
CHECKPOINTS = ["qwen3-tiny", "qwen3-tiny-sharded"]


@pytest.fixture(scope="module", params=CHECKPOINTS)
def model_and_reference(request):
    folder = FIXTURES / request.param
    return as_the_reference_was_made(Qwen3.from_pretrained(folder)), load_file(folder / "reference.safetensors")


@torch.no_grad()
def test_loading_keeps_float32_rope_frequencies_as_the_official_loader():
    """A bf16 checkpoint computed in float32: the official from_pretrained does not round inv_freq."""
    folder = FIXTURES / "qwen3-tiny-sharded"
    loaded = load_file(folder / "loaded_reference.safetensors")  # transformers 4.57.1, from_pretrained(fp32)
    model = Qwen3.from_pretrained(folder)
    assert torch.equal(model.rotary.inv_freq, loaded["inv_freq"])
    assert (logits_of(model, loaded["input_ids"]) - loaded["logits"]).abs().max() <= 1e-5
    in_bf16 = Qwen3.from_pretrained(folder, dtype=torch.bfloat16)
    assert in_bf16.rotary.inv_freq.dtype == torch.float32
    assert torch.equal(in_bf16.rotary.inv_freq, loaded["inv_freq"])  # the official bf16 load keeps them too


def test_casting_and_moving_keep_float32_rope_frequencies():
    """`.to(bf16)` on a model built in memory (as train.py's tau evaluation casts its drafter) must not round them,
    and `.to_empty()` must not leave them uninitialised."""
    model = Qwen3(Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    exact = model.rotary.inverse_frequencies()
    for moved in (model.to(torch.bfloat16), model.to_empty(device="cpu"), model.half()):
        assert moved.rotary.inv_freq.dtype == torch.float32 and torch.equal(moved.rotary.inv_freq, exact)


@torch.no_grad()
def test_logits_match_reference(model_and_reference):
    model, ref = model_and_reference
    logits = logits_of(model, ref["input_ids"])
    assert logits.shape == ref["logits"].shape
    assert (logits - ref["logits"]).abs().max() <= 1e-4


@torch.no_grad()
def test_every_layer_matches_reference(model_and_reference):
    model, ref = model_and_reference
    layers = model.config.num_hidden_layers
    _, features = model(ref["input_ids"], capture_layers=range(layers))
    per_layer = features.split(model.config.hidden_size, dim=-1)
    assert (model.embed_tokens(ref["input_ids"]) - ref["hidden_states"][0]).abs().max() <= 1e-4
    for layer in range(layers):  # the last one is taken after the final norm, as the reference's
        assert (per_layer[layer] - ref["hidden_states"][layer + 1]).abs().max() <= 1e-4, layer


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
    logits = logits_of(model, prompt, cache=cache)
    cache.commit(prompt.shape[1])
    tokens = prompt[0].tolist()
    while len(tokens) < expected.shape[1]:
        tokens.append(int(logits[0, -1].argmax()))
        logits = logits_of(model, torch.tensor([tokens[-1:]]), cache=cache)  # right after the committed tokens
        cache.commit(1)
    assert tokens == expected[0].tolist()


@torch.no_grad()
def test_logits_of_the_rows_a_caller_needs(model_and_reference):
    """The forward returns normed hidden states; the LM head of chosen rows gives those rows' logits."""
    model, ref = model_and_reference
    hidden, features = model(ref["input_ids"])
    assert features is None and hidden.shape[-1] == model.config.hidden_size
    picked = torch.tensor([0, 5])
    torch.testing.assert_close(model.logits(hidden[:, picked]), ref["logits"][:, picked], atol=1e-4, rtol=0)


@torch.no_grad()
def test_repeated_capture_layers_each_get_their_own_layer(model_and_reference):
    """Drafter configs may repeat a layer ([1, 2, 2, 3]): each entry is that layer's output."""
    model, ref = model_and_reference
    hidden, last = model.config.hidden_size, model.config.num_hidden_layers - 1
    _, single = model(ref["input_ids"], capture_layers=range(last + 1))
    per_layer = single.split(hidden, dim=-1)
    _, repeated = model(ref["input_ids"], capture_layers=[1, 0, 0, last])
    expected = torch.cat([per_layer[1], per_layer[0], per_layer[0], per_layer[last]], dim=-1)
    assert torch.equal(repeated, expected)


@torch.no_grad()
def test_captured_last_layer_is_the_official_last_hidden_state(model_and_reference):
    """hidden_states[L] of the reference is taken after the final norm."""
    model, ref = model_and_reference
    last = model.config.num_hidden_layers - 1
    _, features = model(ref["input_ids"], capture_layers=[last])
    assert (features - ref["hidden_states"][last + 1]).abs().max() <= 1e-4


@pytest.mark.parametrize("chunks", [[23], [10, 1, 1, 1, 10], [1] * 23, [4, 7, 12]])
@pytest.mark.parametrize("fixed_shape", [False, True])
@torch.no_grad()
def test_incremental_decoding_matches_full_forward(model_and_reference, chunks, fixed_shape):
    """Prefill then chunks of any size through the cache == one pass without a cache."""
    model, ref = model_and_reference
    ids = ref["input_ids"]
    full = logits_of(model, ids)
    cache = model.new_cache(32, batch=ids.shape[0])
    cache.read_limit = cache.max_length if fixed_shape else None  # the whole buffer, as compiled passes
    pieces = []
    for size in chunks:
        start = cache.length
        pieces.append(logits_of(model, ids[:, start:start + size], cache=cache))
        cache.commit(size)
    assert (torch.cat(pieces, dim=1) - full).abs().max() <= 1e-5


def continue_after_garbage(model, ids, garbage, fixed_shape: bool) -> float:
    """Cache 12 tokens, fill every slot past `length` with `garbage(shape)`, run the rest of `ids`.

    Returns the largest difference to a pass over all of `ids` without a cache.
    """
    full = logits_of(model, ids)
    cache = model.new_cache(40)
    cache.read_limit = cache.max_length if fixed_shape else None
    model(ids[:, :12], cache=cache)
    cache.commit(12)
    for buffer in cache.keys + cache.values:
        tail = buffer[:, :, cache.length:]
        tail.copy_(garbage(tail.shape))
    rest = logits_of(model, ids[:, 12:], cache=cache)
    return (rest - full[:, 12:]).abs().max().item()


@torch.no_grad()
def test_eager_reads_nothing_past_the_committed_length(model_and_reference):
    """NaN in every slot past `length`: an eager pass never reads them, so nothing changes."""
    model, ref = model_and_reference
    nan = lambda shape: torch.full(shape, float("nan"))  # noqa: E731
    assert continue_after_garbage(model, ref["input_ids"][:1], nan, fixed_shape=False) <= 1e-5


@torch.no_grad()
def test_fixed_shape_reads_hide_every_slot_past_the_query(model_and_reference):
    """A compiled pass reads the whole buffer: the position mask must hide what lies past the query.

    The garbage here is large but finite. NaN cannot be hidden by any mask over a
    whole-buffer read: a masked value still meets the matmul with weight 0, and
    0 * NaN = NaN. Stale slots only ever hold finite keys and values of rejected
    tokens, and the eager test above shows that NaN is never even read there.
    """
    model, ref = model_and_reference
    large = lambda shape: 1e4 * torch.randn(shape, generator=torch.Generator().manual_seed(0))  # noqa: E731
    assert continue_after_garbage(model, ref["input_ids"][:1], large, fixed_shape=True) <= 1e-5


@torch.no_grad()
def test_trim_forgets_rejected_tokens(model_and_reference):
    """Write a chunk of wrong tokens, trim them away, continue: as if never written."""
    model, ref = model_and_reference
    ids = ref["input_ids"][:1]
    full = logits_of(model, ids)
    cache = model.new_cache(40)
    model(ids[:, :12], cache=cache)
    cache.commit(12)
    wrong = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    model(wrong, cache=cache)
    cache.commit(9)
    cache.trim(12)  # O(1): the wrong keys are still in memory, but can no longer be seen
    rest = logits_of(model, ids[:, 12:], cache=cache)
    assert (rest - full[:, 12:]).abs().max() <= 1e-5
    assert cache.length == 12


def test_trim_and_extend_move_a_length_only(model_and_reference):
    model, _ = model_and_reference
    cache = model.new_cache(16)
    buffers = [k.data_ptr() for k in cache.keys]
    cache.commit(9)
    cache.trim(7)
    assert cache.length == 7 and [k.data_ptr() for k in cache.keys] == buffers
    with pytest.raises(ValueError):
        cache.trim(17)
    with pytest.raises(ValueError):
        cache.trim(8)  # past the 7 committed: it would commit slots never written
    with pytest.raises(ValueError):
        cache.commit(10)


@torch.no_grad()
def test_left_padding_with_key_mask_is_exact(model_and_reference):
    """Batched generation pads prompts on the left; the padding mask must hide it."""
    model, ref = model_and_reference
    short = ref["input_ids"][:1, :15]
    alone = logits_of(model, short)
    padded = torch.cat([torch.zeros(1, 8, dtype=torch.long), short], dim=1)  # (1, 23)
    real = torch.arange(23)[None, :] >= 8  # (1, 23): True for real tokens
    logits = logits_of(model, padded, key_padding=real)
    assert (logits[:, 8:] - alone).abs().max() <= 1e-4


def test_weights_load_in_the_requested_dtype():
    model = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded", dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert not any(p.is_meta for p in model.parameters())
    logits = logits_of(model, torch.tensor([[1, 2, 3]]))
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()


def test_save_and_reload_is_bit_identical(tmp_path):
    model = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny")
    model.save_pretrained(tmp_path)
    again = Qwen3.from_pretrained(tmp_path)
    for (name, ours), (_, theirs) in zip(model.named_parameters(), again.named_parameters()):
        assert torch.equal(ours, theirs), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
