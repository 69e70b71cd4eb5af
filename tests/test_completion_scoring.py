"""Scoring the completion tokens only: TRL's own compact path, the same log-probabilities and gradients on a CPU."""

from __future__ import annotations

import pytest
import torch
import trl.trainer.utils as trl_utils
from trl.trainer.utils import add_fused_lm_head

from course_utils.cpu_speed import completion_scoring as cs
from course_utils.lesson.models import build_tiny_random_model


def scored(compact: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """TRL's fused log-probs, loss and one weight's gradient for a batch whose first 5 positions are the prompt."""
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2, seed=1)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids = torch.randint(1, 128, (3, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.clone()
    labels[:, :5] = -100  # the prompt: masked out of the loss
    labels[2, 9:] = -100  # a completion that ended early
    if compact:
        with cs.completion_tokens_only():
            output = model(input_ids=ids, labels=labels, fused_lm_head=True)
    else:
        output = model(input_ids=ids, labels=labels, fused_lm_head=True)
    output.loss.backward()
    gradient = model.get_output_embeddings().weight.grad
    return output.log_probs.detach(), output.loss.detach(), gradient


def test_completion_tokens_get_the_same_log_probs_loss_and_gradients(monkeypatch):
    rows_scored = []
    apply = trl_utils._ChunkedLogProbFunction.apply

    def spy(hidden, *args):  # records how many positions TRL sends to its log-softmax, then runs it
        rows_scored.append(hidden.shape[0])
        return apply(hidden, *args)

    monkeypatch.setattr(trl_utils._ChunkedLogProbFunction, "apply", spy)
    every_position, compact = scored(compact=False), scored(compact=True)
    assert rows_scored == [3 * 11, 2 * 7 + 4], "every shifted position, then the completion tokens only"
    for name, full, only in zip(("log-probs", "loss", "gradient"), every_position, compact, strict=True):
        assert torch.allclose(full, only, atol=1e-6), f"{name} differ"
    assert (compact[0][:, :4] == 0).all(), "the prompt's positions are zero, as before"


def test_the_rule_is_compact_on_a_cpu_only_inside_and_restored_after():
    original = getattr(trl_utils, cs.TRL_COMPACT_RULE)
    assert not original(torch.device("cpu"))
    with cs.completion_tokens_only():
        assert getattr(trl_utils, cs.TRL_COMPACT_RULE)(torch.device("cpu"))
    assert getattr(trl_utils, cs.TRL_COMPACT_RULE) is original


def test_a_trl_without_the_rule_gets_a_clear_error(monkeypatch):
    monkeypatch.delattr(trl_utils, cs.TRL_COMPACT_RULE)
    assert not cs.trl_has_compact_rule()
    with pytest.raises(RuntimeError, match="COURSE_CPU_SPEEDUPS=0"), cs.completion_tokens_only():
        pass
