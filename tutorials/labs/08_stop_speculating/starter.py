"""Lab 08_stop_speculating (notebook 8, section 5): when does speculation stop paying? A verify pass
of 16 tokens costs about one decode pass at batch 1 on a GPU; serving many sequences at once, it
does not.

Write the three functions below, then grade them: python -m pytest tutorials/labs -k
stop_speculating"""


def batched_pass_ms(cost, gpu, batch: int, tokens: int) -> float:
    """The roofline time, in ms, of one pass over `tokens` new tokens for each of `batch` sequences
    at once.

    `cost` is a teaching.PassCost (notebook 8, section 5: cost.bytes_read(tokens),
    cost.flops(tokens), cost.ms(gpu, tokens) for one sequence; its fields matmul_weights,
    other_weights, ...), `gpu` a teaching.Accelerator (bandwidth, flops). What does a batch share,
    and what does each sequence bring?"""
    raise NotImplementedError


def free_until(cost, gpu, block: int, limit: float = 1.10) -> int:
    """The largest batch in 1..4096 at which a verify pass of `block` tokens per sequence costs at
    most `limit` times a decode pass (one token per sequence) of the same batch: where checking a
    block stops being nearly free."""
    raise NotImplementedError


def best_block_at(costs, gpu, batch: int, alpha: float) -> int:
    """The block size in 2..64 with the highest modelled speedup at `batch` sequences: tau(alpha,
    B), the expected tokens per step at constant per-slot acceptance alpha, over a step's cost in
    decode passes of the batch (a draft pass of costs.drafter over 2 * B tokens per sequence, as
    notebook 8 counts it, then a verify pass of costs.target over B tokens per sequence). Below 1,
    speculation loses: return 1."""
    raise NotImplementedError
