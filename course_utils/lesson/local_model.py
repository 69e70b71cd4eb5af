"""A GPU profile's model read from a folder on disk (``COURSE_MODEL_DIR``), for rooms without the Hub.

An offline room with a copy of Qwen2.5-0.5B-Instruct (the folder ``huggingface-cli download`` or
``save_pretrained`` writes) sets ``COURSE_MODEL_DIR=/path/to/Qwen2.5-0.5B-Instruct``; the ``colab-t4`` and ``gpu``
profiles then load it from there, with no Hub. The folder is checked before loading, so a wrong path or another
model is named here, not deep inside ``from_pretrained``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from course_utils.core.profiles import HUB_MODEL_ID, OFFLINE_MODEL_ID, Profile

MODEL_DIR_ENV_VAR = "COURSE_MODEL_DIR"
# The architecture (config.json's model_type) each profile model has: another one would train a different model
EXPECTED_MODEL_TYPES = {HUB_MODEL_ID: "qwen2", OFFLINE_MODEL_ID: "llama"}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


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
        model_type = json.loads(config_path.read_text()).get("model_type")
    except (OSError, ValueError) as exc:
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
