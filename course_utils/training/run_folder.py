"""A run folder the course owns: marked when made, cleared only of its own files, one run at a time.

Why a marker: ``--overwrite`` and notebook 04's fresh start delete files, and the folder they are given may be a
learner's project (an unset ``$RUN_DIR`` is ``.``) or the outputs root that holds every run. The course deletes
only inside a folder it marked (``MARKER_FILENAME``), only the entries it writes (``course_entry``), and names
anything else instead of touching it, as git refuses to clean files it does not track.

Why complete checkpoints: transformers writes ``trainer_state.json`` last, so a checkpoint without it (or with
weights cut short) was torn by a kill or a full disk; ``newest_complete_checkpoint`` skips it and says so, where
``get_last_checkpoint`` would pick it. The marker also records the settings a run was made with (the profile's, the
``GRPOConfig``'s own, the data's fingerprints) and the command that made it, so a resume under other settings is
refused before any work (``resume_conflicts``) and a torn final model is named with a command that rebuilds it.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from safetensors import SafetensorError, safe_open

from course_utils.core.paths import output_dir
from course_utils.core.profiles import Profile, get_profile, profile_names
from course_utils.core.rehearsal import REHEARSAL_ENV_VAR
from course_utils.core.speedups import env_switch
from course_utils.lesson.data import GSM8K_DIR_ENV_VAR, load_gsm8k
from course_utils.lesson.local_model import MODEL_DIR_ENV_VAR
from course_utils.lesson.models import saved_model_kind
from course_utils.lesson.offline_model import safetensors_problem
from course_utils.training.problem_choice import problem_list_path

FINAL_DIRNAME = "final"
WARM_START_DIRNAME = "warm_start"
LOG_FILENAME = "log_history.csv"
MARKER_FILENAME = "course_run_folder.json"
LOCK_FILENAME = ".course_run.lock"
STATE_FILENAME = "trainer_state.json"
RUN_INFO_FILENAME = "course_run.json"  # written last into the final model: its kind and the step it was saved at
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
# adapter was trained on. Beside them: max_steps (raised only to train a finished run further), the GRPOConfig's own
# fields (``CONFIG_SETTING_FIELDS``), and the fingerprints of the train split and the problem list's file.
RESUME_SETTING_FIELDS = (
    "model_source", "model_id", "use_lora", "lora_r", "lora_alpha", "lora_target_modules", "lora_top_layers",
    "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
    "mask_truncated_completions", "temperature", "beta", "learning_rate", "lr_scheduler_type", "warmup_steps",
    "max_grad_norm", "train_size", "max_prompt_tokens", "max_solution_steps", "problem_list", "reward_weights",
    "scale_rewards",
    "warm_start_examples", "warm_start_learning_rate", "warm_start_epochs", "warm_start_batch_size",
    "warm_start_reasoning", "warm_start_reasoning_lines",
)  # fmt: skip
# The profile's fields that --config can set too: recorded as the GRPOConfig has them, so --config cannot bypass them
CONFIG_VALUE_FIELDS = frozenset({
    "num_generations", "per_device_train_batch_size", "gradient_accumulation_steps", "max_completion_length",
    "mask_truncated_completions", "temperature", "beta", "learning_rate", "lr_scheduler_type", "warmup_steps",
    "max_grad_norm", "scale_rewards", "max_steps",
})  # fmt: skip
# GRPOConfig fields no profile has that change what a step computes (the loss, sampling, the optimiser, the order of
# the data), recorded as ``config.<name>``. Precision is left out: a run resumed on another machine may change it.
CONFIG_SETTING_FIELDS = (
    "loss_type", "seed", "data_seed", "shuffle_dataset", "reward_weights", "epsilon", "epsilon_high", "delta",
    "num_iterations", "importance_sampling_level", "top_entropy_quantile", "off_policy_mask_threshold", "top_p",
    "top_k", "min_p", "repetition_penalty", "generation_kwargs", "weight_decay", "optim", "adam_beta1", "adam_beta2",
    "adam_epsilon", "lr_scheduler_kwargs", "sync_ref_model", "ref_model_sync_steps", "ref_model_mixup_alpha",
    "disable_dropout",
)  # fmt: skip
CONFIG_PREFIX = "config."
NOT_COMPARED = frozenset({"train_data_source"})  # said beside a changed fingerprint, never compared itself
# The environment variables that choose a run's data, model and profile: a rebuild command sets them as the run had
COMMAND_ENV_VARS = (GSM8K_DIR_ENV_VAR, MODEL_DIR_ENV_VAR, REHEARSAL_ENV_VAR)
SCRIPT = "scripts/train_grpo.py"


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


def claim(run_dir: Path, settings: dict[str, Any] | None = None, command: list[str] | None = None) -> Path:
    """Make ``run_dir`` (if needed) and mark it as the course's, with the run's ``settings``; return it.

    ``command``: the script's arguments that made the run (``--output-dir`` and ``--resume`` / ``--overwrite`` left
    out), kept with the environment variables that chose its data and model, so ``resume_command`` can say the exact
    command that continues it. An unmarked folder is claimed only when it holds nothing but course entries; a
    damaged marker is written anew only when no earlier run is there whose settings it should have kept.
    """
    check_can_hold_a_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        info = read_marker(run_dir)
    except RunFolderError:
        if earlier_entries(run_dir):  # its settings guard a resume: named, not overwritten
            raise
        info = {}  # no earlier run here to check against: the marker is written anew
    if settings is not None:
        info["settings"] = settings
    if command is not None:
        env = {var: os.environ[var] for var in COMMAND_ENV_VARS if os.environ.get(var)}
        info["command"] = {"args": list(command), "env": env}
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
        raise RunFolderError(f"{path} is damaged ({exc}): delete it and pass --resume again (the run's settings are "
                             "then not checked), pass --overwrite to start the run again, or give a new --output-dir."
                             ) from exc  # fmt: skip
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
    check_can_hold_a_run(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with _flock(run_dir):
        yield


@contextlib.contextmanager
def _flock(run_dir: Path) -> Iterator[None]:
    """The lock itself, on ``run_dir``'s lock file (held again when this process holds it already)."""
    import fcntl  # POSIX only; the course runs on Linux, macOS and Colab

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


