"""A GPU profile's model read from a folder on disk (``COURSE_MODEL_DIR``), for rooms without the Hub.

An offline room with a copy of Qwen2.5-0.5B-Instruct (the folder ``huggingface-cli download`` or
``save_pretrained`` writes) sets ``COURSE_MODEL_DIR=/path/to/Qwen2.5-0.5B-Instruct``; the ``colab-t4`` and ``gpu``
profiles then load it from there, with no Hub. The folder is checked before loading, so a wrong path or another
model is named here, not deep inside ``from_pretrained``: whole, before any work. The tokenizer must load and encode a
known sentence to a sensible number of tokens (a folder without ``tokenizer.json`` gives a 3-token tokenizer that
trains without a word), the weights' shapes must match ``config.json``, and the model must be the profile's size:
another size is allowed only under the rehearsal (``COURSE_REHEARSAL=1``) or for the course's own stand-in (its
``course_tiny_qwen.json``, ``lesson.tiny_qwen``), and always said.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from safetensors import safe_open

from course_utils.core.profiles import HUB_MODEL_ID, OFFLINE_MODEL_ID, Profile
from course_utils.core.rehearsal import REHEARSAL_ENV_VAR, rehearsal_requested
from course_utils.lesson.offline_model import safetensors_problem

MODEL_DIR_ENV_VAR = "COURSE_MODEL_DIR"
# The architecture (config.json's model_type) each profile model has: another one would train a different model
EXPECTED_MODEL_TYPES = {HUB_MODEL_ID: "qwen2", OFFLINE_MODEL_ID: "llama"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# Qwen2.5-0.5B-Instruct's shape (its config.json): a folder of another size trains another model
PROFILE_MODEL_SHAPES = {HUB_MODEL_ID: {
    "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
    "num_key_value_heads": 2, "vocab_size": 151936,
}}  # fmt: skip
STAND_IN_MARKER = "course_tiny_qwen.json"  # what lesson.tiny_qwen writes in its folder: the course's stand-in
KNOWN_SENTENCE = "Natalia sold 48 clips in April."
SENSIBLE_TOKENS = range(5, 21)  # Qwen2.5's and SmolLM2's tokenizers: 8; one id or one per character is broken


class ModelFolderError(ValueError):
    """The folder named by ``COURSE_MODEL_DIR`` cannot serve the profile; the message names what is missing."""


def local_model_dir(profile: Profile) -> Path | None:
    """The folder ``COURSE_MODEL_DIR`` names for ``profile``'s model (checked), or None when it is not set.

    Only the Hub profiles read it: the offline profiles already load SmolLM2 from the course cache, so the variable
    set for them is an error rather than a model silently ignored.
    """
    value = os.environ.get(MODEL_DIR_ENV_VAR, "").strip()
    if not value:
        return None
    if profile.model_source != "hub":
        raise ModelFolderError(
            f"{MODEL_DIR_ENV_VAR}={value!r} is set, but profile {profile.name!r} loads the offline "
            f"{profile.model_id} from the course cache. Fix: unset {MODEL_DIR_ENV_VAR}, or pick a profile that "
            "loads Qwen2.5-0.5B-Instruct (COURSE_PROFILE=colab-t4 or gpu)."
        )
    folder = Path(value).expanduser()
    check_model_folder(folder, profile.model_id)
    return folder


def check_model_folder(folder: Path, model_id: str) -> None:
    """Raise ``ModelFolderError`` naming ``folder`` and what it lacks to hold ``model_id``'s architecture."""
    fix = f"Point {MODEL_DIR_ENV_VAR} at the folder that holds {model_id}'s config.json, weights and tokenizer."
    if not folder.is_dir():
        raise ModelFolderError(f"{MODEL_DIR_ENV_VAR}: {folder} is not a folder. {fix}")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelFolderError(f"{MODEL_DIR_ENV_VAR}: {folder} is not a model folder (no config.json). {fix}")
    try:
        config = json.loads(config_path.read_text())
        model_type = config.get("model_type")
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelFolderError(f"{MODEL_DIR_ENV_VAR}: {config_path} cannot be read ({exc}). {fix}") from exc
    expected = EXPECTED_MODEL_TYPES.get(model_id)
    if expected is not None and model_type != expected:
        raise ModelFolderError(
            f"{MODEL_DIR_ENV_VAR}: {folder} holds a {model_type!r} model, but the profile trains {model_id} "
            f"({expected!r} architecture). {fix}"
        )
    missing = [kind for kind, names in (("weights", WEIGHT_FILES), ("tokenizer", TOKENIZER_FILES))
               if not any((folder / name).is_file() for name in names)]  # fmt: skip
    if missing:
        wanted = {"weights": " or ".join(WEIGHT_FILES), "tokenizer": " or ".join(TOKENIZER_FILES)}
        raise ModelFolderError(
            f"{MODEL_DIR_ENV_VAR}: {folder} has no {' and no '.join(missing)} "
            f"({'; '.join(wanted[kind] for kind in missing)}). {fix}"
        )
    _check_weight_shapes(folder, config, fix)
    _check_size(folder, config, model_id, fix)
    _check_tokenizer(folder, config, fix)


