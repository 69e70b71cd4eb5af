"""Shared test set-up: the `ci` profile, no Hub, and the real GSM8K files when they are beside the checkout."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from course_utils.core.paths import cache_dir

os.environ.setdefault("COURSE_PROFILE", "ci")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# course_utils.cpu_speed.packed_linear.KERNEL_CACHE_ENV_VAR, named again: importing the plug-in here would import
# torch and transformers before any test is collected
KERNEL_CACHE_ENV_VAR = "COURSE_KERNEL_CACHE"

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_GSM8K = REPO_ROOT.parent / "shared" / "data" / "gsm8k"


@pytest.fixture(scope="session", autouse=True)
def private_kernel_cache(tmp_path_factory):
    """Packed-kernel timings go to a file of this session (``COURSE_KERNEL_CACHE``), not to the learner's cache.

    In the environment, so that the notebooks and scripts the tests start write there too. It starts as a copy of
    the learner's file where there is one: the choices this machine measured before are read, never written.
    """
    before = os.environ.get(KERNEL_CACHE_ENV_VAR)
    session_file = tmp_path_factory.mktemp("kernel_cache") / "packed_kernels.json"
    learners_file = Path(before) if before else cache_dir() / "packed_kernels.json"
    if learners_file.is_file():
        shutil.copyfile(learners_file, session_file)
    os.environ[KERNEL_CACHE_ENV_VAR] = str(session_file)
    yield Path(os.environ[KERNEL_CACHE_ENV_VAR])
    if before is None:
        os.environ.pop(KERNEL_CACHE_ENV_VAR, None)
    else:
        os.environ[KERNEL_CACHE_ENV_VAR] = before


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    """OpenAI's GSM8K files (train.jsonl, test.jsonl): GSM8K_DIR, else ../shared/data/gsm8k; skipped if absent."""
    folder = Path(os.environ.get("GSM8K_DIR") or SHARED_GSM8K)
    if not (folder / "train.jsonl").is_file():
        pytest.skip(f"real GSM8K files not found in {folder}: set GSM8K_DIR to run these tests")
    return folder


@pytest.fixture
def gsm8k_env(gsm8k_dir, monkeypatch, tmp_path):
    """Real GSM8K files and a private output folder, so runs never touch the learner's outputs/."""
    monkeypatch.setenv("GSM8K_DIR", str(gsm8k_dir))
    monkeypatch.setenv("COURSE_OUTPUT_DIR", str(tmp_path / "outputs"))
    return tmp_path


@pytest.fixture(scope="session")
def offline_model_and_tokenizer():
    """The offline SmolLM2 model and tokenizer, loaded once for the whole test session (read-only use)."""
    from course_utils.lesson.models import load_model_and_tokenizer

    loaded = load_model_and_tokenizer("ci")
    _SHARED_MODEL.append((loaded[0], _model_state(loaded[0])))
    return loaded


_SHARED_MODEL: list[tuple[object, tuple]] = []


def _model_state(model) -> tuple:
    """What a test must leave as it found it: the modules, which parameters train, and no patched method."""
    names = tuple(name for name, _ in model.named_modules())
    trains = tuple(p.requires_grad for p in model.parameters())
    patched = tuple(sorted(name for name, m in model.named_modules() for key in ("forward", "generate")
                           if key in m.__dict__))
    return names, trains, patched, model.training


@pytest.fixture(autouse=True)
def shared_model_left_as_found(request):
    """Fails the test that changed the session's shared model in place (a test after it would see the change)."""
    yield
    for index, (model, state) in enumerate(_SHARED_MODEL):
        now = _model_state(model)
        _SHARED_MODEL[index] = (model, now)  # named once, in the test that changed it
        assert now == state, (
            f"{request.node.nodeid} changed the shared offline model in place (modules, trainable parameters, a "
            "patched forward/generate or train mode): give it a copy.deepcopy of the model instead"
        )


def _load_module(folder: str, name: str) -> ModuleType:
    """Imports ``<folder>/<name>.py`` as a module, registered in ``sys.modules`` while it runs, as a real import is
    (dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", REPO_ROOT / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_script():
    """Imports ``scripts/<name>.py`` as a module (the scripts are not a package)."""
    return lambda name: _load_module("scripts", name)


@pytest.fixture(scope="session")
def load_benchmark():
    """Imports ``benchmarks/<name>.py`` as a module (the benchmarks are not a package)."""
    return lambda name: _load_module("benchmarks", name)


@pytest.fixture(scope="session")
def gsm8k_train(gsm8k_dir):
    """The real GSM8K train split: the rows the notebooks' checks build their cases from."""
    from course_utils.lesson.data import load_gsm8k

    return load_gsm8k("train", folder=gsm8k_dir, verbose=False)