def held_while_replaced(folder: Path) -> contextlib.AbstractContextManager[None]:
    """The lock of the run folder that ``folder`` (``final``, ``warm_start/model``) is saved in, where a run has
    worked (its lock file is there): replacing ``folder`` deletes the old one, which a running script may still
    need. Not checked as ``locked`` checks: a learner's file added since the run began must not cost its model."""
    run_dir = folder.parent.parent if folder.parent.name == WARM_START_DIRNAME else folder.parent
    return _flock(run_dir) if (run_dir / LOCK_FILENAME).is_file() else contextlib.nullcontext()


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
    """Move a fully written ``partial`` folder to ``folder``, the old one aside first and deleted only after.

    Only the files a save writes (``MODEL_FILE``, by name) are deleted with the old folder: anything else in it (a
    learner's notes beside the model) moves into the new one, and is named.
    """
    old = folder.with_name(folder.name + ".old")
    for earlier in (old, folder):  # a replace cut short left its old folder aside; then the folder itself
        if earlier.is_dir():
            _move_learners_files(earlier, partial, folder)
    if old.exists():
        _delete_saved_files(old)
    if folder.exists():
        folder.rename(old)
    partial.rename(folder)
    if old.exists():
        _delete_saved_files(old)
    return folder


def _is_saved_file(path: Path) -> bool:
    """A file a model save writes at the top of its folder (``MODEL_FILE``), told by its name."""
    return path.is_file() and not path.is_symlink() and MODEL_FILE.match(path.name) is not None


def _move_learners_files(source: Path, target: Path, shown: Path) -> None:
    """Move what ``source`` holds that no save writes into ``target`` (the folder that becomes ``shown``)."""
    moved = [child for child in sorted(source.iterdir())
             if not _is_saved_file(child) and not os.path.lexists(target / child.name)]  # fmt: skip
    for child in moved:
        child.rename(target / child.name)
    if moved:
        names = ", ".join(child.name + "/" * (target / child.name).is_dir() for child in moved)
        print(f"kept in {shown} (not written by the course): {names}")


def _delete_saved_files(folder: Path) -> None:
    """Delete the files a save wrote in ``folder`` (by name), and ``folder`` once empty; anything else is named."""
    for child in folder.iterdir():
        if _is_saved_file(child):
            child.unlink()
    left = sorted(child.name + "/" * child.is_dir() for child in folder.iterdir())
    if left:
        print(f"kept in {folder} (not written by the course): {', '.join(left)}")
    else:
        folder.rmdir()


