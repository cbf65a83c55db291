"""ranks.py: with one process every collective is the identity; own_rows picks this rank's share. (Two real
processes: tests/test_ranks_ddp.py and tests/model/test_sharding.py check the gathered values.)"""

import lightning as L
import torch

from lightning_grpo.loss import LossOutput
from lightning_grpo.ranks import Ranks
from lightning_grpo.types import Rollout


def test_one_process_collectives_are_the_identity():
    ranks = Ranks(L.Trainer(accelerator="cpu", devices=1, logger=False))
    t = torch.arange(6.0).view(3, 2)
    assert ranks.world_size == 1 and ranks.gather_rows(t) is t and ranks.gather_padded(t) is t
    assert torch.equal(ranks.own_rows(t), t) and ranks.sum(torch.tensor(3.0)).item() == 3.0
    out = LossOutput(torch.tensor(1.5), {"kl": torch.tensor(2.0)}, torch.tensor(4.0))
    assert out.over_ranks(ranks) is out


def test_own_rows_is_this_ranks_slice_of_every_ranks_rows():
    ranks = Ranks(L.Trainer(accelerator="cpu", devices=1, logger=False))
    ranks.world_size, ranks.rank = 3, 1  # rank 1 of 3: rows 2..3 of 6
    assert ranks.own_rows(torch.arange(6)).tolist() == [2, 3]


def test_lengths_are_counted_up_to_eos_with_the_truncation_flags():
    ranks = Ranks(L.Trainer(accelerator="cpu", devices=1, logger=False))
    rollout = Rollout.from_token_lists(
        [[1], [1]], [[5, 6, 2], [5]], 0, [False, True], prompts=["a", "b"], completions=["x", "y"], group_size=2
    )
    lengths, truncated = ranks.lengths(rollout)
    assert lengths.tolist() == [3, 1] and truncated.tolist() == [False, True]
