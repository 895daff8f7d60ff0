"""Claim (DSP, specs §20): in a seeded maze with reward-free exploration data, subgoals from a goal-conditioned flow
with classifier-free guidance, reached by a low-level goal-conditioned policy and replanned every k moves, reach more
held-out goals than flat goal-conditioned behaviour cloning and than value-guided subgoal selection (HIQL-style);
guidance above 1 beats the plain conditional flow (omega 1), which beats the unconditional one (omega 0).

Per seed (its own maze layout: dsp.maze.layout + seed, its own data and held-out pairs), the networks are trained
once (recipes/dsp/trainer.py `train_dsp`, the dsp stage's loop: subgoal flow with goal dropout, low-level policy, flat BC,
expectile value, all on the same batches) and every arm runs greedily on the same held-out start/goal pairs:

    flat_bc        pi_flat(a | s, g)
    value_guided   the best V(w, g) of dsp.candidates unconditional subgoal proposals, reached by pi_lo
    dsp_w<omega>   the CFG subgoal at each omega of dsp.guidance_weights (the sweep; 2 must be one), reached by pi_lo

    .venv/bin/python experiments/dsp_vs_baselines.py [--steps UPDATES] [--seeds 3] [--json FILE] [--tracking-uri URI] [--micro]
"""

from __future__ import annotations

import time

import _common as C
from posttrain.recipes.dsp.trainer import load_data, train_dsp

MICRO = ["dsp.maze.cells=3", "dsp.data.trajectories=30", "dsp.data.length=20", "dsp.eval.pairs=4", "dsp.eval.min_distance=3",
         "dsp.eval.max_steps=10", "dsp.hidden_size=16", "dsp.layers=1", "dsp.batch_size=32", "dsp.candidates=2", "dsp.sampling_steps=2",
         "dsp.log_every=1"]


def main() -> None:
    args = C.parse_args(__doc__.split("\n")[0], 3000)
    t0 = time.time()
    cfg = C.load_config(args, (MICRO if args.micro else []) + [f"dsp.steps={args.steps}", "dsp.checkpoint_every=0"])
    if 2.0 not in cfg.dsp.guidance_weights:
        raise SystemExit("dsp.guidance_weights must include 2 (the claimed DSP arm)")
    data = load_data(cfg.dsp, args.seed)
    _, history, figures, table, _ = train_dsp(cfg.dsp, data, args.seed)
    text = C.print_table(f"\nDSP vs baselines in maze {cfg.dsp.maze.layout + args.seed} ({len(data.maze.free_cells())} free squares), "
                         f"{args.steps} updates, {cfg.dsp.eval.pairs} held-out pairs >= {cfg.dsp.eval.min_distance} moves apart "
                         f"(seed {args.seed})", table)
    runs = {"all": C.log_arm(cfg, "dsp_vs_baselines/all", history, figures, table, text)} if cfg.tracking.enabled else {}
    C.write_json(args, {"claim": "dsp_vs_baselines", "steps": args.steps, "figures": figures, "table": table,
                        "flow_loss_curve": C.curve(history, "flow_loss"), "low_loss_curve": C.curve(history, "low_loss"),
                        "mlflow_runs": runs, "runtime_s": round(time.time() - t0, 1)})


if __name__ == "__main__":
    C.run_seeds(main, "dsp_vs_baselines")
