"""Logit tiles kept for the backward: TRL's log-probabilities bit for bit and its gradients, one head pass less."""

from __future__ import annotations

import pytest
import torch
import trl.kernels.chunked_logprob as trl_logprob
import trl.trainer.utils as trl_utils
from trl.kernels import ChunkedLogProbFunction
from trl.trainer.utils import add_fused_lm_head

from course_utils.cpu_speed import logit_tiles as lt
from course_utils.lesson.models import build_tiny_random_model

EVERY_OUTPUT = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
# A loss of the differentiable outputs, with weights of either sign, as GRPO's loss and an entropy term make
LOSS_WEIGHTS = {"log_probs": 0.3, "entropy": -0.02}


def head_inputs(dtype: torch.dtype, bias: bool = False) -> tuple[torch.Tensor, ...]:
    """Hidden states, a head of 1,000 entries (3 chunks of 400) and targets, seeded; the head is trainable."""
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(50, 32, generator=generator).to(dtype)
    weight = (torch.randn(1000, 32, generator=generator) * 0.3).to(dtype)
    head_bias = (torch.randn(1000, generator=generator) * 0.1).to(dtype) if bias else None
    targets = torch.randint(0, 1000, (50,), generator=generator)
    return hidden, weight, head_bias, targets


def scored(function, dtype, bias=False, softcap=None, grads=("log_probs", "entropy")) -> dict[str, torch.Tensor]:
    """Every output of ``function`` over :func:`head_inputs`, and the gradients of a loss of the chosen outputs."""
    hidden, weight, head_bias, targets = head_inputs(dtype, bias)
    leaves = {"hidden": hidden, "weight": weight, "bias": head_bias}
    for leaf in leaves.values():
        if leaf is not None:
            leaf.requires_grad_(True)
    outputs = function.apply(hidden, weight, head_bias, targets, 0.7, 400, softcap, 1.5, EVERY_OUTPUT)
    named = dict(zip(EVERY_OUTPUT, outputs, strict=True))
    sum(named[name].float().sum() * LOSS_WEIGHTS[name] for name in grads).backward()
    gradients = {f"grad_{name}": leaf.grad.float() for name, leaf in leaves.items() if leaf is not None}
    return {**{name: value.detach() for name, value in named.items()}, **gradients}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_fp32_outputs_and_gradients_are_trls_bit_for_bit(bias, softcap):
    trls = scored(ChunkedLogProbFunction, torch.float32, bias, softcap)
    kept = scored(lt.KeptTilesLogProb, torch.float32, bias, softcap)
    assert trls.keys() == kept.keys()
    for name in trls:
        assert torch.equal(trls[name], kept[name]), f"{name} differs from TRL's"


@pytest.mark.parametrize("grads", [("log_probs",), ("entropy",), ("log_probs", "entropy")])
def test_each_gradient_alone_is_trls(grads):
    trls = scored(ChunkedLogProbFunction, torch.float32, grads=grads)
    kept = scored(lt.KeptTilesLogProb, torch.float32, grads=grads)
    assert torch.equal(trls["grad_hidden"], kept["grad_hidden"])


def test_bf16_outputs_are_trls_and_gradients_differ_only_in_the_order_of_fp32_sums():
    trls = scored(ChunkedLogProbFunction, torch.bfloat16, bias=True)
    kept = scored(lt.KeptTilesLogProb, torch.bfloat16, bias=True)
    for name in EVERY_OUTPUT:
        assert torch.equal(trls[name], kept[name]), f"{name} differs from TRL's"
    for name in ("grad_hidden", "grad_weight", "grad_bias"):
        # The same fp32 sums in another order, rounded to bf16 once: a rare entry rounds the other way, one step.
        # Products rounded to bf16 tile by tile (no fp32 sums) change about a third of the entries.
        differing = float((kept[name] != trls[name]).float().mean())
        assert differing <= 0.02, f"{differing:.1%} of {name}'s entries differ from TRL's"
        relative = float((kept[name] - trls[name]).abs().max() / trls[name].abs().max())
        assert relative <= 2**-7, f"{name} differs by {relative:.1e} of its largest entry"


def test_a_second_backward_through_the_same_call_fails_loudly():
    hidden, weight, _, targets = head_inputs(torch.float32)
    hidden.requires_grad_(True)
    log_probs, *_ = lt.KeptTilesLogProb.apply(hidden, weight, None, targets, 1.0, 400, None, 1.0, ("log_probs",))
    log_probs.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        log_probs.sum().backward()  # the tiles hold the first backward's gradients now


