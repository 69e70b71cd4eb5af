"""A run folder the course owns: marked when made, cleared only of its own files, one run at a time.

Why a marker: ``--overwrite`` and notebook 04's fresh start delete files, and the folder they are given may be a
learner's project (an unset ``$RUN_DIR`` is ``.``) or the outputs root that holds every run. The course deletes
only inside a folder it marked (``MARKER_FILENAME``), only the entries it writes (``course_entry``), and names
anything else instead of touching it, as git refuses to clean files it does not track.

Why complete checkpoints: transformers writes ``trainer_state.json`` last, so a checkpoint without it (or with
weights cut short) was torn by a kill or a full disk; ``newest_complete_checkpoint`` skips it and says so, where
``get_last_checkpoint`` would pick it. The marker also records the settings a run was made with, so a resume under
other settings is refused before any work (``settings_conflicts``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from safetensors import SafetensorError, safe_open

from course_utils.core.paths import output_dir
from course_utils.core.profiles import Profile
from course_utils.core.speedups import env_switch
from course_utils.lesson.data import GSM8K_DIR_ENV_VAR, load_gsm8k

FINAL_DIRNAME = "final"
WARM_START_DIRNAME = "warm_start"
LOG_FILENAME = "log_history.csv"
MARKER_FILENAME = "course_run_folder.json"
LOCK_FILENAME = ".course_run.lock"
STATE_FILENAME = "trainer_state.json"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
TORN_SUFFIX = ".torn"  # a torn checkpoint set aside: kept, and no longer found by get_last_checkpoint
CURVE_FILENAME = "validation_curve.json"  # notebook 05's checkpoint curve (evaluation.curves); notebook 06 reads it
# The list of what the course writes into a run folder, by name. At the top: the course's log (and its copy in the
# making), dashboard, validation curve, marker and lock, and the trainer's model card (README.md, told apart from a
# learner's by its header). Folders: checkpoints and the final model (and its copies in the making), the warm start,
# TensorBoard's runs/<date>_<host>/ and TRL's completions/; inside them only the files named here.
TOP_FILES = frozenset({LOG_FILENAME, "dashboard.png", CURVE_FILENAME, MARKER_FILENAME, LOCK_FILENAME})
MODEL_FOLDERS = frozenset({FINAL_DIRNAME, f"{FINAL_DIRNAME}.partial", f"{FINAL_DIRNAME}.old"})
COURSE_NAMES = TOP_FILES | MODEL_FOLDERS | {WARM_START_DIRNAME, "runs", "completions", "README.md"}
MODEL_FILE = re.compile(
    r"^(adapter_model\.safetensors|adapter_config\.json|model(-\d{5}-of-\d{5})?\.safetensors|model\.safetensors\."
    r"index\.json|pytorch_model\.bin|(generation_)?config\.json|tokenizer(_config)?\.json|special_tokens_map\.json|"
    r"chat_template\.jinja|vocab\.json|merges\.txt|added_tokens\.json|README\.md|course_run\.json|training_args\.bin|"
    r"trainer_state\.json|optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth)$"
)
COMPLETIONS_FILE = re.compile(r"^completions_\d+\.parquet$")
TENSORBOARD_FOLDER = re.compile(r"^[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+$")  # transformers' default_logdir()
KEPT_ON_CLEAR = frozenset({WARM_START_DIRNAME, MARKER_FILENAME, LOCK_FILENAME})  # and what is not an earlier run
WEIGHT_FILES = ("adapter_model.safetensors", "model.safetensors")
# Profile fields that shape a run, so a checkpoint cannot be continued under others: the model, the adapter's shape,
# the group size, batch and lengths, the problems and their rewards, the optimiser's schedule, and the warm start the
# adapter was trained on (max_steps aside: raising it is how a finished run trains further). The training data's
# fingerprint is recorded beside them (``train_data``).
RESUME_SETTING_FIELDS = (
    "model_source", "model_id", "use_lora", "lora_r", "lora_alpha", "lora_target_modules", "lora_top_layers",
    "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
    "mask_truncated_completions", "temperature", "beta", "learning_rate", "lr_scheduler_type", "warmup_steps",
    "max_grad_norm", "train_size", "max_prompt_tokens", "max_solution_steps", "problem_list", "reward_weights",
    "scale_rewards",
    "warm_start_examples", "warm_start_learning_rate", "warm_start_epochs", "warm_start_batch_size",
    "warm_start_reasoning", "warm_start_reasoning_lines",
)  # fmt: skip


class RunFolderError(ValueError):
    """A run folder the course must not write into or clear; the message names it and the way forward."""


# --- Which folders, and which of their entries, are the course's ------------------------------------


def course_entry(name: str) -> bool:
    """True for a name a course run writes at the top of its folder (``checkpoint-N``, ``final``, the log...)."""
    return name in COURSE_NAMES or CHECKPOINT_PATTERN.match(name.removesuffix(TORN_SUFFIX)) is not None


def _may_hold_course_files(parts: tuple[str, ...]) -> bool:
    """Whether the folder at ``parts`` (relative to the run folder) is one the course writes its files into."""
    top = parts[0]
    if top == WARM_START_DIRNAME:
        return True
    if len(parts) == 1:
        return course_entry(top) and top not in TOP_FILES and top != "README.md"
    return len(parts) == 2 and top == "runs" and TENSORBOARD_FOLDER.match(parts[1]) is not None


def _written_by_course(parts: tuple[str, ...], path: Path) -> bool:
    """Whether the file at ``parts`` is one the course writes there, by the names of ``COURSE_NAMES``' list."""
    top, name = parts[0], parts[-1]
    if top == WARM_START_DIRNAME:
        return True
    if len(parts) == 1:
        return name.removesuffix(".partial") in TOP_FILES or (name == "README.md" and _is_model_card(path))
    if top == "runs":
        return len(parts) == 3 and name.startswith("events.out.tfevents.")
    if top == "completions":
        return len(parts) == 2 and COMPLETIONS_FILE.match(name) is not None
    return len(parts) == 2 and MODEL_FILE.match(name) is not None