@contextlib.contextmanager
def written_aside(folder: Path, what: str, fix: str) -> Iterator[Path]:
    """Give ``folder.partial`` to write into; once written, it replaces ``folder`` (``replace_folder``).

    Under the lock of the run folder it is in (``held_while_replaced``): a running script's model is never replaced.
    A write that fails (a full disk: safetensors' ``SafetensorError`` or an ``OSError``) leaves ``folder`` as it was,
    removes the partial copy, and is an ``OSError`` naming ``what``, the folder, the cause, the room left and ``fix``.
    """
    partial = folder.with_name(folder.name + ".partial")
    with held_while_replaced(folder):
        if partial.is_dir():  # a save cut short by a kill
            _delete_saved_files(partial)
        try:
            yield partial
        except (OSError, SafetensorError) as exc:
            if partial.is_dir():
                _delete_saved_files(partial)
            room = shutil.disk_usage(next(p for p in (folder, *folder.parents) if p.exists())).free / 2**20
            raise OSError(f"{what} could not be written to {folder} ({type(exc).__name__}: {exc}; {room:,.0f} MiB "
                          f"free on that disk). {fix}") from exc  # fmt: skip
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


# --- A whole final model ------------------------------------------------------------------------------------


def final_problem(folder: Path, step: int | None = None) -> str | None:
    """Why ``folder`` does not hold a whole final model of the run's step ``step`` (None: any step), or None.

    Missing or without its ``course_run.json`` (only ``final.partial`` left by a kill), weights cut short, or the
    model of an earlier step (a later save failed: a full disk removes its copy in the making, so nothing else says).
    """
    left = [name for name in (f"{folder.name}.partial", f"{folder.name}.old") if folder.with_name(name).exists()]
    torn = f" (only {', '.join(left)} on disk: its save was cut short by a kill or a full disk)" if left else ""
    if saved_model_kind(folder) is None or not (folder / RUN_INFO_FILENAME).is_file():
        return f"is missing or incomplete{torn}"
    weights = [folder / name for name in WEIGHT_FILES if (folder / name).is_file()]
    problem = safetensors_problem(weights[0]) if weights else None
    if problem:
        return f"holds {weights[0].name} cut short ({problem})"
    saved = _saved_step(folder)
    if step is not None and saved is not None and saved < step:
        cause = torn or " (its save after that step did not finish: a kill or a full disk)"
        return f"holds the model of step {saved}, not of the run's last step {step}{cause}"
    return None


def _saved_step(folder: Path) -> int | None:
    """The step a final model was saved at (its ``course_run.json``), or None when it does not say."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return int(json.loads((folder / RUN_INFO_FILENAME).read_text(encoding="utf-8"))["global_step"])
    return None


# --- Complete checkpoints -----------------------------------------------------------------------------


def checkpoint_problem(checkpoint: Path) -> str | None:
    """Why ``checkpoint`` cannot be resumed from (torn, empty, weights cut short), or None when it is complete.

    A file this user cannot read is named as such (with its fix), not called damaged.
    """
    files = [checkpoint / name for name in (STATE_FILENAME, *WEIGHT_FILES)]
    unreadable = [path.name for path in files if path.is_file() and not os.access(path, os.R_OK)]
    if unreadable:
        return f"{', '.join(unreadable)} cannot be read by this user (permission denied: chmod -R a+r {checkpoint})"
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


def run_settings(profile: Profile, config: Any = None) -> dict[str, Any]:
    """The settings a checkpoint depends on, as JSON writes them: the profile's (``RESUME_SETTING_FIELDS``,
    ``max_steps``), the data's fingerprints, and with ``config`` the ``GRPOConfig``'s: its values of the fields it
    shares with the profile (a ``--config`` must not pass them by) and its own, as ``config.<name>``."""
    settings: dict[str, Any] = {name: getattr(profile, name) for name in (*RESUME_SETTING_FIELDS, "max_steps")}
    if config is not None:
        settings.update({name: _plain(getattr(config, name)) for name in sorted(CONFIG_VALUE_FIELDS)})
        settings.update({CONFIG_PREFIX + name: _plain(getattr(config, name))
                         for name in CONFIG_SETTING_FIELDS if hasattr(config, name)})  # fmt: skip
    folder = os.environ.get(GSM8K_DIR_ENV_VAR, "")
    train = Path(folder, "train.jsonl")
    stamp = (train.stat().st_mtime_ns, train.stat().st_size) if folder and train.is_file() else ()
    settings["train_data"], settings["train_data_source"] = train_data_fingerprint(folder, stamp)
    if profile.problem_list:
        settings["problem_list_file"] = file_fingerprint(problem_list_path(profile.problem_list))
    return json.loads(json.dumps(settings, default=str))


def _plain(value: Any) -> Any:
    """A config value as the profile writes it: ``SchedulerType.LINEAR`` is ``"linear"``."""
    return value.value if isinstance(value, enum.Enum) else value


@functools.lru_cache(maxsize=4)
def train_data_fingerprint(gsm8k_dir: str, stamp: tuple[int, ...]) -> tuple[str, str]:
    """The train split's row count and a hash of its rows (a changed ``train.jsonl`` is another run's data), and
    where it was read from, for a message to name.

    Remembered per ``GSM8K_DIR`` and its file's time and size (``stamp``): the rows are read once a process."""
    train = load_gsm8k("train", verbose=False)
    digest = hashlib.sha256(json.dumps([list(train["question"]), list(train["answer"])]).encode()).hexdigest()[:16]
    source = (train.info.description or "").partition(" from ")[2] or "unknown"
    return f"{len(train)} rows, sha256 {digest}", source


