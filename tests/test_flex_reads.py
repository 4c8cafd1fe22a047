"""FlexAttention over the static caches (`FilledBlocks`, `ModelRunner(flex_attention=True)`), checked on the CPU.

The point of it is on a GPU: a compiled fixed-shape pass visits only the key blocks
of the cache that are filled. Here the passes are compiled with dynamo's eager
backend, so FlexAttention is traced and then run by its reference implementation,
which is exact but scores every key: the tests show that the outputs are those of
the masked attention, and that the block mask lists exactly the filled key blocks.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dflash.drafter import Drafter
from dflash.flex_reads import FilledBlocks
from dflash.qwen3 import Qwen3, causal_mask, tree_mask_over_cache
from generate import ModelRunner, generate_autoregressive, generate_dflash, generate_dflash_tree
from tests.test_generate import prompt_of

ROOT = Path(__file__).resolve().parents[1]
# The reference FlexAttention warns that it is not compiled: on the CPU that is the point here.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
FIXTURES = ROOT / "tests" / "fixtures"


def masked_attention(mask, q, k, v):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def random_qkv(seq, keys, batch=1, seed=0):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, 4, seq, 16, generator=generator)
    k, v = (torch.randn(batch, 2, keys, 16, generator=generator) for _ in range(2))
    return q, k, v


TREE = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)  # ancestors


@pytest.mark.parametrize("case", ["decode", "verify", "tree", "drafter", "padded batch"])
def test_filled_blocks_equal_masked_attention_and_list_only_filled_blocks(case):
    keys, position = 700, 300  # a 700-slot buffer filled up to about 300: 6 key blocks of 128, 3 filled
    if case == "decode":
        mask = causal_mask(torch.tensor([position]), keys)
    elif case == "verify":
        mask = causal_mask(torch.arange(position, position + 16), keys)
    elif case == "tree":
        mask = tree_mask_over_cache(torch.arange(position, position + 4), TREE, keys)
    elif case == "drafter":
        mask = (torch.arange(keys) <= position + 15)[None, :]  # (1, keys), as Drafter.forward builds it
    else:
        padding = torch.ones(2, keys, dtype=torch.bool)
        padding[1, :5] = False  # the second prompt is left-padded
        mask = causal_mask(torch.arange(position, position + 3), keys, padding)
    seq = {"decode": 1, "tree": 4, "padded batch": 3}.get(case, 16)
    q, k, v = random_qkv(seq, keys, batch=2 if case == "padded batch" else 1)
    pattern = FilledBlocks(mask)
    torch.testing.assert_close(pattern.attend(q, k, v), masked_attention(mask, q, k, v), atol=1e-5, rtol=1e-5)
    last_visible = (position + 15) if case in ("verify", "drafter") else position + seq - 1
    block_mask = pattern.block_mask(q.shape[0], seq, keys)
    assert block_mask.kv_num_blocks.flatten().tolist() == [last_visible // 128 + 1] * q.shape[0]


@pytest.fixture(scope="module", params=["fixtures", "demo"])
def pair(request):
    """The reference fixtures' pair (random weights), and the demo pair (a trained drafter: long accepted runs)."""
    if request.param == "fixtures":
        target = Qwen3.from_pretrained(FIXTURES / "qwen3-tiny-sharded")
        return target, Drafter.from_pretrained(FIXTURES / "dflash-tiny", target=target)
    target = Qwen3.from_pretrained(ROOT / "weights" / "tiny-qwen3")
    return target, Drafter.from_pretrained(ROOT / "weights" / "tiny-qwen3-dflash", target=target)


class RecordingBackend:
    """A torch.compile backend that runs each graph as traced (eagerly) and keeps its code, to look into."""

    def __init__(self):
        self.graphs = []

    def __call__(self, graph_module, example_inputs):
        self.graphs.append(graph_module.code)
        return graph_module.forward

    def flex_graphs(self) -> int:
        return sum("flex_attention" in code for code in self.graphs)


def compiled_runner(target, drafter, prompt, new_tokens, backend, **options):
    """Compiled passes over a buffer with room for several key blocks, reading through FilledBlocks."""
    torch._dynamo.reset()
    return ModelRunner(target, drafter, max_length=len(prompt) + new_tokens + 400, compile=True, backend=backend,
                       flex_attention=True, **options)


@pytest.mark.parametrize("length", [1, 40])
def test_greedy_dflash_with_flex_reads_equals_the_plain_loop(pair, length):
    target, drafter = pair
    prompt = prompt_of(length, target.config.vocab_size)
    plain = generate_autoregressive(target, prompt, 24).new_ids
    backend = RecordingBackend()
    runner = compiled_runner(target, drafter, prompt, 24, backend, block_size=drafter.config.block_size)
    assert generate_dflash(target, drafter, prompt, 24, runner=runner).new_ids == plain
    assert generate_autoregressive(target, prompt, 24, runner=runner).new_ids == plain
    # decode, verify, draft, each through flex; once per bucket of slots read (`keys_bucket`: 64, then 128)
    assert backend.flex_graphs() == len(backend.graphs) in (3, 6)


def test_tree_with_flex_reads_equals_the_plain_loop(pair):
    target, drafter = pair
    prompt = prompt_of(17, target.config.vocab_size)
    plain = generate_autoregressive(target, prompt, 24).new_ids
    backend = RecordingBackend()
    runner = compiled_runner(target, drafter, prompt, 24, backend, block_size=drafter.config.block_size,
                             tree_budget=8)
    assert generate_dflash_tree(target, drafter, prompt, 24, budget=8, runner=runner).new_ids == plain
    assert backend.flex_graphs() == len(backend.graphs) >= 2  # the tree's verify and draft
