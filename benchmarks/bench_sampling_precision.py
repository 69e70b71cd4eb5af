"""Cheaper number formats for the lab's sampling, measured before any is used: their speed, and how far they move
the sampled distribution.

On an AVX2 machine the lab samples in fp32, and the products with the weights are most of a decoding step. Int8
weights (torch's dynamic quantization: weights per output channel, each call's activations quantized too) read a
quarter of the bytes. Sampling from a cheaper copy while training the fp32 model changes the computation: TRL's
loss would take completions the trained model did not sample. This measures by how much, beside bf16 weights,
which bf16 machines already sample and train with. Prints `name: value` lines:

- ``decode_products_ms_<format>``: one decoding step's products for the lab's group (``num_generations`` rows)
  through every linear layer of the model: ``fp32_packed`` (the kernels group generation picks here) and ``int8``;
- ``sampling_kl_per_token_<copy>``: KL(fp32 model || copy) of the next-token distribution, the mean over the
  completion tokens that the fp32 model sampled for held-out prompts; ``_p99`` its 99th percentile;
- ``sampling_logp_shift_per_token_<copy>``: the mean absolute change in the sampled tokens' log-probability.

Copies: ``bf16`` (every weight), ``int8`` (every linear layer), ``int8_head`` (the output head only).
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
import torch.nn.functional as F

from course_utils.core.profiles import get_profile
from course_utils.cpu_speed.packed_linear import fastest_kernels, pack, packable_layers
from course_utils.lesson.data import load_gsm8k
from course_utils.lesson.models import load_model_and_tokenizer

PROMPTS = 4
PASSES = 5


def quantized_copy(model: Any, layer_names: list[str]) -> Any:
    """A copy of ``model`` whose named linear layers compute with int8 weights (per output channel).

    The copy's output head is its own (a tied head would quantize the input embedding with it).
    """
    unknown = sorted(set(layer_names) - set(linear_layer_names(model)))
    if unknown or not layer_names:
        raise ValueError(f"quantized_copy needs names of the model's linear layers; not linear layers: {unknown}")
    quantized = copy.deepcopy(model)
    if hasattr(quantized, "lm_head"):
        quantized.lm_head = copy.deepcopy(model.lm_head)
    return int8_layers(quantized, layer_names)


def int8_layers(model: torch.nn.Module, layer_names: list[str] | None = None) -> Any:
    """``model`` with its named linear layers (every one by default) made int8, in place: callers pass a copy."""
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    spec = {torch.nn.Linear: qconfig} if layer_names is None else dict.fromkeys(layer_names, qconfig)
    return torch.ao.quantization.quantize_dynamic(model, spec, dtype=torch.qint8, inplace=True)


def linear_layer_names(model: Any, head_only: bool = False) -> list[str]:
    """The names of the model's linear layers (``lm_head`` only with ``head_only``)."""
    names = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    return [name for name in names if name == "lm_head"] if head_only else names


def next_token_logps(model: Any, sequences: torch.Tensor, prompt_tokens: int) -> torch.Tensor:
    """``model``'s log-probabilities of every next token at each completion position, in fp32.

    ``sequences`` are prompt plus completion, every row the same length (no padding).
    """
    if sequences.dim() != 2 or not 0 < prompt_tokens < sequences.shape[1]:
        raise ValueError(
            f"next_token_logps needs a (rows, tokens) tensor with completion tokens after the {prompt_tokens} prompt "
            f"tokens; got shape {tuple(sequences.shape)}"
        )
    with torch.no_grad():
        return F.log_softmax(model(sequences).logits[:, prompt_tokens - 1 : -1].float(), dim=-1)