def file_fingerprint(path: Path) -> str:
    """A file's size and the start of its sha256 (``"missing"`` when it is not there): a rewritten file is seen."""
    try:
        data = path.read_bytes()
    except OSError:
        return "missing"
    return f"{len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()[:16]}"


def recorded_settings(run_dir: Path) -> dict[str, Any] | None:
    """The settings the run in ``run_dir`` was made with, or None when none were recorded (notebook 04's runs)."""
    saved = read_marker(run_dir).get("settings")
    return saved if isinstance(saved, dict) else None


def settings_conflicts(run_dir: Path, settings: dict[str, Any]) -> list[str]:
    """``["lora_r: the run used 8, this command asks for 16 (put it back: --set lora_r=8)", ...]``."""
    return resume_conflicts(run_dir, settings)[0]


def resume_conflicts(run_dir: Path, settings: dict[str, Any], step: int | None = None) -> tuple[list[str], list[str]]:
    """What refuses a resume against the settings the marker recorded (each with both values and how to put it
    back), and what is only said.

    ``step``: the checkpoint the resume continues from. A finished run (``step`` at its recorded ``max_steps``) may be
    given any ``max_steps``: a higher one is how it trains further, said with what that does to the learning-rate
    schedule. An unfinished run keeps its ``max_steps``: another would end it elsewhere, on another schedule.
    """
    saved = recorded_settings(run_dir)
    if saved is None:
        return [], []
    changed = {name: (saved[name], value) for name, value in settings.items()
               if name in saved and name not in NOT_COMPARED and saved[name] != value}  # fmt: skip
    notes = []
    if "max_steps" in changed:
        old, new = changed["max_steps"]
        if step is not None and isinstance(old, int) and step >= old:
            del changed["max_steps"]
            if isinstance(new, int) and new > step:
                notes.append(_extension_note(old, new, step, settings.get("lr_scheduler_type")))
    for name in [name for name in changed if name.startswith(CONFIG_PREFIX)]:
        if name.removeprefix(CONFIG_PREFIX) in changed:  # a profile field's change: said once, under its own name
            del changed[name]
    conflicts = [f"{name.removeprefix(CONFIG_PREFIX)}: the run used {old!r}, this command asks for {new!r} "
                 f"({_put_back(name, old, saved)})" for name, (old, new) in changed.items()]  # fmt: skip
    return conflicts, notes


def _extension_note(old: int, new: int, step: int, scheduler: Any) -> str:
    """What training a finished run further does: more steps, and a schedule laid out again over all of them."""
    note = f"the run finished its max_steps={old} at step {step}; it now trains on to max_steps={new}"
    if scheduler in ("constant", "constant_with_warmup"):
        return f"{note} at its constant learning rate."
    return (f"{note}: the {scheduler} learning-rate schedule is laid out again over {new} steps, so from step {step} "
            "the rate is the new schedule's, not the end value the run had reached.")  # fmt: skip


def _put_back(name: str, old: Any, saved: dict[str, Any]) -> str:
    """How to give a resume the run's own value of ``name`` again."""
    if name == "train_data":
        return f"put back the train split the run read ({saved.get('train_data_source', 'its GSM8K_DIR')})"
    if name == "problem_list_file":
        list_file = problem_list_path(saved["problem_list"]) if saved.get("problem_list") else "its problem list"
        return f"put back the {list_file} the run read (git checkout -- data/problem_lists/ for the course's own)"
    field = name.removeprefix(CONFIG_PREFIX)
    assignment = shlex.quote(f"{field}={_command_value(old)}")
    if name.startswith(CONFIG_PREFIX):
        return f"put it back: --config {assignment}"
    return f"put it back: --set {assignment}" + (", and no --config of it" if name in CONFIG_VALUE_FIELDS else "")


