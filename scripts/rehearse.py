"""``make rehearse``: the GPU profiles' code path, end to end on this CPU, before a workshop meets it on a GPU.

For ``colab-t4`` and ``gpu`` in turn, with no Hub and no GPU:

1. a tiny Qwen2 (Qwen2.5-0.5B's architecture at toy sizes, Qwen2.5-Instruct's chat template) is written to a folder
   and loaded from it through ``COURSE_MODEL_DIR``, as an offline room loads the real model; for ``colab-t4`` in real
   4-bit NF4 through bitsandbytes' CPU backend;
2. the complete notebooks 04 (configs, LoRA, ``GRPOTrainer``, checkpoints, the saved model), 05 (greedy
   evaluation, pass@k, checkpoints scored) and 08 (``GRPOTrainer(tools=[calculator])`` on Qwen2.5's own chat
   template, the three models measured with and without the tool) execute under ``COURSE_REHEARSAL=1``, which
   changes only what a CPU cannot do and the sizes cut for time, each said as
   ``rehearsal: <what> (on the GPU: <what>)`` (``course_utils.core.rehearsal``);
3. the run is resumed from its last checkpoint for one more step, as notebook 04's resume recipe does.

It prints ``name: value`` lines per profile: passed or failed, the steps run, the trainable parameters, the 4-bit
linear layers, the ``GRPOConfig`` fields that differ from the GPU run, and the seconds taken. Executed notebooks go
to ``build/rehearsal/<profile>/``. bitsandbytes comes from ``REHEARSAL_PACKAGES`` (``make rehearse`` installs the
pinned version there), so the course's own environment never imports it on a CPU.

``--quick`` (seconds; ``make test`` runs it) checks the 4-bit part alone: the ``colab-t4`` model loaded in NF4 from
the tiny Qwen2's folder, LoRA from the profile, a forward and backward pass with gradient checkpointing, and a few
greedy tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PROFILES_TO_REHEARSE = ("colab-t4", "gpu")
NOTEBOOKS = ("04_train_grpo.ipynb", "05_evaluate.ipynb", "08_tool_use.ipynb")
PACKAGES_ENV_VAR = "REHEARSAL_PACKAGES"  # a folder holding bitsandbytes (pip install --target), put on sys.path
SAME_IN_BOTH = ("output_dir",)  # a folder of the run, not a setting


def rehearsal_env(profile: str, model_dir: Path, output_dir: Path) -> dict[str, str]:
    """The environment the notebooks and the resume run under: the profile rehearsed, the model from its folder."""
    return {
        "COURSE_PROFILE": profile,
        "COURSE_REHEARSAL": "1",
        "COURSE_MODEL_DIR": str(model_dir),
        "COURSE_OUTPUT_DIR": str(output_dir),
        "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get(PACKAGES_ENV_VAR), os.environ.get("PYTHONPATH")) if p),
    }


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set while the block runs (kernels started inside inherit it), then restored."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def config_differences(profile_name: str) -> dict[str, tuple[Any, Any]]:
    """``GRPOConfig`` fields whose value in the rehearsal differs from the GPU run's: ``{field: (gpu, rehearsal)}``."""
    from course_utils.core.profiles import PROFILES, get_profile
    from course_utils.training.grpo_config import grpo_config_kwargs

    gpu_profile = PROFILES[profile_name]
    with contextlib.redirect_stdout(io.StringIO()):  # the GPU run's vLLM line is about that machine, not this one
        on_gpu = grpo_config_kwargs(gpu_profile) | {"use_vllm": gpu_profile.use_vllm}
        rehearsed = grpo_config_kwargs(get_profile(profile_name))
    return {f: (on_gpu[f], rehearsed[f]) for f in on_gpu if f not in SAME_IN_BOTH and on_gpu[f] != rehearsed[f]}


def linear_4bit_layers(model: Any) -> int:
    """How many linear layers hold 4-bit weights (bitsandbytes' ``Linear4bit``); 0 without bitsandbytes."""
    if "bitsandbytes" not in sys.modules:
        return 0
    import bitsandbytes as bnb

    return sum(isinstance(module, bnb.nn.Linear4bit) for module in model.modules())


def resume_one_more_step(profile_name: str) -> dict[str, Any]:
    """Continue the notebook's run for one more step as notebook 04's resume recipe does; the figures of that run."""
    from transformers.trainer_utils import get_last_checkpoint

    from course_utils.core.profiles import get_profile
    from course_utils.training.grpo_config import make_grpo_config
    from course_utils.training.run import build_trainer, load_model_for_training
    from course_utils.training.run_folder import prepare_resume
    from course_utils.training.trained_model import default_run_dir

    profile = get_profile(profile_name)
    run_dir = default_run_dir(profile)
    model, tokenizer = load_model_for_training(profile)
    config = make_grpo_config(profile, run_dir, max_steps=profile.max_steps + 1)
    trainer = build_trainer(model, tokenizer, profile, config=config)
    if prepare_resume(run_dir, config.max_steps) is None:
        raise RuntimeError(f"notebook 04 left no complete checkpoint in {run_dir}: nothing to resume")
    checkpoint = get_last_checkpoint(str(run_dir))
    trainer.train(resume_from_checkpoint=checkpoint)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    return {
        "resumed_from": Path(checkpoint).name,
        "steps": trainer.state.global_step,
        "trainable_parameters": trainable,
        "linear_4bit_layers": linear_4bit_layers(trainer.model),
    }


