import math

import torch

from lightning_grpo.metrics import reward_stats


def test_a_function_that_scored_nothing_logs_nan_not_zero():  # as TRL does; 0.0 would read as "always wrong"
    per_function = torch.tensor([[1.0, math.nan], [0.0, math.nan], [1.0, math.nan], [1.0, math.nan]])  # [N=4, F=2]
    out = reward_stats(per_function, torch.ones(2), ["exact", "never"], group_size=2).metrics()
    assert math.isnan(out["rewards/never/mean"]) and math.isnan(out["rewards/never/std"])
    assert out["rewards/exact/mean"] == 0.75 and out["reward"] == 0.75
