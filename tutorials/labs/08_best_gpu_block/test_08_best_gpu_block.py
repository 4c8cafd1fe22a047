"""Grades lab 08_best_gpu_block by the property of a maximum, on both GPUs at acceptances drawn at
run time: the block found beats its neighbours and every one of 64 blocks drawn from 2..512, and the
search used at most 24 evaluations of the model (the lab forbids trying every block)."""

from _lab_helpers import drawn_random, gpu_speedup_model

CALLS = 24


def test_best_gpu_block(lab):
    rng, model = drawn_random(), gpu_speedup_model()
    for gpu in ("H100 SXM", "H200"):
        for alpha in (round(rng.uniform(0.65, 0.8), 3), round(rng.uniform(0.8, 0.95), 3)):
            calls = []

            def gpu_speedup(gpu_name, alpha_, block):
                calls.append(block)
                return model(gpu_name, alpha_, block)

            found = lab.best_gpu_block(gpu_speedup, gpu, alpha)
            assert len(calls) <= CALLS, (
                f"08_best_gpu_block: {len(calls)} calls of gpu_speedup for {gpu}, alpha {alpha}: "
                f"at most {CALLS}"
            )
            assert isinstance(found, int) and 2 <= found <= 512, (
                f"08_best_gpu_block: {found} is not a block in 2..512"
            )
            value = model(gpu, alpha, found)
            rivals = [
                block
                for block in [found - 1, found + 1] + rng.sample(range(2, 513), 64)
                if 2 <= block <= 512
            ]
            better = [block for block in rivals if model(gpu, alpha, block) > value]
            assert not better, (
                f"08_best_gpu_block: {gpu}, alpha {alpha}: block {found} is not the best: block "
                f"{better[0]} gives a higher modelled speedup"
            )
