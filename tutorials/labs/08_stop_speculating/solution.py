"""Lab 08_stop_speculating, the reference answer (notebook 8, section 5): speculation under
batching.

A batch shares the weights: they are read once per pass whatever the batch. Each sequence brings its
own KV cache and embedding rows to read and its own FLOPs. So the bytes grow slowly with the batch
and the FLOPs in proportion to it: at batch b a pass of k tokens per sequence does about b * k FLOPs
per weight byte, and a 16-token verify leaves the flat region when b * 16 nears the ridge (about 206
on the H200; the sequences' own KV reads push it to batch 17). Past it, every extra draft slot costs
its arithmetic, and the best block shrinks towards a few tokens."""


def batched_pass_ms(cost, gpu, batch: int, tokens: int) -> float:
    weights = 2 * (cost.matmul_weights + cost.other_weights)  # bytes read once for the whole batch
    own = cost.bytes_read(tokens) - weights  # one sequence's KV cache and embedding rows
    return 1e3 * max(
        (weights + batch * own) / gpu.bandwidth, batch * cost.flops(tokens) / gpu.flops
    )


def free_until(cost, gpu, block: int, limit: float = 1.10) -> int:
    def ratio(batch):
        return batched_pass_ms(cost, gpu, batch, block) / batched_pass_ms(cost, gpu, batch, 1)

    return max(batch for batch in range(1, 4097) if ratio(batch) <= limit)


def best_block_at(costs, gpu, batch: int, alpha: float) -> int:
    def speedup(block):
        tau = sum(alpha**k for k in range(block))
        step = batched_pass_ms(costs.drafter, gpu, batch, 2 * block) + batched_pass_ms(
            costs.target, gpu, batch, block
        )
        return tau / (step / batched_pass_ms(costs.target, gpu, batch, 1))

    best = max(range(2, 65), key=speedup)
    return best if speedup(best) > 1 else 1
