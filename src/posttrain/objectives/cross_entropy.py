"""Cross-entropy (SkyRL's `cross_entropy` policy loss, Tinker's `cross_entropy`): the negative log-likelihood of the
sampled tokens, advantages and old log-probs ignored (supervised fine-tuning through the RL loop, e.g. on
filtered or teacher rollouts):

    loss = - AGG_t logp_theta(y_t)

SkyRL sums over tokens; with `token_mean` this is that sum divided by the number of valid tokens. Metrics: `nll`
(mean over valid tokens) and `clip_fraction` (0).
"""

from __future__ import annotations

from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.token_stats import masked_mean


@losses.register("cross_entropy", needs=())
def cross_entropy(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    return -aggregate(cfg, logp, mask), {"nll": -masked_mean(logp, mask), "clip_fraction": 0.0}