def _command_value(value: Any) -> str:
    """A value as ``--set`` / ``--config`` reads it back (``parse_value``): text bare, lists as JSON, else repr."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, separators=(",", ":"))
    return repr(value)


# --- The command that continues a run ------------------------------------------------------------------------


def resume_command(run_dir: Path, profile: Profile | str | None = None, max_steps: int | None = None) -> str:
    """The shell command that continues the run in ``run_dir``, and rebuilds a finished run's torn final model.

    The script's own command when it recorded one (its ``--set`` / ``--config`` and the environment variables that
    chose its data and model), else notebook 04's profile (``profile``, else the folder's ``grpo-<profile>`` name,
    else ``COURSE_PROFILE``) with ``max_steps`` where it is not the profile's.
    """
    with contextlib.suppress(RunFolderError):
        command = read_marker(run_dir).get("command")
        if isinstance(command, dict) and isinstance(command.get("args"), list):
            env = command.get("env") if isinstance(command.get("env"), dict) else {}
            return _shell(env, [str(arg) for arg in command["args"]], run_dir)
    name = profile.name if isinstance(profile, Profile) else profile
    if name is None:
        folder = run_dir.name.removeprefix("grpo-")
        name = folder if run_dir.name.startswith("grpo-") and folder in profile_names() else None
    try:
        chosen = get_profile(name)
    except (ValueError, TypeError):
        chosen = None
    args = ["--profile", chosen.name if chosen else "<profile>"]
    if max_steps is not None and (chosen is None or max_steps != chosen.max_steps):
        args += ["--set", f"max_steps={max_steps}"]
    env = {var: os.environ[var] for var in COMMAND_ENV_VARS if os.environ.get(var)}
    return _shell(env, args, run_dir)


def _shell(env: dict[str, Any], args: list[str], run_dir: Path) -> str:
    """The command as a learner pastes it: variables first, every word quoted where the shell would split it."""
    words = [f"{key}={shlex.quote(str(value))}" for key, value in env.items()]
    words += ["python", SCRIPT, *map(shlex.quote, [*args, "--output-dir", str(run_dir)]), "--resume"]
    return " ".join(words)


def command_args(argv: list[str]) -> list[str]:
    """The script's arguments as ``claim`` records them: without ``--output-dir`` (the folder is named apart),
    ``--resume`` / ``--overwrite`` (a later command continues the run) and ``--vllm-server`` (a server that may be
    gone by then; generating with transformers instead changes no setting a resume compares)."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--output-dir", "--vllm-server"):
            skip = True
        elif arg not in ("--resume", "--overwrite") and not arg.startswith(("--output-dir=", "--vllm-server=")):
            kept.append(arg)
    return kept


# --- Resuming in notebook 04 ----------------------------------------------------------------------------------


def prepare_resume(run_dir: str | Path, max_steps: int, profile: Profile | str | None = None) -> Path | None:
    """Before ``trainer.train(resume_from_checkpoint=get_last_checkpoint(run_dir))``: the checkpoint it will find.

    Torn checkpoints newer than the newest complete one are renamed ``checkpoint-N.torn`` (kept, said aloud), so
    ``get_last_checkpoint`` finds the complete one; a run already at ``max_steps`` is refused (resuming it would
    train one step past the end and replace ``final/``), its final model named when it is not there whole, with the
    command that rebuilds it (``profile``: the run's, for that command); a missing optimizer state is said. Under the
    folder's lock: a checkpoint another run is still writing looks torn, and moving it would lose that run's save.
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
        problem = final_problem(run_dir / FINAL_DIRNAME, step)
        said = (f"The run in {run_dir} is finished ({checkpoint.name}, step {step} of max_steps={max_steps}); its "
                f"{FINAL_DIRNAME}/ {'is kept' if problem is None else problem}. To train further, raise max_steps; "
                "for a new run, start fresh.")  # fmt: skip
        if problem is not None:  # the command last: a full stop after it would be pasted with it
            said += f" Rebuild {FINAL_DIRNAME}/ from {checkpoint.name}: {resume_command(run_dir, profile, max_steps)}"
        raise RunFolderError(said)
    print(f"resuming from {checkpoint} (step {step})")
    note = missing_optimizer_note(checkpoint)
    if note:
        print(note)
    return checkpoint