def _check_weight_shapes(folder: Path, config: dict[str, Any], fix: str) -> None:
    """The shapes the safetensors headers hold (layers, vocabulary, widths, heads), against ``config.json``'s."""
    shapes = weight_shapes(folder, fix)
    if not shapes:
        return  # pytorch_model.bin: no header to read without loading the weights
    wrong = [f"{key} {config.get(key)!r} in config.json, {value} in the weights"
             for key, value in _config_in_weights(shapes, config).items() if config.get(key) != value]  # fmt: skip
    if wrong:
        raise ModelFolderError(
            f"{MODEL_DIR_ENV_VAR}: {folder}/config.json does not match its weights ({'; '.join(wrong)}): the two "
            f"files come from different models. {fix}"
        )
    if not config.get("tie_word_embeddings", False) and "lm_head.weight" not in shapes:  # qwen2's, llama's default
        raise ModelFolderError(
            f"{MODEL_DIR_ENV_VAR}: {folder}/config.json says tie_word_embeddings false, but the weights hold no "
            "lm_head.weight: the output layer would start random and the model would write noise. Set "
            f'"tie_word_embeddings": true in config.json if the model shares its embeddings (Qwen2.5-0.5B does), '
            f"else copy the folder with its lm_head. {fix}"
        )


def _config_in_weights(shapes: dict[str, list[int]], config: dict[str, Any]) -> dict[str, Any]:
    """The ``config.json`` values the weights' shapes fix; the heads only where the width agrees (their size is the
    width over ``num_attention_heads``), so one wrong width is not named three times."""
    layers = {int(name.split(".")[2]) for name in shapes if name.startswith("model.layers.")}
    found: dict[str, Any] = {"num_hidden_layers": len(layers)}
    embedding = shapes.get("model.embed_tokens.weight")
    if embedding is not None and len(embedding) == 2:
        found |= {"vocab_size": embedding[0], "hidden_size": embedding[1]}
    gate = shapes.get("model.layers.0.mlp.gate_proj.weight")
    if gate is not None and len(gate) == 2:
        found["intermediate_size"] = gate[0]
    heads, width = config.get("num_attention_heads"), found.get("hidden_size")
    if width is not None and width == config.get("hidden_size") and isinstance(heads, int) and heads > 0:
        head_dim = config.get("head_dim") or width // heads
        for name, projection in (("num_attention_heads", "q_proj"), ("num_key_value_heads", "k_proj")):
            rows = shapes.get(f"model.layers.0.self_attn.{projection}.weight")
            if rows and isinstance(head_dim, int) and head_dim > 0:
                found[name] = rows[0] // head_dim
    return found