def test_kept_tiles_bytes_and_what_fits():
    assert lt.kept_tiles_bytes(300, 49152, 4) == 300 * 49152 * 4
    assert lt.kept_tiles_bytes(300, 49152, 2) == lt.kept_tiles_bytes(300, 49152, 4) / 2
    assert lt.tiles_fit(300, 49152, 4)
    assert not lt.tiles_fit(300, 49152, 4, budget=300 * 49152 * 4 - 1), "over the budget"
    assert not lt.tiles_fit(trl_logprob.TOKEN_CHUNK_SIZE + 1, 10, 4), "more than one of TRL's token chunks"


def test_a_call_keeps_its_tiles_on_the_cpu_within_the_budget_in_the_dtype_it_computes_in():
    hidden, weight, _, _ = head_inputs(torch.float32)
    assert lt.keeps_tiles(hidden, weight)
    fp32_bytes = lt.kept_tiles_bytes(50, 1000, 4)
    assert not lt.keeps_tiles(hidden, weight, budget=int(fp32_bytes) - 1)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 tiles: half the memory
        assert lt.keeps_tiles(hidden, weight, budget=int(fp32_bytes) // 2)
    assert not lt.keeps_tiles(hidden.to("meta"), weight.to("meta")), "off the CPU: TRL's own function"


def test_the_bf16_math_product_sums_like_fp32_and_restores_the_setting():
    generator = torch.Generator().manual_seed(0)
    acc = torch.randn(24, 64, generator=generator)
    a, b = torch.randn(24, 512, generator=generator).bfloat16(), torch.randn(512, 64, generator=generator).bfloat16()
    exact = acc.double() + a.double() @ b.double()
    before = torch.backends.mkldnn.matmul.fp32_precision
    mine = acc.clone()
    lt.head_product(mine, a, b)
    assert torch.backends.mkldnn.matmul.fp32_precision == before
    relative = float((mine.double() - exact).abs().max() / exact.abs().max())
    assert relative < 1e-6, f"{relative:.1e}: the products were rounded (a bf16 result is ~1e-3 off)"
    with pytest.raises(RuntimeError):
        lt.bf16_math_product(acc, a, b[:10])  # shapes that do not multiply
    assert torch.backends.mkldnn.matmul.fp32_precision == before, "restored after an error too"
    trls, fp32 = acc.clone(), acc.clone()
    trl_logprob._addmm_fp32(trls, a.float(), b.float())
    lt.head_product(fp32, a.float(), b.float())
    assert torch.equal(fp32, trls), "fp32 factors get TRL's own product"


def fused_scores(model, ids, labels) -> tuple[torch.Tensor, torch.Tensor]:
    """TRL's fused forward on a real model: the log-probs and the gradient of the last layer's MLP."""
    model.zero_grad()
    output = model(input_ids=ids, labels=labels, fused_lm_head=True)
    (output.loss + output.entropy.sum() * 0.01).backward()
    return output.log_probs.detach(), model.model.layers[-1].mlp.down_proj.weight.grad.clone()


def test_inside_trls_fused_forward_scores_as_before_and_everything_is_restored_after(monkeypatch):
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2, seed=1)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    ids = torch.randint(1, 128, (3, 12), generator=torch.Generator().manual_seed(0))
    labels = ids.masked_fill(torch.arange(12) < 5, -100)
    original = getattr(trl_utils, lt.TRL_LOGPROB_FUNCTION)
    trls = fused_scores(model, ids, labels)
    kept_calls = []
    monkeypatch.setattr(lt.KeptTilesLogProb, "forward", spy(lt.KeptTilesLogProb.forward, kept_calls))
    with lt.logit_tiles_kept():
        kept = fused_scores(model, ids, labels)
    assert len(kept_calls) == 1, "TRL's fused forward went through the kept tiles"
    assert getattr(trl_utils, lt.TRL_LOGPROB_FUNCTION) is original
    for name, before, after in zip(("log-probs", "gradient"), trls, kept, strict=True):
        assert torch.equal(before, after), f"the {name} differ from TRL's"
    with lt.logit_tiles_kept(budget=0):
        over_budget = fused_scores(model, ids, labels)
    assert len(kept_calls) == 1, "a call over the budget runs TRL's own function"
    assert torch.equal(over_budget[1], trls[1])


def spy(forward, calls: list):
    """``forward``, recording each call."""

    def recorded(*args, **kwargs):
        calls.append(args[1].shape)
        return forward(*args, **kwargs)

    return staticmethod(recorded)


@pytest.mark.parametrize("budget", [-1, 1.5, "1GB"])
def test_a_bad_budget_is_refused(budget):
    with pytest.raises(ValueError, match="budget"), lt.logit_tiles_kept(budget):
        pass


def test_a_trl_without_the_parts_gets_a_clear_error(monkeypatch):
    monkeypatch.delattr(trl_logprob, "_backward_tile")
    with pytest.raises(RuntimeError, match="leave the part keep_logit_tiles out"), lt.logit_tiles_kept():
        pass