def _is_model_card(path: Path) -> bool:
    """TRL's model card (the trainer writes README.md at each save), not a learner's README."""
    with contextlib.suppress(OSError, UnicodeDecodeError):
        head = path.read_text(encoding="utf-8")[:400]
        return head.startswith("---\n") and "\n- trl\n" in head
    return False


def sort_entries(run_dir: Path) -> tuple[list[Path], list[str]]:
    """The files of ``run_dir`` the course wrote (by name), and everything else, relative (folders end in ``/``)."""
    ours: list[Path] = []
    theirs: list[str] = []
    if run_dir.is_dir():
        _sort_folder(run_dir, (), ours, theirs)
    return ours, theirs


def _sort_folder(folder: Path, parts: tuple[str, ...], ours: list[Path], theirs: list[str]) -> None:
    for child in sorted(folder.iterdir()):
        here = (*parts, child.name)
        if child.is_dir() and not child.is_symlink() and _may_hold_course_files(here):
            _sort_folder(child, here, ours, theirs)
        elif child.is_file() and not child.is_symlink() and _written_by_course(here, child):
            ours.append(child)
        else:
            theirs.append("/".join(here) + "/" * child.is_dir())


def foreign_entries(run_dir: Path) -> list[str]:
    """What in ``run_dir`` the course did not write (a learner's files), relative paths, sorted."""
    return sort_entries(run_dir)[1]


def in_the_way(entry: str) -> bool:
    """A learner's file a run would overwrite or delete: at the top (the model card is README.md), or inside a
    checkpoint or model folder (the trainer deletes old checkpoints whole, a new final model replaces the old)."""
    return not entry.startswith(("runs/", "completions/"))


def is_marked(run_dir: Path) -> bool:
    """True when the course made ``run_dir`` (its marker file is there)."""
    return (run_dir / MARKER_FILENAME).is_file()


