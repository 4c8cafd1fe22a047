"""How the fixtures' reference outputs were computed, where that differs from loading the checkpoint."""

import torch


def as_the_reference_was_made(model):
    """Round the RoPE frequencies of a model loaded from a bf16 fixture, as its reference model did.

    The bf16 fixtures' references were computed by models cast to bf16 in memory
    (which rounds their RoPE frequency buffer) before being saved and upcast to
    float32: see `tests/fixtures/qwen3-tiny-sharded/REFERENCE.md`. Loading the
    checkpoint, the official code keeps float32 frequencies, and so does ours
    (`test_loading_keeps_float32_rope_frequencies_as_the_official_loader`).
    """
    config = getattr(model.config, "layers", model.config)  # a drafter's Qwen3 part, or the target's config
    if config.dtype == "bfloat16":
        model.rotary.inv_freq = model.rotary.inv_freq.to(torch.bfloat16).float()  # as `.to(bfloat16)` rounds it
    return model


def logits_of(model, input_ids, **options):
    """Next-token logits at every position (batch, seq, vocab): the hidden states through the LM head."""
    hidden, _ = model(input_ids, **options)
    return model.logits(hidden)