def quick_four_bit(workdir: Path) -> dict[str, Any]:
    """The ``colab-t4`` model in 4-bit from the tiny Qwen2's folder: LoRA, one forward and backward, a few tokens."""
    from peft import get_peft_model

    from course_utils.core.profiles import get_profile
    from course_utils.lesson.generation import greedy_generate
    from course_utils.lesson.tiny_qwen import save_tiny_qwen
    from course_utils.training.lora_setup import make_lora_config
    from course_utils.training.run import load_model_for_training

    model_dir = save_tiny_qwen(workdir / "tiny-qwen2")
    with environment(rehearsal_env("colab-t4", model_dir, workdir / "outputs")), \
            contextlib.redirect_stdout(sys.stderr):  # fmt: skip
        profile = get_profile("colab-t4")
        model, tokenizer = load_model_for_training(profile)
        four_bit = linear_4bit_layers(model)
        if profile.gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()  # as GRPOTrainer does for a PEFT model with checkpointing
        model = get_peft_model(model, make_lora_config(profile, model))
        batch = tokenizer(["What is 48 / 2?", "Natalia sold 48 clips in April."], return_tensors="pt", padding=True)
        model(**batch, labels=batch["input_ids"]).loss.backward()
        trained = [p for p in model.parameters() if p.requires_grad]
        written = greedy_generate(model, tokenizer, [[{"role": "user", "content": "What is 2 + 3?"}]], 4)[0]
    return {
        "linear_4bit_layers": four_bit,
        "trainable_parameters": sum(p.numel() for p in trained),
        "adapters_with_a_gradient": sum(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in trained),
        "tokens_generated": written.tokens,
    }


REHEARSAL_PACKAGES_FIX = ("`make rehearse-packages` installs the pinned bitsandbytes into build/rehearse-packages (not "
                          "into .venv, where every CPU import of peft would load it); `make rehearse` then finds it, "
                          "or pass REHEARSAL_PACKAGES=$PWD/build/rehearse-packages to scripts/rehearse.py")  # fmt: skip


def check_bitsandbytes() -> None:
    """bitsandbytes, which the 4-bit ``colab-t4`` load needs, importable: else an exit saying what to install, where."""
    packages = os.environ.get(PACKAGES_ENV_VAR) or "(REHEARSAL_PACKAGES not set)"
    if importlib.util.find_spec("bitsandbytes") is None:
        raise SystemExit(f"error: the colab-t4 rehearsal loads its model in 4-bit through bitsandbytes, which is not "
                         f"in {packages}. Fix: {REHEARSAL_PACKAGES_FIX}.")  # fmt: skip
    try:
        import bitsandbytes  # noqa: F401
    except Exception as exc:  # a broken install fails with whatever its own import raises
        where = Path(importlib.util.find_spec("bitsandbytes").origin or packages).parent.parent
        raise SystemExit(f"error: bitsandbytes in {where} cannot be imported ({type(exc).__name__}: {exc}). Fix: "
                         f"rm -rf build/rehearse-packages, then {REHEARSAL_PACKAGES_FIX}.") from None


def rehearse_profile(profile_name: str, workdir: Path, build: Path) -> dict[str, Any]:
    """One profile: the tiny Qwen written, notebooks 04, 05 and 08 executed, the run resumed; its figures."""
    from course_utils.lesson.tiny_qwen import save_tiny_qwen
    from course_utils.runner import execute_notebook

    started = time.perf_counter()
    model_dir = save_tiny_qwen(workdir / "tiny-qwen2")
    figures: dict[str, Any] = {}
    with environment(rehearsal_env(profile_name, model_dir, workdir / "outputs")):
        for name in NOTEBOOKS:
            print(f"rehearsal of {profile_name}: executing {name} ...", flush=True)
            seconds = execute_notebook(REPO / "solutions" / name, build / profile_name)
            figures[f"notebook_{name[:2]}_seconds"] = round(seconds, 1)
        with contextlib.redirect_stdout(sys.stderr):  # the trainer's own lines stay apart from the figures
            figures.update(resume_one_more_step(profile_name))
        differences = config_differences(profile_name)
    figures["config_differs"] = ", ".join(f"{f} {gpu!r}->{here!r}" for f, (gpu, here) in differences.items())
    figures["seconds"] = round(time.perf_counter() - started, 1)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES_TO_REHEARSE), choices=PROFILES_TO_REHEARSE)
    parser.add_argument("--build", type=Path, default=REPO / "build" / "rehearsal", help="executed notebooks")
    parser.add_argument("--quick", action="store_true", help="the 4-bit part alone, in seconds")
    args = parser.parse_args(argv)
    packages = os.environ.get(PACKAGES_ENV_VAR)
    if packages:
        sys.path.insert(0, packages)
    if args.quick or "colab-t4" in args.profiles:
        check_bitsandbytes()
    if args.quick:
        with tempfile.TemporaryDirectory() as folder:
            figures = quick_four_bit(Path(folder))
        print("rehearsal_quick: passed")
        for name, value in figures.items():
            print(f"rehearsal_quick_{name}: {value}")
        return 0
    failed = []
    for profile_name in args.profiles:
        workdir = args.build / f"{profile_name}-work"
        shutil.rmtree(workdir, ignore_errors=True)
        try:
            figures = rehearse_profile(profile_name, workdir, args.build)
        except Exception as exc:  # the traceback above, then one line; the next profile would only cost minutes
            traceback.print_exc()
            failed.append(profile_name)
            print(f"rehearsal_{profile_name}: failed ({exc.__class__.__name__}: {' '.join(str(exc).split())[-500:]})")
            print(f"rehearsal: stopped at the first failed profile ({profile_name}); fix it, then run again")
            break
        print(f"rehearsal_{profile_name}: passed")
        for name, value in figures.items():
            print(f"rehearsal_{profile_name}_{name}: {value}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
