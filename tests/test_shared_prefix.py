"""Each group's prompt read once in the training pass: the same log-probabilities and gradients, packed rows."""

from __future__ import annotations

import contextlib

import pytest
import torch
from trl.trainer.utils import add_fused_lm_head

from course_utils.cpu_speed import shared_prefix as sp
from course_utils.lesson.models import build_tiny_random_model


def test_common_prefix_length_stops_at_the_first_token_or_mask_that_differs():
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 9], [5, 6, 7, 8]])
    assert sp.common_prefix_length(ids, torch.ones_like(ids)) == 3
    assert sp.common_prefix_length(ids[[0, 2]], torch.ones_like(ids[[0, 2]])) == 4, "equal rows share everything"
    mask = torch.ones_like(ids)
    mask[1, 1] = 0
    assert sp.common_prefix_length(ids, mask) == 1, "a masked token differs from a read one"
    assert sp.common_prefix_length(torch.tensor([[1, 2], [3, 2]]), torch.ones(2, 2)) == 0


@pytest.mark.parametrize("shapes", [((4,), (4,)), ((2, 3), (2, 4))])
def test_common_prefix_length_rejects_tensors_that_are_not_one_rows_by_tokens_shape(shapes):
    with pytest.raises(ValueError, match="rows, tokens"):
        sp.common_prefix_length(torch.zeros(shapes[0], dtype=torch.long), torch.ones(shapes[1]))


def lora_model(seed: int = 1) -> torch.nn.Module:
    """A tiny random Llama with TRL's fused head and non-zero LoRA adapters, as the trainer scores with."""
    from peft import LoraConfig, get_peft_model

    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2, seed=seed)
    add_fused_lm_head(model)
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    torch.manual_seed(seed)
    return get_peft_model(model, config)


def group_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """4 completions of one left-padded 6-token prompt, one of them ended early (right padding)."""
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(1, 128, (1, 6), generator=generator)
    ids = torch.cat([prompt.expand(4, -1), torch.randint(1, 128, (4, 7), generator=generator)], dim=1)
    mask = torch.ones_like(ids)
    mask[:, :2] = 0
    mask[1, 10:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :6] = -100
    return ids, mask, labels


def scored_group(
    read_once: bool, monkeypatch, attention: str = "sdpa", dtype: torch.dtype = torch.float32, batch=None
) -> tuple[torch.Tensor, list[torch.Tensor], list[tuple[int, int]]]:
    """Log-probs and LoRA gradients of ``batch`` (:func:`group_batch`), and the (rows, tokens) of each backbone call."""
    model, (ids, mask, labels) = lora_model().to(dtype), batch or group_batch()
    model.set_attn_implementation(attention)
    calls, backbone_type = [], type(sp.decoder_backbone(model))
    forward = backbone_type.forward

    def recorded(self, *args, **kwargs):
        calls.append(tuple(kwargs["input_ids"].shape))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(backbone_type, "forward", recorded)
    with sp.prefix_read_once(model) if read_once else contextlib.nullcontext():
        output = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    monkeypatch.undo()
    output.loss.backward()
    gradients = [p.grad.float() for p in model.parameters() if p.requires_grad]
    return output.log_probs.detach().float(), gradients, calls


@pytest.mark.parametrize(
    ("attention", "rest"),
    [
        # 3 rows score 6 tokens after the prompt (the 7th, their last, scores none) and the early one 3: packed
        ("sdpa", (1, 6 + 3 + 6 + 6)),
        ("eager", (4, 7)),  # an attention that is not given the packed mask: each row's 7 other tokens, padded
    ],
)
def test_reading_the_shared_prefix_once_gives_the_same_log_probs_and_gradients(attention, rest, monkeypatch):
    every_row, every_gradient, every_call = scored_group(False, monkeypatch, attention)
    once, gradients, calls = scored_group(True, monkeypatch, attention)
    assert every_call == [(4, 13)]
    assert calls == [(1, 6), rest], "the 6 prompt tokens once, then the rows' other tokens"
    assert torch.allclose(once, every_row, atol=1e-6), (once - every_row).abs().max()
    assert len(gradients) == len(every_gradient) > 0
    for shared, plain in zip(gradients, every_gradient, strict=True):
        assert torch.allclose(shared, plain, atol=1e-6), (shared - plain).abs().max()


