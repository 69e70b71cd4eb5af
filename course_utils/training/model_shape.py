"""The shape of a decoder-only transformer (Llama / Qwen2 style), and its parameter counts, without loading it.

``ModelSpec`` holds the sizes from a model's config (``spec_from_config``); from them it counts every parameter,
the linear layers 4-bit quantisation shrinks, and the adapters LoRA adds. ``QWEN25_05B`` reads Qwen2.5-0.5B's
published config, written out in ``lesson.tiny_qwen`` so that nothing is downloaded; ``smollm2_spec`` reads the
offline model's config. The memory estimate (``course_utils.training.memory``) starts from these counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from course_utils.core.profiles import OFFLINE_MODEL_ID, Profile, get_profile
from course_utils.lesson.offline_model import materialize_offline_model
from course_utils.lesson.tiny_qwen import QWEN25_05B_CONFIG


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only transformer (Llama / Qwen2 style): all the estimator needs.

    ``attention_bias``: Qwen2 has biases on the q/k/v projections, Llama does not.
    """

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tie_embeddings: bool
    head_dim: int | None = None
    attention_bias: bool = False

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelSpec.{name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def kv_dim(self) -> int:
        """Width of the key (and of the value) projection: grouped-query attention makes it small."""
        return self.num_kv_heads * self.dim_per_head

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each linear layer in one decoder block, by the names LoRA targets."""
        h, kv, i, q = self.hidden_size, self.kv_dim, self.intermediate_size, self.num_heads * self.dim_per_head
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    @property
    def embedding_parameters(self) -> int:
        """Input embeddings plus the output head (counted once when they are tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_embeddings else 2)

    @property
    def linear_parameters(self) -> int:
        """Weights of every linear layer in the decoder blocks (what 4-bit quantisation shrinks)."""
        return self.num_layers * sum(a * b for a, b in self.module_shapes().values())

    @property
    def num_parameters(self) -> int:
        """Every parameter: embeddings, linear layers, q/k/v biases, RMSNorm weights (2 per block + final)."""
        biases = self.num_layers * (self.num_heads * self.dim_per_head + 2 * self.kv_dim) if self.attention_bias else 0
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.embedding_parameters + self.linear_parameters + biases + norms

    def lora_parameters(self, r: int, target_modules: tuple[str, ...] | list[str]) -> int:
        """Adapter parameters: each targeted linear layer gains A (in x r) and B (r x out)."""
        shapes = self.module_shapes()
        unknown = sorted(set(target_modules) - set(shapes))
        if unknown:
            raise ValueError(f"Unknown LoRA target module(s) {unknown}; this model has {sorted(shapes)}")
        if r < 1:
            raise ValueError(f"LoRA rank r must be >= 1, got {r}")
        return self.num_layers * sum(r * (shapes[m][0] + shapes[m][1]) for m in target_modules)


def spec_from_config(config: Any, name: str | None = None) -> ModelSpec:
    """A ``ModelSpec`` from a transformers config object, a config dict, or a folder holding ``config.json``."""
    if isinstance(config, (str, Path)):
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"No config.json at {path}: pass a model folder, a config file or a config object")
        config = json.loads(path.read_text())
    values = config if isinstance(config, dict) else config.to_dict()
    required = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
    missing = [key for key in required if key not in values]
    if missing:
        raise ValueError(f"The model config lacks {missing}: the estimator needs a decoder-only (Llama/Qwen) config")
    return ModelSpec(
        name=name or values.get("_name_or_path") or values.get("model_type", "model"),
        hidden_size=values["hidden_size"],
        num_layers=values["num_hidden_layers"],
        num_heads=values["num_attention_heads"],
        num_kv_heads=values.get("num_key_value_heads") or values["num_attention_heads"],
        intermediate_size=values["intermediate_size"],
        vocab_size=values["vocab_size"],
        tie_embeddings=bool(values.get("tie_word_embeddings", False)),
        head_dim=values.get("head_dim"),
        attention_bias=bool(values.get("attention_bias", values.get("model_type") == "qwen2")),
    )


# Qwen2.5-0.5B(-Instruct), from its config.json on the Hub (``lesson.tiny_qwen``, written out so that nothing is
# downloaded): hidden_size 896, 24 layers, 14 heads, 2 KV heads, intermediate_size 4864, vocab_size 151936, tied
# embeddings, q/k/v projections with bias. That makes 494,032,768 parameters, the "0.49B" of the model card.
QWEN25_05B = spec_from_config(QWEN25_05B_CONFIG, name="Qwen2.5-0.5B-Instruct")


def smollm2_spec() -> ModelSpec:
    """The offline SmolLM2-135M-Instruct's shape, read from the materialized model's ``config.json``."""
    return spec_from_config(materialize_offline_model(), name="SmolLM2-135M-Instruct")


def spec_for_profile(profile: Profile | str | None = None) -> ModelSpec:
    """The profile's model shape: SmolLM2 offline, Qwen2.5-0.5B from the constant above otherwise."""
    p = get_profile(profile)
    if p.model_id == OFFLINE_MODEL_ID:
        return smollm2_spec()
    if p.model_id.split("/")[-1].startswith("Qwen2.5-0.5B"):
        return QWEN25_05B
    raise ValueError(f"No built-in shape for {p.model_id!r}: pass spec=spec_from_config(model.config)")