def unsafe_reason(run_dir: Path) -> str | None:
    """Why ``run_dir`` can never be a run folder (the current folder, home, the outputs root...), or None."""
    if str(run_dir).strip() in ("", "."):
        return "it is empty or '.' (an unset variable?), the current folder"
    target = run_dir.expanduser().resolve()
    roots = {"the current folder": Path.cwd(), "your home folder": Path.home(), "the outputs root": output_dir()}
    for label, root in roots.items():
        root = root.resolve()
        if target == root or target in root.parents:
            return f"it is {label}" if target == root else f"it holds {label} ({root})"
    return None


def check_can_hold_a_run(run_dir: Path) -> None:
    """Refuse a path that is a file, a folder that must never be cleared, or a folder of a learner's own files."""
    reason = unsafe_reason(run_dir)
    if reason:
        raise RunFolderError(f"{str(run_dir)!r} cannot be a run folder: {reason}. Give a folder of its own, "
                             "e.g. --output-dir outputs/my-run.")  # fmt: skip
    if run_dir.exists() and not run_dir.is_dir():
        raise RunFolderError(f"{run_dir} is a file, not a folder: give another --output-dir (or move the file).")
    foreign = [entry for entry in foreign_entries(run_dir) if in_the_way(entry)]
    if foreign:
        raise RunFolderError(
            f"{run_dir} holds files a course run does not write ({', '.join(foreign)}); a run would overwrite or "
            "delete them (the trainer writes README.md, replaces final/ and deletes old checkpoints). Give another "
            "--output-dir, or move those files out."
        )


def claim(run_dir: Path, settings: dict[str, Any] | None = None) -> Path:
    """Make ``run_dir`` (if needed) and mark it as the course's, with the run's ``settings``; return it.

    An unmarked folder is claimed only when it holds nothing but course entries (an earlier run of the course).
    """
    check_can_hold_a_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    info = read_marker(run_dir)
    if settings is not None:
        info["settings"] = settings
    write_atomic(run_dir / MARKER_FILENAME, json.dumps({"made_by": "grpo-course", **info}, indent=2))
    return run_dir


def read_marker(run_dir: Path) -> dict[str, Any]:
    """The marker's contents ({} when the folder has none); a damaged marker is named with its fix."""
    path = run_dir / MARKER_FILENAME
    if not path.is_file():
        return {}
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise RunFolderError(f"{path} is damaged ({exc}): delete it and pass --resume again (its settings "
                             "are then not checked), or start a new --output-dir.") from exc  # fmt: skip
    return info if isinstance(info, dict) else {}


def clear(run_dir: str | Path) -> Path:
    """Delete an earlier run's files (by name, ``sort_entries``) from a folder the course made; keep the warm start.

    Refused, naming why, for a folder the course did not make, one holding a learner's files a run would overwrite,
    or one another run holds (its lock). Anything else that is not the course's is kept and named. A new or empty
    folder is claimed. Folders empty before stay: a trainer built before the clearing may have made them for its
    own output (``log_completions=True`` makes ``completions/``).
    """
    run_dir = Path(run_dir)
    env_switch()  # a mistyped COURSE_CPU_SPEEDUPS stops the run here, before the earlier one is deleted
    check_clearable(run_dir)
    with locked(run_dir):
        ours, theirs = sort_entries(run_dir)
        deleted = [path for path in ours if path.relative_to(run_dir).parts[0] not in KEPT_ON_CLEAR]
        for path in deleted:
            path.unlink()
        _remove_emptied(run_dir, {path.parent for path in deleted})
        if theirs:
            print(f"kept in {run_dir} (not written by the course): {', '.join(theirs)}")
        write_atomic(run_dir / MARKER_FILENAME, json.dumps({"made_by": "grpo-course"}, indent=2))
    return run_dir


def _remove_emptied(run_dir: Path, folders: set[Path]) -> None:
    """Remove the folders the clearing emptied, deepest first, and their parents it emptied, up to ``run_dir``."""
    for folder in sorted(folders, key=lambda path: len(path.parts), reverse=True):
        while folder != run_dir and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
            folder = folder.parent


