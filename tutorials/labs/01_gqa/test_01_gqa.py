"""Grades lab 01_gqa: against the project's attention (SDPA with enable_gqa under the causal mask)
at three groupings, with every call that copies or expands keys and values switched off while
the student's runs, and every tensor the student's function makes looked at: one that holds the
keys or values again for each group (an index that repeats heads, a broadcast against ones or
zeros, an in-place copy) is a copy, however it was made. Last, queries large enough that a
softmax without its maximum subtracted overflows."""

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import dflash.qwen3
from _lab_helpers import drawn_generator, forbidden
from dflash.qwen3 import causal_mask, masked

NO_COPIES = {
    torch: ["repeat_interleave", "cat", "concat", "concatenate", "stack", "tile", "broadcast_to", "index_select"],
    torch.Tensor: ["repeat_interleave", "repeat", "tile", "expand", "expand_as", "index_select", "clone"],
    F: ["scaled_dot_product_attention"],
    dflash.qwen3: ["masked"],
}
RULE = "01_gqa: the lab asks for attention without copying the keys and values (let broadcasting do it)"


def drawn_shapes(generator: torch.Generator) -> list[tuple[int, ...]]:
    """(batch, heads, kv_heads, seq, head_dim) at three groupings, sizes drawn at run time."""

    def draw(low: int, high: int) -> int:
        return int(torch.randint(low, high + 1, (1,), generator=generator))

    return (
        [(draw(1, 3), 2 * kv, kv, draw(2, 9), 32) for kv in (draw(1, 4),)]
        + [(1, 4 * kv, kv, draw(2, 9), 128) for kv in (draw(2, 8),)]
        + [(1, draw(2, 6), 1, draw(2, 9), 16)]
    )


def tensors_in(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [tensor for item in value for tensor in tensors_in(item)]
    return []


class CopiesWatched(TorchFunctionMode):
    """While it is on, every tensor a torch call returns or writes into is compared with the keys
    and the values: one that holds nearly every number of K (or V) twice or more is a copy per
    group. `found` names the first ("keys" or "values"), None if none."""

    def __init__(self, k: torch.Tensor, v: torch.Tensor):
        super().__init__()
        self.sources = {"keys": k.detach().flatten().sort().values,
                        "values": v.detach().flatten().sort().values}
        self.found = None

    def repeated(self, tensor: torch.Tensor, source: torch.Tensor) -> bool:
        if tensor.dtype != source.dtype or tensor.numel() < 2 * source.numel():
            return False
        numbers = tensor.detach().flatten()
        at = torch.searchsorted(source, numbers).clamp(max=source.numel() - 1)
        equal = source[at] == numbers
        # (K's numbers,): how often the tensor holds each
        times = torch.bincount(at[equal], minlength=source.numel())
        return bool((times >= 2).float().mean() >= 0.9)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if self.found is None:
            # the arguments too: what an in-place call wrote into
            for tensor in tensors_in(result) + tensors_in(args):
                self.found = next((name for name, source in self.sources.items()
                                   if self.repeated(tensor, source)), None)
                if self.found:
                    break
        return result


def test_gqa(lab):
    generator = drawn_generator()
    for batch, heads, kv_heads, seq, d in drawn_shapes(generator):
        q = torch.randn(batch, heads, seq, d, generator=generator)  # (batch, heads, seq, head_dim)
        # (batch, kv_heads, seq, d)
        k, v = torch.randn(2, batch, kv_heads, seq, d, generator=generator).unbind(0)
        expected = masked(causal_mask(torch.arange(seq), num_keys=seq))(q, k, v)  # (batch, heads, seq, head_dim)
        watch = CopiesWatched(k, v)
        with forbidden(lab, RULE, NO_COPIES), watch:
            mine = lab.my_grouped_attention(q, k, v)
        assert watch.found is None, (
            f"{RULE}: your function made a tensor that holds the {watch.found} once per query "
            "group")
        assert mine.shape == expected.shape, (
            f"01_gqa: shape {tuple(mine.shape)} for q of shape {tuple(q.shape)}: (batch, heads, "
            "seq, head_dim)"
        )
        assert torch.allclose(mine, expected, atol=1e-5), \
            f"01_gqa: differs from masked causal attention for {heads} query heads on {kv_heads} key/value heads"

    # queries large enough that exp() of a score overflows float32: a softmax must subtract its max
    batch, heads, kv_heads, seq, d = drawn_shapes(generator)[0]
    q = 60 * torch.randn(batch, heads, seq, d, generator=generator)
    k, v = torch.randn(2, batch, kv_heads, seq, d, generator=generator).unbind(0)
    expected = masked(causal_mask(torch.arange(seq), num_keys=seq))(q, k, v)
    with forbidden(lab, RULE, NO_COPIES):
        mine = lab.my_grouped_attention(q, k, v)
    assert torch.allclose(mine, expected, atol=1e-4), (
        "01_gqa: differs from masked causal attention when the scores are large (hundreds): "
        "does your softmax overflow?")
