"""The CPU speed-up plug-in trains what plain TRL trains: same log-probs, loss and gradients, same sampling.

A real ``GRPOTrainer`` on tiny models of the lab's architecture (Llama, as SmolLM2) and the GPU profiles'
(Qwen2), with LoRA in the top layers as the ``cpu`` profile sets it. ``cpu_speed.enabled`` is compared with plain
TRL on one step: the training pass on the same sampled completions, and the distribution sampling draws from.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from trl import GRPOTrainer

from course_utils import cpu_speed
from course_utils.core.profiles import get_profile
from course_utils.cpu_speed import versions
from course_utils.training.grpo_config import make_grpo_config
from course_utils.training.lora_setup import make_lora_config

WORDS = ["<pad>", "<eos>", "<unk>", *(f"w{i}" for i in range(61))]  # a vocabulary of 64
PROMPT = "w3 w14 w15 w9 w26 w5"
GROUP = 4  # completions per prompt, all in one micro-batch, as the lab samples and trains them
LAYERS, TRAINED_LAYERS = 4, 2  # LoRA in the top half, as the cpu profile: the bottom two are frozen
ARCHITECTURES = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}

# (a) Both passes compute the same fp32 ops on the same tokens; they differ in summation order only: the prefix
# read once for all rows, the frozen layers' output taken from sampling (stacked, merged and packed products), the
# log-softmax over the completion positions only. Each value then differs by a few fp32 roundings (eps = 1.2e-7),
# grown through the layers: log-probs ~1e-6 relative; gradients, sums over tokens of advantages of both signs,
# ~1e-5 of their largest entry. A mechanism that computes something else (adapters left out, a wrong position
# replayed, a gradient off by 1%) moves them by 1e-2 or more. Hence 1e-4, with room on both sides.
RTOL, ATOL = 1e-4, 1e-5  # log-probs (about -1 to -6) and the loss
GRAD_TOLERANCE = 1e-4  # of each gradient's largest entry
# (b) The false-failure rate of the chi-square test of the first sampled token against the exact probabilities: the
# seed is fixed, but another CPU's kernels round the probabilities differently and so draw other samples.
FALSE_FAILURE_RATE = 1e-4
SAMPLES = 2000


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over :data:`WORDS`, left-padding as TRL samples."""
    vocabulary = {word: index for index, word in enumerate(WORDS)}
    backend = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    backend.pre_tokenizer, backend.decoder = pre_tokenizers.WhitespaceSplit(), decoders.WordPiece()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left"
    )


def tiny_model(architecture: str) -> torch.nn.Module:
    """A tiny random model with grouped-query attention and tied embeddings, as SmolLM2 and Qwen2.5 have.

    Weights drawn wider than the default, so the next-token distribution is far from uniform and the adapters
    change it visibly."""
    config_class, model_class = ARCHITECTURES[architecture]
    config = config_class(
        vocab_size=len(WORDS), hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, initializer_range=0.15,
        pad_token_id=0, eos_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    return model_class(config)


def words_reward(completions: list[str], **kwargs: object) -> list[float]:
    """A reward that differs between completions, so that the advantages (and the gradients) are not zero."""
    return [float(sum(int(word[1:]) for word in c.split() if word[1:].isdigit()) % 7) for c in completions]


def tiny_trainer(architecture: str, output_dir: str) -> GRPOTrainer:
    """A ``GRPOTrainer`` set up as the lab's (cpu profile: LoRA, loss, sampling), at toy sizes, in fp32."""
    profile = get_profile("cpu").override(lora_top_layers=TRAINED_LAYERS)
    model = tiny_model(architecture)
    config = make_grpo_config(
        profile, output_dir, num_generations=GROUP, per_device_train_batch_size=GROUP, max_completion_length=6,
        max_steps=1, reward_weights=None, report_to=[], bf16=False, fp16=False, save_strategy="no",
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=[words_reward], args=config, processing_class=tiny_tokenizer(),
        train_dataset=Dataset.from_dict({"prompt": [PROMPT] * GROUP}), peft_config=make_lora_config(profile, model),
    )  # fmt: skip
    torch.manual_seed(1)
    for name, parameter in trainer.model.named_parameters():
        if "lora_B" in name:  # as after some steps: zero B makes the adapters change nothing
            torch.nn.init.normal_(parameter, std=0.3)
    trainer.model.train()  # as in a training step, which also sets how many passes make one optimizer step:
    trainer.current_gradient_accumulation_steps = config.gradient_accumulation_steps
    return trainer


@pytest.fixture(params=list(ARCHITECTURES))
def trainer(request: pytest.FixtureRequest, tmp_path, monkeypatch: pytest.MonkeyPatch) -> GRPOTrainer:
    """A fresh tiny trainer per test (its model is trained in place), with the plug-in's switch unset."""
    monkeypatch.delenv(cpu_speed.ENV_VAR, raising=False)
    untested = versions.gate()
    if untested:
        pytest.skip(f"the plug-in is off on these library versions: {untested}")
    return tiny_trainer(request.param, str(tmp_path))


def enabled_with_every_part(trainer: GRPOTrainer) -> cpu_speed.SpeedUps:
    """``cpu_speed.enabled`` on the trainer, entered, with a check that every part is really on."""
    handle = cpu_speed.enabled(trainer, profile="cpu").__enter__()
    if handle.active != cpu_speed.PARTS:
        handle.remove()
        pytest.fail(f"the plug-in left out {sorted(set(cpu_speed.PARTS) - set(handle.active))} (see the output)")
    return handle


def training_pass(trainer: GRPOTrainer, batch: dict) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    """TRL's loss on ``batch`` as its training step computes it: per-token log-probs, loss and LoRA gradients."""
    scored = []
    score = trainer._get_per_token_logps_and_entropies

    def recording(*args: object, **kwargs: object) -> tuple:
        output = score(*args, **kwargs)
        scored.append(output[0])
        return output

    trainer._get_per_token_logps_and_entropies = recording
    try:
        trainer.model.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trainer.model, batch)
        loss.backward()
    finally:
        del trainer._get_per_token_logps_and_entropies
    grads = {name: p.grad.clone() for name, p in trainer.model.named_parameters() if p.requires_grad}
    return scored[0].detach(), loss.detach(), grads