def check_clearable(run_dir: Path) -> None:
    """Refuse, naming why, to clear a folder the course did not make (or one holding files it did not write)."""
    check_can_hold_a_run(run_dir)
    earlier = earlier_entries(run_dir)
    if earlier and not is_marked(run_dir):
        raise RunFolderError(
            f"{run_dir} was not made by the course (no {MARKER_FILENAME}), so it is not cleared. It holds "
            f"{', '.join(earlier)}: delete it yourself if it is an old run, or give another --output-dir."
        )


def earlier_entries(run_dir: Path) -> list[str]:
    """What an earlier run left in ``run_dir`` (checkpoints, ``final``, logs) at its top: the entries holding files
    the course wrote, its warm start, marker and lock aside."""
    ours, _ = sort_entries(run_dir)
    return sorted({path.relative_to(run_dir).parts[0] for path in ours} - KEPT_ON_CLEAR)


# --- One run per folder ---------------------------------------------------------------------------


_HELD: set[Path] = set()  # the folders this process holds the lock of: a run that clears its own folder holds it


@contextlib.contextmanager
def locked(run_dir: Path) -> Iterator[None]:
    """Hold the folder's lock while a run writes into it or clears it; another run is refused, naming its process.

    An OS file lock (``flock``): it goes with the process, so a crashed or killed run never leaves it stuck. The
    folder is checked first (never ``.`` or a file), and a lock this process holds already is held again.
    """
    import fcntl  # POSIX only; the course runs on Linux, macOS and Colab

    check_can_hold_a_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    key = run_dir.resolve()
    if key in _HELD:
        yield
        return
    path = run_dir / LOCK_FILENAME
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderError(_in_use_message(run_dir, _lock_owner(handle))) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()}: {_command_line()}\n")
        handle.flush()
        _HELD.add(key)
        try:
            yield
        finally:
            _HELD.discard(key)
            fcntl.flock(handle, fcntl.LOCK_UN)


def _lock_owner(handle: TextIO) -> str:
    handle.seek(0)
    return handle.read().strip() or "process unknown"


def _command_line() -> str:
    """This process's command, shortened, for the lock: a learner told "in use" sees which run holds the folder."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]) if sys.argv and sys.argv[0] else "python"
    return command if len(command) <= 160 else command[:157] + "..."


def _in_use_message(run_dir: Path, owner: str) -> str:
    """Who holds ``run_dir``, that nothing was changed, and the ways forward (the script's and the notebook's)."""
    pid = re.match(r"process (\d+)", owner)
    stop = f" or stop it (kill {pid.group(1)})" if pid else ""
    return (f"{run_dir} is in use by another run ({owner}); nothing in it was changed. Wait for that run to end"
            f"{stop}, then try again, or give this run another folder (--output-dir for the script).")  # fmt: skip


# --- Writing without tearing ---------------------------------------------------------------------------


def write_atomic(path: Path, text: str) -> Path:
    """Write ``text`` beside ``path`` and rename it into place: a reader sees the old file or the new, never half."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    os.replace(partial, path)
    return path


def replace_folder(partial: Path, folder: Path) -> Path:
    """Move a fully written ``partial`` folder to ``folder``, the old one aside first and deleted only after."""
    old = folder.with_name(folder.name + ".old")
    if old.exists():
        shutil.rmtree(old)
    if folder.exists():
        folder.rename(old)
    partial.rename(folder)
    if old.exists():
        shutil.rmtree(old)
    return folder