def weight_shapes(folder: Path, fix: str) -> dict[str, list[int]]:
    """Each tensor's shape from the safetensors headers of ``folder`` (every shard of an index); {} for a .bin."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise ModelFolderError(f"{MODEL_DIR_ENV_VAR}: {index} cannot be read ({exc}). {fix}") from exc
    else:
        files = ["model.safetensors"] if (folder / "model.safetensors").is_file() else []
    missing = [name for name in files if not (folder / name).is_file()]
    if missing:
        raise ModelFolderError(f"{MODEL_DIR_ENV_VAR}: {folder} lacks the weight file(s) {', '.join(missing)} its "
                               f"{index.name} lists (a copy cut short?). {fix}")  # fmt: skip
    shapes: dict[str, list[int]] = {}
    for name in files:
        problem = weights_problem(folder / name)
        if problem:
            raise ModelFolderError(f"{MODEL_DIR_ENV_VAR}: {folder / name} {problem}")
        with safe_open(str(folder / name), framework="pt") as reader:
            shapes |= {key: list(reader.get_slice(key).get_shape()) for key in reader.keys()}  # noqa: SIM118
    return shapes


def weights_problem(path: Path) -> str | None:
    """Why a safetensors file cannot be used, with its fix (unreadable is not damaged), or None when it looks whole."""
    if not os.access(path, os.R_OK):
        return f"cannot be read by this user (permission denied). Fix: chmod a+r {path}, or copy the folder anew."
    problem = safetensors_problem(path)
    return None if problem is None else f"is damaged: {problem}. Copy the model folder again."


def _check_size(folder: Path, config: dict[str, Any], model_id: str, fix: str) -> None:
    """Refuse a model of another size than the profile's, unless under the rehearsal (then said)."""
    wanted = PROFILE_MODEL_SHAPES.get(model_id, {})
    other = {key: (config.get(key), value) for key, value in wanted.items() if config.get(key) != value}
    if not other:
        return
    shown = ", ".join(f"{key} {here!r} (the profile's: {value})" for key, (here, value) in other.items())
    stand_in = STAND_IN_MARKER if (folder / STAND_IN_MARKER).is_file() else None
    allowed_by = f"{REHEARSAL_ENV_VAR}=1" if rehearsal_requested() else stand_in
    if allowed_by:
        print(f"{MODEL_DIR_ENV_VAR}: {folder} holds a stand-in of another size than {model_id} ({shown}), "
              f"allowed by {allowed_by}")  # fmt: skip
        return
    raise ModelFolderError(
        f"{MODEL_DIR_ENV_VAR}: {folder} holds a model of another size than the profile's {model_id}: {shown}. {fix} "
        f"(To rehearse the GPU code path on a stand-in of another size: {REHEARSAL_ENV_VAR}=1.)"
    )


def _check_tokenizer(folder: Path, config: dict[str, Any], fix: str) -> None:
    """The tokenizer loads and encodes ``KNOWN_SENTENCE`` to a sensible number of ids, all inside the embedding."""
    stamp = tuple((p.name, p.stat().st_mtime_ns, p.stat().st_size) for p in sorted(folder.iterdir()) if p.is_file())
    problem = _tokenizer_problem(folder, stamp, config.get("vocab_size"))
    if problem:
        raise ModelFolderError(f"{MODEL_DIR_ENV_VAR}: the tokenizer in {folder} {problem}. {fix}")


@functools.lru_cache(maxsize=8)
def _tokenizer_problem(folder: Path, stamp: tuple[Any, ...], vocab_size: int | None) -> str | None:
    """Why the tokenizer cannot serve, or None; remembered per folder state (``stamp``), as loading takes a moment."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        ids = tokenizer(KNOWN_SENTENCE)["input_ids"]
    except Exception as exc:  # tokenizers raise their own exception types for a garbled file
        return f"cannot be loaded ({type(exc).__name__}: {exc})"
    if len(ids) not in SENSIBLE_TOKENS or len(tokenizer) < 1000:
        return (f"has {len(tokenizer)} tokens and encodes {KNOWN_SENTENCE!r} as {len(ids)} id(s), where a working "
                f"one gives {SENSIBLE_TOKENS.start}-{SENSIBLE_TOKENS.stop - 1} (is tokenizer.json missing or damaged?)")
    if vocab_size is not None and max(ids) >= vocab_size:
        return f"gives id {max(ids)}, past the model's {vocab_size} embedding rows (tokenizer and model differ)"
    return None
