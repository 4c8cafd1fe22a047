"""Notebook 8, exercise 2: the best block size on a GPU, from the roofline model of section 5.

The model (not a measurement): a pass takes the longer of bytes read / memory bandwidth and
FLOPs / peak FLOP rate; Qwen3-8B in bfloat16, its DFlash drafter of 5 layers of the target's
width with the target's LM head. The speedup at block B is tau(B) over the step's cost in
decode passes. Section 4's rule says one more slot pays while p_B / tau(B) > dt / t_step(B).
On the GPU, below the FLOP-per-byte ridge, one more token in a pass costs only its bytes (an
embedding row, its keys and values): dt / t_step is about 1e-5, so a slot pays until the
chance of keeping it, alpha^B, has fallen that low. The best block is set by the drafter's
accuracy alone, and it is far larger than on the CPU, where every slot costs a few per cent of
a step. (Real kernels are not this flat, and the gain past block 16 is small at alpha 0.8.)

Run from tutorials/: python solutions/08_best_gpu_block.py
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path.cwd().parent))  # the repository root: dflash/

import torch

from dflash.drafter import Drafter, DrafterConfig, default_target_layer_ids
from dflash.qwen3 import Qwen3, Qwen3Config

GPUS = {"H100 SXM": dict(bandwidth=3.35e12, flops=989e12), "H200": dict(bandwidth=4.8e12, flops=989e12)}
CONTEXT = 1024
big = Qwen3Config()  # Qwen3-8B
with torch.device("meta"):
    big_target = Qwen3(big)
    big_drafter = Drafter(DrafterConfig(Qwen3Config(num_hidden_layers=5), block_size=16, num_target_layers=36,
                                        mask_token_id=big.vocab_size, target_layer_ids=default_target_layer_ids(36, 5)))


def matmul_weights(module) -> int:
    return sum(m.weight.numel() for m in module.modules() if isinstance(m, torch.nn.Linear))


MODELS = {"target": (matmul_weights(big_target), 36),
          "DFlash drafter": (matmul_weights(big_drafter) + big_target.lm_head.weight.numel(), 5)}


def gpu_pass_ms(gpu: str, model: str, tokens: int, context: int = CONTEXT) -> float:
    weights, kv_layers = MODELS[model]
    kv_per_token = 2 * kv_layers * big.num_key_value_heads * big.head_dim
    bytes_read = 2 * (weights + kv_per_token * (context + tokens))
    keys_seen = tokens * context + tokens * (tokens + 1) / 2
    flops = 2 * weights * tokens + 4 * kv_layers * big.num_attention_heads * big.head_dim * keys_seen
    return 1e3 * max(bytes_read / GPUS[gpu]["bandwidth"], flops / GPUS[gpu]["flops"])


def step_cost(gpu: str, block: int) -> float:
    """A DFlash step (draft over a block and up to a block of context, verify of the block) in decode passes."""
    return (gpu_pass_ms(gpu, "DFlash drafter", 2 * block) + gpu_pass_ms(gpu, "target", block)) / \
        gpu_pass_ms(gpu, "target", 1)


def tau_constant(alpha: float, block: int) -> float:
    return float(block) if alpha == 1 else (1 - alpha ** block) / (1 - alpha)


def gpu_speedup(gpu: str, alpha: float, block: int) -> float:
    return tau_constant(alpha, block) / step_cost(gpu, block)


def best_gpu_block(gpu: str, alpha: float) -> int:
    """The block size in 2..512 with the highest modelled speedup: a search, the model is cheap."""
    return max(range(2, 513), key=lambda block: gpu_speedup(gpu, alpha, block))


if __name__ == "__main__":
    for gpu in GPUS:
        for alpha in (0.8, 0.9):
            best = best_gpu_block(gpu, alpha)
            value = gpu_speedup(gpu, alpha, best)
            # the notebook's checks: a maximum among its neighbours and the powers of two
            assert value >= gpu_speedup(gpu, alpha, max(best - 1, 2)) and value >= gpu_speedup(gpu, alpha, best + 1)
            assert all(value >= gpu_speedup(gpu, alpha, 2 ** i) for i in range(1, 10))
            assert best > 16, "on the GPU the best block lies far past the drafter's 16"
            gain = alpha ** best / tau_constant(alpha, best)  # p_B / tau(B): the next slot's relative gain
            cost = step_cost(gpu, best + 1) / step_cost(gpu, best) - 1  # dt / t_step: its relative cost
            print(f"{gpu}, alpha {alpha}: best block {best}, {value:.2f}x (block 16: "
                  f"{gpu_speedup(gpu, alpha, 16):.2f}x); there the next slot gains {gain:.1e} of tau for "
                  f"{cost:.1e} more step time")