@contextlib.contextmanager
def written_aside(folder: Path, what: str, fix: str) -> Iterator[Path]:
    """Give ``folder.partial`` to write into; once written, it replaces ``folder`` (``replace_folder``).

    A write that fails (a full disk: safetensors' ``SafetensorError`` or an ``OSError``) leaves ``folder`` as it was,
    removes the partial copy, and is an ``OSError`` naming ``what``, the folder, the cause, the room left and ``fix``.
    """
    partial = folder.with_name(folder.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    try:
        yield partial
    except (OSError, SafetensorError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        room = shutil.disk_usage(next(p for p in (folder, *folder.parents) if p.exists())).free / 2**20
        raise OSError(f"{what} could not be written to {folder} ({type(exc).__name__}: {exc}; {room:,.0f} MiB free on "
                      f"that disk). {fix}") from exc  # fmt: skip
    replace_folder(partial, folder)


@contextlib.contextmanager
def loading(folder: Path, what: str, fix: str) -> Iterator[None]:
    """While a saved model loads: a missing, cut-short or garbled file, or a ``config.json`` whose shapes its weights
    do not have (transformers' ``RuntimeError``), is a ``ValueError`` naming it and the fix."""
    try:
        yield
    except (OSError, ValueError, SafetensorError) as exc:
        raise ValueError(f"{what} in {folder} cannot be loaded ({type(exc).__name__}: {exc}). {fix}") from exc
    except RuntimeError as exc:
        cause = "its config.json does not match its weights' shapes" if "mismatch" in str(exc) else str(exc)
        raise ValueError(f"{what} in {folder} cannot be loaded: {cause}. {fix}") from exc


# --- Complete checkpoints -----------------------------------------------------------------------------


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (torn, empty, weights cut short), or None when it is complete."""
    try:
        state = json.loads((checkpoint / STATE_FILENAME).read_text(encoding="utf-8"))
        int(state["global_step"])
    except FileNotFoundError:
        return f"no {STATE_FILENAME} (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{STATE_FILENAME} is damaged ({exc.__class__.__name__})"
    weights = [checkpoint / name for name in WEIGHT_FILES if (checkpoint / name).is_file()]
    if not weights:
        return f"no model weights ({' or '.join(WEIGHT_FILES)})"
    try:
        with safe_open(str(weights[0]), framework="pt") as reader:
            reader.keys()
    except Exception as exc:  # safetensors raises its own error types for a short or garbled file
        return f"{weights[0].name} is damaged ({exc})"
    return None


def checkpoints_newest_first(run_dir: Path) -> list[Path]:
    """The ``checkpoint-N`` folders of ``run_dir``, highest N first."""
    found = [(int(m.group(1)), child) for child in run_dir.iterdir() if (m := CHECKPOINT_PATTERN.match(child.name))]
    return [child for _, child in sorted(found, reverse=True) if child.is_dir()]


def newest_complete_checkpoint(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint that can be resumed from (or None), and each newer torn one with why it was skipped."""
    skipped = []
    for checkpoint in checkpoints_newest_first(run_dir) if run_dir.is_dir() else []:
        problem = checkpoint_problem(checkpoint)
        if problem is None:
            return checkpoint, skipped
        skipped.append(f"{checkpoint.name}: {problem}")
    return None, skipped


def checkpoint_step(checkpoint: Path) -> int:
    """The step a complete checkpoint saved (its ``trainer_state.json``)."""
    return int(json.loads((checkpoint / STATE_FILENAME).read_text(encoding="utf-8"))["global_step"])


def checkpoint_history(checkpoint: Path) -> list[dict[str, Any]]:
    """The log history up to a complete checkpoint: ``log_history.csv`` can always be rebuilt from this."""
    return list(json.loads((checkpoint / STATE_FILENAME).read_text(encoding="utf-8"))["log_history"])


def missing_optimizer_note(checkpoint: Path) -> str | None:
    """What a resume loses when the checkpoint has no optimizer state, or None when it has one."""
    if (checkpoint / "optimizer.pt").is_file():
        return None
    return (
        f"{checkpoint.name} has no optimizer.pt: AdamW restarts with empty moment estimates (its first updates are "
        "larger than the run's were); the learning-rate schedule continues from the saved step."
    )


# --- The settings a run was made with ----------------------------------------------------------------------


def run_settings(profile: Profile) -> dict[str, Any]:
    """The profile's settings that a checkpoint depends on, and the training data's fingerprint, as JSON writes them."""
    settings = {name: getattr(profile, name) for name in RESUME_SETTING_FIELDS}
    folder = os.environ.get(GSM8K_DIR_ENV_VAR, "")
    train = Path(folder, "train.jsonl")
    stamp = (train.stat().st_mtime_ns, train.stat().st_size) if folder and train.is_file() else ()
    settings["train_data"] = train_data_fingerprint(folder, stamp)
    return json.loads(json.dumps(settings))


@functools.lru_cache(maxsize=4)
def train_data_fingerprint(gsm8k_dir: str, stamp: tuple[int, ...]) -> str:
    """The train split's row count and a hash of its rows: a changed ``train.jsonl`` is another run's data.

    Remembered per ``GSM8K_DIR`` and its file's time and size (``stamp``): the rows are read once a process."""
    train = load_gsm8k("train", verbose=False)
    digest = hashlib.sha256(json.dumps([list(train["question"]), list(train["answer"])]).encode()).hexdigest()[:16]
    return f"{len(train)} rows, sha256 {digest}"


def recorded_settings(run_dir: Path) -> dict[str, Any] | None:
    """The settings the run in ``run_dir`` was made with, or None when none were recorded (notebook 04's runs)."""
    saved = read_marker(run_dir).get("settings")
    return saved if isinstance(saved, dict) else None


def settings_conflicts(run_dir: Path, settings: dict[str, Any]) -> list[str]:
    """``["lora_r: the run used 8, this command asks for 16", ...]`` against the settings the marker recorded."""
    saved = recorded_settings(run_dir)
    if saved is None:
        return []
    return [
        f"{name}: the run used {saved[name]!r}, this command asks for {value!r}"
        for name, value in settings.items()
        if name in saved and saved[name] != value
    ]


def _final_state(run_dir: Path, checkpoint: Path) -> str:
    """What a finished run's final model is: kept whole, or torn (and how to rebuild it from ``checkpoint``)."""
    final = run_dir / FINAL_DIRNAME
    left = [name for name in (f"{FINAL_DIRNAME}.partial", f"{FINAL_DIRNAME}.old") if (run_dir / name).exists()]
    whole = final.is_dir() and any((final / name).is_file() for name in WEIGHT_FILES)
    if whole and not left:
        return f"its {FINAL_DIRNAME}/ is kept."
    found = f"only {', '.join(left)} on disk" if left else f"no weights in {FINAL_DIRNAME}/"
    return (f"its {FINAL_DIRNAME}/ did not finish saving ({found}: a kill or a full disk). Rebuild it from "
            f"{checkpoint.name}: python scripts/train_grpo.py --profile <the run's profile> --output-dir {run_dir} "
            "--resume.")


def prepare_resume(run_dir: str | Path, max_steps: int) -> Path | None:
    """Before ``trainer.train(resume_from_checkpoint=get_last_checkpoint(run_dir))``: the checkpoint it will find.

    Torn checkpoints newer than the newest complete one are renamed ``checkpoint-N.torn`` (kept, said aloud), so
    ``get_last_checkpoint`` finds the complete one; a run already at ``max_steps`` is refused (resuming it would
    train one step past the end and replace ``final/``); a missing optimizer state is said. Under the folder's lock:
    a checkpoint another run is still writing looks torn, and moving it would lose that run's save.
    """
    run_dir = Path(run_dir)
    with locked(run_dir):
        checkpoint, skipped = newest_complete_checkpoint(run_dir)
        for torn in checkpoints_newest_first(run_dir)[: len(skipped)]:
            torn.rename(torn.with_name(torn.name + TORN_SUFFIX))
    for note in skipped:
        print(f"set aside as torn (not resumable): {note}")
    if checkpoint is None:
        print(f"no complete checkpoint in {run_dir}: the run starts at step 0")
        return None
    step = checkpoint_step(checkpoint)
    if 0 < max_steps <= step:
        raise RunFolderError(
            f"The run in {run_dir} is finished ({checkpoint.name}, step {step} of max_steps={max_steps}); "
            f"{_final_state(run_dir, checkpoint)} To train further, raise max_steps; for a new run, start fresh."
        )
    print(f"resuming from {checkpoint} (step {step})")
    note = missing_optimizer_note(checkpoint)
    if note:
        print(note)
    return checkpoint