def largest_difference(mine: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest difference between two lists of tensors, relative to each reference tensor's largest entry."""
    return max(float((a - b).abs().max() / b.abs().max()) for a, b in zip(mine, reference, strict=True))


def test_packed_rows_in_bf16_are_as_close_to_fp32_as_the_padded_rows(monkeypatch):
    exact, exact_gradients, _ = scored_group(False, monkeypatch)
    padded, padded_gradients, _ = scored_group(False, monkeypatch, dtype=torch.bfloat16)
    packed, packed_gradients, calls = scored_group(True, monkeypatch, dtype=torch.bfloat16)
    assert calls[1] == (1, 21), "the bf16 rows ran packed"
    padded_error = largest_difference([padded, *padded_gradients], [exact, *exact_gradients])
    packed_error = largest_difference([packed, *packed_gradients], [exact, *exact_gradients])
    assert packed_error <= 2 * padded_error + 1e-3, (packed_error, padded_error)


def test_rows_equal_to_the_end_score_every_token_from_the_prefix(monkeypatch):
    ids, mask, labels = group_batch()
    ids, mask, labels = ids[:1].expand(4, -1), mask[:1].expand(4, -1), labels[:1].expand(4, -1)
    plain, plain_gradients, _ = scored_group(False, monkeypatch, batch=(ids, mask, labels))
    once, gradients, calls = scored_group(True, monkeypatch, batch=(ids, mask, labels))
    assert calls == [(1, 12), (4, 1)], "no position after the prefix scores a token: the last one runs padded"
    assert torch.allclose(once, plain, atol=1e-6)
    for shared, every in zip(gradients, plain_gradients, strict=True):
        assert torch.allclose(shared, every, atol=1e-6), (shared - every).abs().max()


def test_scoring_positions_are_the_tokens_followed_by_a_real_one_row_by_row():
    mask = torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]])
    rows, columns = sp.scoring_positions(mask, 2)
    assert rows.tolist() == [0, 1, 1] and columns.tolist() == [2, 2, 3]


def test_the_packed_mask_sees_the_real_prefix_and_its_own_row_up_to_itself():
    rows, columns = torch.tensor([0, 0, 1]), torch.tensor([2, 3, 2])
    mask = sp.packed_rows_mask(torch.tensor([0, 1]), rows, columns)
    assert mask.shape == (1, 1, 3, 5)
    expected = [[False, True, True, False, False], [False, True, True, True, False], [False, True, False, False, True]]
    assert mask[0, 0].tolist() == expected


def test_calls_that_are_not_a_training_pass_over_a_shared_prefix_run_as_usual():
    ids, mask, _ = group_batch()
    seen = []

    def forward(**kwargs):
        seen.append(kwargs)
        return "plain"

    assert sp.shared_prefix_forward(forward, input_ids=ids, attention_mask=mask) == "plain", "generation's calls"
    assert sp.shared_prefix_forward(forward, input_ids=ids[:1], attention_mask=mask[:1], use_cache=False) == "plain"
    distinct = ids.clone()
    distinct[1, 0] = 99
    assert sp.shared_prefix_forward(forward, input_ids=distinct, attention_mask=mask, use_cache=False) == "plain"
    positions = torch.arange(13).expand(4, -1)
    assert (
        sp.shared_prefix_forward(forward, input_ids=ids, attention_mask=mask, use_cache=False, position_ids=positions)
        == "plain"
    )
    assert len(seen) == 4 and seen[-1]["position_ids"] is positions, "arguments are passed on untouched"


def test_prefix_read_once_is_undone_on_exit_and_needs_a_causal_lm():
    model = lora_model()
    backbone = sp.decoder_backbone(model)
    with sp.prefix_read_once(model):
        assert "forward" in backbone.__dict__
    assert "forward" not in backbone.__dict__
    with pytest.raises(ValueError, match="leave the part score_shared_prefix_once out"):
        sp.decoder_backbone(torch.nn.Linear(2, 2))
