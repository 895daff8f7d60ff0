"""DRO policy loss as verl ships it (core_algos.compute_policy_loss_dro, "Direct Reward Optimization with a
quadratic log-ratio penalty"; the regularised objective of Richemond et al. 2024, "Offline Regularised
Reinforcement Learning for Large Language Models Alignment", arXiv 2405.19107, in its on-policy gradient form):

    obj_t = A_t logp_theta(y_t) - (beta / 2) (logp_theta(y_t) - logp_old(y_t))^2,        loss = - AGG_t obj_t

The gradient is (A_t - beta log rho_t) grad logp: policy gradient pulled back towards the old policy. The formula
is verl's code; the paper's offline squared-residual loss with a learned value is not what is implemented here.
Settings: rl.options.dro (beta > 0; verl has no default). Metrics: `dro/sq_log_ratio` (mean (log rho)^2) and
`clip_fraction` (0: nothing is clipped).
"""

from __future__ import annotations

from pydantic import Field
from torch import Tensor

from posttrain.objectives.loss_settings import LossSettings
from posttrain.config import Section
from posttrain.objectives import losses
from posttrain.objectives.aggregation import aggregate
from posttrain.objectives.policy_losses import per_token
from posttrain.objectives.token_stats import masked_mean


class DROOptions(Section):
    beta: float = Field(0.1, gt=0)  # weight of the quadratic log-ratio penalty


@losses.register("dro", needs=(), options=DROOptions)
def dro(logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, cfg: LossSettings) -> tuple[Tensor, dict[str, float]]:
    beta = cfg.options_for("dro").beta
    log_ratio = logp - old_logp
    objective = logp * per_token(advantages, logp) - 0.5 * beta * log_ratio**2
    return -aggregate(cfg, objective, mask), {"dro/sq_log_ratio": masked_mean(log_ratio**2, mask), "clip_fraction": 0.0}