def drift(
    expected: torch.Tensor, other: Any, sequences: torch.Tensor, prompt_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per completion token: KL(reference || other) of the next-token distribution, and |change| of the log-probability
    of the token that was sampled. ``expected``: the reference model's :func:`next_token_logps` of ``sequences``."""
    changed = next_token_logps(other, sequences, prompt_tokens)
    kl = (expected.exp() * (expected - changed)).sum(-1)
    sampled = sequences[:, prompt_tokens:, None]
    shift = (expected.gather(-1, sampled) - changed.gather(-1, sampled)).squeeze(-1).abs()
    return kl.flatten(), shift.flatten()


def sampled_sequences(
    model: Any, tokenizer: Any, prompt: list[dict[str, str]], rows: int, new_tokens: int, temperature: float
) -> tuple[torch.Tensor, int]:
    """``rows`` completions of exactly ``new_tokens`` tokens sampled from ``model`` at ``temperature`` over the whole
    vocabulary (no top-p or top-k, as TRL's defaults), each after the prompt, and the prompt's length in tokens."""
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        return model.generate(
            ids["input_ids"].repeat(rows, 1),
            attention_mask=ids["attention_mask"].repeat(rows, 1),
            do_sample=True,
            temperature=temperature,
            top_p=1.0,
            top_k=0,
            max_new_tokens=new_tokens,
            eos_token_id=None,  # every row the same length, so no token is padding
            pad_token_id=tokenizer.pad_token_id,
        ), ids["input_ids"].shape[1]


def products_ms(products: list[Any], width: dict[int, torch.Tensor]) -> float:
    """Milliseconds for one call of each product on the input of its width (best of ``PASSES``)."""
    best = float("inf")
    with torch.no_grad():
        for _ in range(PASSES + 1):
            started = time.perf_counter()
            for product, inputs in products:
                product(width[inputs])
            best = min(best, time.perf_counter() - started)
    return best * 1e3


def decode_products(model: Any, rows: int) -> dict[str, float]:
    """One decoding step's products through every linear layer: fp32 with this machine's packed kernels, and int8."""
    layers = packable_layers(model)
    kernels = fastest_kernels(layers, rows)
    packed = [(pack(kernels[tuple(layer.weight.shape), layer.weight.dtype], layer, rows), layer.in_features)
              for layer in layers]  # fmt: skip
    int8 = [(int8_layers(torch.nn.Sequential(copy.deepcopy(layer))), layer.in_features) for layer in layers]
    width = {size: torch.randn(rows, size) for size in {layer.in_features for layer in layers}}
    return {"fp32_packed": products_ms(packed, width), "int8": products_ms(int8, width)}


def main() -> None:
    profile = get_profile("cpu")
    model, tokenizer = load_model_and_tokenizer(profile.override(dtype="float32"))
    model.eval()
    rows = profile.num_generations
    for name, ms in decode_products(model, rows).items():
        print(f"decode_products_ms_{name}: {ms:.1f}")
    copies = {
        "bf16": copy.deepcopy(model).to(torch.bfloat16),
        "int8": quantized_copy(model, linear_layer_names(model)),
        "int8_head": quantized_copy(model, linear_layer_names(model, head_only=True)),
    }
    problems = load_gsm8k("test", formatted=True, limit=PROMPTS, verbose=False)
    torch.manual_seed(0)
    drifts: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {name: [] for name in copies}
    for problem in problems:
        sequences, prompt_tokens = sampled_sequences(
            model, tokenizer, problem["prompt"], rows, profile.max_completion_length, profile.temperature
        )
        expected = next_token_logps(model, sequences, prompt_tokens)
        for name, other in copies.items():
            drifts[name].append(drift(expected, other, sequences, prompt_tokens))
    print(f"sampling_drift_settings: {len(problems)} held-out prompts x {rows} completions x "
          f"{profile.max_completion_length} tokens sampled from the fp32 model")  # fmt: skip
    for name, parts in drifts.items():
        kl = torch.cat([part[0] for part in parts])
        shift = torch.cat([part[1] for part in parts])
        print(f"sampling_kl_per_token_{name}: {kl.mean().item():.4f}")
        print(f"sampling_kl_per_token_{name}_p99: {kl.quantile(0.99).item():.4f}")
        print(f"sampling_logp_shift_per_token_{name}: {shift.mean().item():.4f}")


if __name__ == "__main__":
    main()
