"""Stage `bridge`: BRIDGE (specs §13, docs/search.md) on the search task, or one of its comparison arms (`bridge.arm`).

Needs `task.name: search` (the corpus, top-k and the candidates N: task.options.search) and no input: a tiny
char-level policy (`model`, from scratch: model.path must be null) is warm-started on the task's reference
transcripts (written with task.options.search.retriever; `bridge.sft_steps`, the loss on its own tokens), the learned
retriever `bridge.retriever` (a `dual_encoder`) weakly pre-trained (`bridge.retriever_warmup_steps`), then
`bridge.iterations` iterations of recipes/search/bridge_trainer.py's loop with it, every optimiser step through TrainLoop's guard
and checkpoints every `bridge.checkpoint_every` iterations (`--resume` continues from the newest and skips the warm
start). Every arm but `frozen` trains the retriever, so it needs one with parameters.

Writes `model/` (the policy and its tokenizer), `retriever/` (retriever.json; the dual encoder's weights),
`history.json` (one row per iteration), `episodes.jsonl` (held-out greedy episodes: question, queries, retrieved
passages, answer, gold; the first `bridge.example_episodes` also an MLflow table); metrics: held-out greedy EM, F1
and gold-passage recall (`heldout_*`, also before training: `heldout_*_before`), `order_ok` (every iteration stepped
in its arm's order), `train_reward_last`.
"""

from __future__ import annotations

import json
from pathlib import Path

from posttrain.config import Config
from posttrain.errors import UserError
from posttrain.runtime import strict_json
from posttrain.stages import stages
from posttrain.recipes.search.asct_stages import search_task


def learned_retriever(cfg: Config, task):
    """`bridge.retriever` over the task's corpus (a `path` one from task.options.search.retriever_path); every arm
    but `frozen` needs one with parameters."""
    from posttrain.envs.retrievers import build_retriever

    if cfg.model.path is not None:
        raise UserError(f"stage bridge trains a tiny char-level policy from scratch: set model.path=null (got {cfg.model.path!r})")
    name = cfg.bridge.retriever
    if name == "path" and not task.opts.retriever_path:
        raise UserError("bridge.retriever path needs task.options.search.retriever_path (a checkpoint directory)")
    options = {"path": task.opts.retriever_path} if name == "path" else {"seed": cfg.pipeline.seed} if name == "dual_encoder" else {}
    retriever = build_retriever(name, task.corpus.passages, **options)  # a dual encoder initialised from the pipeline seed
    if cfg.bridge.arm != "frozen" and not retriever.trainable:
        raise UserError(f"bridge.arm {cfg.bridge.arm} trains the retriever, and bridge.retriever {name} has no parameters: "
                        "set bridge.retriever=dual_encoder (or bridge.arm=frozen)")
    return retriever


@stages.register("bridge", sections=("bridge",), inputs={}, resumable=True, gpu=False)
def run(cfg: Config, inputs: dict[str, Path], out_dir: Path, tracker, resume: bool = False) -> dict[str, float]:
    """Stage `bridge`: the retriever (upper level) and the search policy's GRPO (lower level), trained together."""
    import torch
    from safetensors.torch import save_model

    from posttrain.envs.retrievers import RetrievalPolicy, train_dual_encoder
    from posttrain.models import build_tiny, save_pretrained, train_char_tokenizer
    from posttrain.runtime import seed_everything
    from posttrain.recipes.search.bridge_trainer import BridgeLoop, action_mask_sft, train_bridge
    from posttrain.trainers.loop import TrainLoop

    bc, seed = cfg.bridge, cfg.pipeline.seed
    task = search_task(cfg, "bridge")
    retriever = learned_retriever(cfg, task)
    seed_everything(seed)
    splits = task.splits(seed)
    train, heldout = splits["train"], splits["heldout"]
    tokenizer = train_char_tokenizer([task.alphabet()])
    policy = build_tiny(cfg.model, tokenizer)
    o = task.opts
    retrieval = RetrievalPolicy(retriever, o.top_k, o.candidates, bc.tau, torch.Generator().manual_seed(seed))
    loop = TrainLoop.for_stage(cfg.training, out_dir, cfg.section_hash("pipeline", "task", "model", "bridge"), bc.checkpoint_every, resume, "bridge")
    bridge = BridgeLoop(task, policy, tokenizer, retrieval, bc, seed=seed, loop=loop)

    def warm_start() -> None:  # a fresh run only: a resumed one restores the policy and retriever it reached
        action_mask_sft(policy, tokenizer, train, bc.sft_steps, bc.sft_lr, bc.sft_batch_size, seed)
        if retriever.trainable and bc.retriever_warmup_steps:  # entity-only queries: "passages about p17", not which one
            pairs = [(passage.split()[0], i) for i, passage in enumerate(task.corpus.passages)]
            train_dual_encoder(retriever, pairs, bc.retriever_warmup_steps, seed=seed)

    history, metrics = train_bridge(bridge, train, heldout, on_log=lambda step, m: tracker.log_metrics(m, step), log_every=bc.log_every,
                                    fresh=warm_start)
    save_pretrained(policy, tokenizer, out_dir / "model")
    (out_dir / "retriever").mkdir()
    (out_dir / "retriever" / "retriever.json").write_text(json.dumps({"name": bc.retriever, "path": o.retriever_path if bc.retriever == "path" else None, "trained": bridge.retriever_opt is not None}) + "\n")
    if isinstance(retriever, torch.nn.Module):
        save_model(retriever, str(out_dir / "retriever" / "model.safetensors"))
    (out_dir / "history.json").write_text(strict_json(history) + "\n")
    rows = bridge.last_eval_episodes
    (out_dir / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if bc.example_episodes:
        tracker.log_table(rows[: bc.example_episodes], "example_episodes.json")
    tracker.log_artifacts(out_dir / "model", "model")
    tracker.log_artifacts(out_dir / "retriever", "retriever")
    tracker.log_metrics(metrics)
    return metrics
