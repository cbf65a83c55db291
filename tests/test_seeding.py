"""A step's seed differs by rank, step and the batches a filter waited; a seeded block repeats its draws and leaves
the global RNG where it was."""

import torch

from lightning_grpo.seeding import seeded, step_seed


def test_every_rank_step_and_wait_has_its_own_seed():
    seeds = {step_seed(0, rank, step, waited) for rank in range(4) for step in range(50) for waited in range(3)}
    assert len(seeds) == 4 * 50 * 3
    assert step_seed(7, 1, 3) == step_seed(7, 1, 3) != step_seed(8, 1, 3)


def test_a_seeded_block_repeats_its_draws_and_leaves_the_global_rng_as_it_was():
    torch.manual_seed(123)
    expected_next = torch.rand(3)
    torch.manual_seed(123)
    with seeded(5, torch.device("cpu")):
        first = torch.rand(4)
    with seeded(5, torch.device("cpu")):
        second = torch.rand(4)
    assert torch.equal(first, second)
    assert torch.equal(torch.rand(3), expected_next)  # the draws inside did not advance the global generator
