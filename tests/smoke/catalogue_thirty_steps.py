"""The closing figures of the 2026 catalogue (docs/objectives.md): each new policy loss takes 30 GRPO steps on the
default task (arithmetic) with the micro policy of tests/smoke (a few SFT steps first, so groups differ in reward),
and reports whether any step was non-finite and the mean of its characteristic statistic. A script, not a test
(about a minute per loss on 2 cores):

    OMP_NUM_THREADS=1 .venv/bin/python tests/smoke/catalogue_thirty_steps.py [loss ...]
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_objectives_smoke import build_micro  # noqa: E402

from posttrain import resolve  # noqa: E402
from posttrain.trainers.online_rl import OnlineRL, PromptStream, RLRun  # noqa: E402
from helpers import REPO  # noqa: E402

STATISTIC = {  # loss: (rl updates, the metric that characterises it)
    "dual_clip": ({}, "dual_clip_fraction"), "dppo_tv": ({}, "clip_fraction"), "dppo_kl": ({}, "clip_fraction"),
    "dppo_reg": ({}, "clip_fraction"), "ipo": ({}, "clip_fraction"), "sapo": ({"loss_agg": "seq_mean"}, "sapo/gate_mean"),
    "gpg": ({}, "advantage_abs_mean"), "clip_cov": ({}, "clip_fraction"), "kl_cov": ({}, "kl_cov/penalised_fraction"),
    "geo_mean": ({"clip_eps_low": 0.4, "clip_eps_high": 0.4, "loss_agg": "seq_mean"}, "clip_fraction"),
    "dro": ({}, "dro/sq_log_ratio"), "cross_entropy": ({}, "nll"), "importance_sampling": ({}, "ratio_mean"),
    "vespo": ({}, "vespo/phi_mean"), "topr": ({}, "topr/positive_fraction"),
}


def main(names: list[str]) -> None:
    root = Path(tempfile.mkdtemp())
    micro = build_micro(root, "arithmetic")
    cfg, task, examples, tokenizer, state, model = micro
    out = {}
    for name in names or list(STATISTIC):
        updates, stat = STATISTIC[name]
        model.load_state_dict(state)
        # epochs_per_batch 2: the second pass is off-policy, so ratios, gates and masks move away from their on-policy values
        rl = resolve.updated(cfg.rl, "rl", advantage="grpo", loss=name, steps=30, prompts_per_step=4, group_size=4, epochs_per_batch=2, **updates)
        run = RLRun(model, tokenizer, task, examples, rl, seed=0, checkpoint_dir=REPO / "unused", config_hash="x", models={})
        trainer, stream = OnlineRL(run, total_steps=30), PromptStream(examples, 0)
        history = [trainer.step(stream.take(rl.prompts_per_step), more_prompts=stream.take).metrics for _ in range(30)]
        finite = all(math.isfinite(v) for m in history for v in m.values())
        values = [m[stat] for m in history]
        out[name] = {"steps": len(history), "all_finite": finite, "nonfinite_steps": history[-1]["nonfinite_steps"], "statistic": stat,
                     "mean": sum(values) / len(values), "first": values[0], "last": values[-1],
                     "accuracy_first": history[0].get("accuracy"), "accuracy_last": history[-1].get("accuracy")}
        print(json.dumps({name: out[name]}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
