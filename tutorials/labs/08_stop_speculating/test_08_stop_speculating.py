"""Grades lab 08_stop_speculating by the roofline's properties, on batches, blocks and acceptances
drawn at run time: at batch 1 a batched pass is notebook 8's single pass; with unlimited FLOP/s its
time grows by the same step for every sequence added, and a batch of none would read the weights
alone; with unlimited bandwidth each sequence adds its own FLOPs. free_until is checked at its edge,
best_block_at by the property of a maximum, both under the student's (checked) batched_pass_ms."""

import dataclasses
import math

import teaching  # notebook 8's own batched roofline: what the student rebuilds
from _lab_helpers import drawn_random, forbidden, qwen3_8b_pass_costs

RULE = "08_stop_speculating: the lab asks you to write the batched roofline yourself"


def test_stop_speculating(lab):
    rng, costs = drawn_random(), qwen3_8b_pass_costs()
    with forbidden(lab, RULE, {teaching: ["batched_pass_ms"]}):
        # refused if the module holds or names it
        lab.batched_pass_ms(costs.target, costs.H200, 2, 16)
    for gpu in (costs.H100, costs.H200):
        memory = dataclasses.replace(gpu, flops=math.inf)  # reading alone
        compute = dataclasses.replace(gpu, bandwidth=math.inf)  # computing alone
        for name, cost in (("target", costs.target), ("drafter", costs.drafter)):
            tokens = rng.randrange(1, 64)
            assert math.isclose(
                lab.batched_pass_ms(cost, gpu, 1, tokens), cost.ms(gpu, tokens), rel_tol=1e-9
            ), (
                f"08_stop_speculating: at batch 1 the {name}'s pass over {tokens} tokens is "
                "notebook 8's single pass"
            )
            times = [lab.batched_pass_ms(cost, memory, batch, tokens) for batch in (1, 2, 3)]
            assert math.isclose(times[2] - times[1], times[1] - times[0], rel_tol=1e-9), (
                "08_stop_speculating: reading, every sequence added to a batch should add the "
                f"same bytes ({name})"
            )
            alone = 2 * times[0] - times[1]  # a batch of no sequences, extrapolated
            assert math.isclose(
                alone * 1e-3 * gpu.bandwidth,
                2 * (cost.matmul_weights + cost.other_weights),
                rel_tol=1e-9,
            ), f"08_stop_speculating: what does a batch share? ({name}: reading, batch by batch)"
            batch = rng.randrange(2, 300)
            assert math.isclose(
                lab.batched_pass_ms(cost, compute, batch, tokens),
                batch * lab.batched_pass_ms(cost, compute, 1, tokens),
                rel_tol=1e-9,
            ), (
                f"08_stop_speculating: computing, a batch of {batch} does {batch} sequences' FLOPs "
                f"({name})"
            )

        block, limit = rng.choice((8, 16)), round(rng.uniform(1.05, 1.3), 2)

        def ratio(batch):
            return lab.batched_pass_ms(costs.target, gpu, batch, block) / lab.batched_pass_ms(
                costs.target, gpu, batch, 1
            )

        found = lab.free_until(costs.target, gpu, block, limit)
        assert isinstance(found, int) and 1 <= found <= 4096, (
            f"08_stop_speculating: {found} is not a batch in 1..4096"
        )
        assert ratio(found) <= limit, (
            f"08_stop_speculating: at batch {found} a verify of {block} costs more than {limit} "
            "decode passes"
        )
        assert found == 4096 or ratio(found + 1) > limit, (
            f"08_stop_speculating: batch {found + 1} still verifies {block} tokens within {limit} "
            "decodes"
        )

        def speedup(batch, alpha, block):
            tau = sum(alpha**k for k in range(block))
            step = lab.batched_pass_ms(costs.drafter, gpu, batch, 2 * block) + lab.batched_pass_ms(
                costs.target, gpu, batch, block
            )
            return tau / (step / lab.batched_pass_ms(costs.target, gpu, batch, 1))

        cases = [(batch, round(rng.uniform(0.6, 0.92), 3)) for batch in (1, rng.randrange(8, 40),
                                                                          rng.randrange(100, 400))]
        # and where speculation loses
        cases.append((rng.randrange(1500, 4000), round(rng.uniform(0.02, 0.1), 3)))
        for batch, alpha in cases:
            best = lab.best_block_at(costs, gpu, batch, alpha)
            assert isinstance(best, int) and (best == 1 or 2 <= best <= 64), (
                f"08_stop_speculating: {best} is neither a block in 2..64 nor 1")
            value = speedup(batch, alpha, best) if best > 1 else 1.0
            assert value >= 1, (
                f"08_stop_speculating: {gpu.name}, batch {batch}, alpha {alpha}: block {best} "
                "models a speedup under 1, where the plain loop is faster")
            rivals = [
                b for b in [best - 1, best + 1] + rng.sample(range(2, 65), 30) if 2 <= b <= 64
            ]
            better = [b for b in rivals if speedup(batch, alpha, b) > value]
            assert not better, (
                f"08_stop_speculating: {gpu.name}, batch {batch}, alpha {alpha}: block {best} is "
                "not "
                f"the best: block {better[0]} models a higher speedup"
            )