def end_one_row_early(batch: dict) -> None:
    """The first completion ends after 3 tokens, as at an end-of-sequence token. With completions of one length
    the loss is zero (``dapo``: the advantages sum to zero over the group), so comparing it would test nothing."""
    batch["completion_mask"][0, 3:] = 0
    batch["num_items_in_batch"] = batch["completion_mask"].sum()


def test_training_pass_on_the_same_completions_matches_plain_trl(trainer):
    handle = enabled_with_every_part(trainer)
    try:
        torch.manual_seed(2)  # sampled with the plug-in on: the frozen layers' output comes from this sampling
        batch = trainer._generate_and_score_completions([{"prompt": PROMPT}] * GROUP)
        end_one_row_early(batch)
        fast = training_pass(trainer, batch)
    finally:
        handle.remove()
    assert cpu_speed.installed() == ()
    plain = training_pass(trainer, batch)
    mask = batch["completion_mask"].bool()
    assert batch["advantages"].abs().sum() > 0 and plain[1].abs() > 1e-3  # a loss that teaches
    torch.testing.assert_close(fast[0][mask], plain[0][mask], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(fast[1], plain[1], rtol=RTOL, atol=ATOL)
    assert fast[2].keys() == plain[2].keys() and len(plain[2]) > 0
    for name, grad in plain[2].items():
        assert grad.abs().max() > 0, f"{name}: no gradient, nothing compared"
        scale = GRAD_TOLERANCE * grad.abs().max().item()
        torch.testing.assert_close(fast[2][name], grad, rtol=GRAD_TOLERANCE, atol=scale, msg=name)


def chi_square_quantile(degrees: int, tail: float) -> float:
    """The chi-square quantile exceeded with probability ``tail`` (Wilson-Hilferty: within 1% for these sizes)."""
    z = abs(torch.distributions.Normal(0.0, 1.0).icdf(torch.tensor(tail)).item())
    ninth = 2.0 / (9.0 * degrees)
    return degrees * (1.0 - ninth + z * math.sqrt(ninth)) ** 3


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs`` and its degrees of freedom; entries expected fewer than
    5 times are pooled into one bin, where the chi-square approximation holds."""
    expected = probs.double() * counts.sum()
    rare = expected < 5
    observed = torch.cat([counts[~rare].double(), counts[rare].double().sum().reshape(1)])
    expected = torch.cat([expected[~rare], expected[rare].sum().reshape(1)])
    keep = expected > 0
    statistic = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum().item()
    return statistic, int(keep.sum()) - 1


def first_tokens(trainer: GRPOTrainer, rows: int) -> torch.Tensor:
    """How often each token is sampled first, over ``rows`` rows of the prompt (one group, as GRPO samples)."""
    ids = trainer.processing_class([PROMPT] * rows, return_tensors="pt")
    config = copy.deepcopy(trainer.generation_config)
    config.max_new_tokens = 1
    with torch.no_grad():
        out = trainer.model.generate(**ids, generation_config=config)
    return torch.bincount(out[:, -1], minlength=len(WORDS))


def sampling_probabilities(trainer: GRPOTrainer) -> torch.Tensor:
    """The exact distribution plain ``generate`` draws the first token from, after the trainer's processors."""
    ids = trainer.processing_class([PROMPT], return_tensors="pt")
    config = copy.deepcopy(trainer.generation_config)
    config.max_new_tokens, config.output_scores, config.return_dict_in_generate = 1, True, True
    with torch.no_grad():
        scores = trainer.model.generate(**ids, generation_config=config).scores[0][0]
    return torch.softmax(scores.double(), -1)


def test_sampling_draws_from_the_same_distribution_as_plain_generate(trainer):
    probs = sampling_probabilities(trainer)
    torch.manual_seed(3)
    plain = first_tokens(trainer, SAMPLES)
    handle = enabled_with_every_part(trainer)
    try:
        torch.manual_seed(3)
        fast = first_tokens(trainer, SAMPLES)
    finally:
        handle.remove()
    for name, counts in (("plain generate", plain), ("the plug-in", fast)):
        statistic, degrees = chi_square(counts, probs)
        bound = chi_square_quantile(degrees, FALSE_FAILURE_RATE)
        assert degrees >= 10, "too few tokens expected 5 times: the test could not tell distributions apart"
        assert statistic <= bound, f"{name}: chi-square {statistic:.1f} > {bound:.1f} ({degrees} degrees of freedom)"
