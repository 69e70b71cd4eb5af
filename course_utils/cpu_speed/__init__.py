"""The CPU plug-in: the same training, computed faster on a CPU. Imports core only; no module of ours imports it.

``with cpu_speed.enabled(trainer): trainer.train()`` installs the speed-ups on the trainer's model for the length
of the block and puts everything back when it ends, raises or is interrupted: freed memory kept for reuse, each
group sampled with its prompt read once through packed weights, the completion tokens scored only, the logits
kept for the backward, the shared prompt read once and the frozen layers taken from sampling (:data:`PARTS`).
``for_generation(model)`` does the sampling part for evaluation. Training and evaluation functions of the package
take it from their caller (``evaluate_model(..., speedups=cpu_speed)``), so each place it runs is a visible line.
One switch turns it all off (``COURSE_CPU_SPEEDUPS=0``, or a profile's ``cpu_speedups=False``), and it runs only on
the library versions it was tested with (``versions``); elsewhere training is plain TRL. Nothing is patched at
import; :func:`installed` says what is patched right now.

Modules: ``packed_linear``, ``group_generation`` (composed of ``prompt_cache``, ``adapters``, ``lean_decoder``,
``attention``, ``sampling``), ``completion_scoring``, ``shared_prefix``, ``frozen_layers``, ``logit_tiles``,
``cpu_allocator``, ``versions``, ``probe``.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any

from transformers import TrainerCallback
from trl import GRPOTrainer

from course_utils.core.profiles import Profile
from course_utils.core.speedups import ENV_VAR as ENV_VAR  # the one switch, read in core so the estimate reads it too
from course_utils.core.speedups import OFF_VALUES as OFF_VALUES
from course_utils.core.speedups import ON_VALUES as ON_VALUES
from course_utils.core.speedups import env_switch as _env_switch
from course_utils.core.speedups import switched_off_because as _switched_off_because
from course_utils.core.speedups import switched_on as switched_on
from course_utils.cpu_speed import versions
from course_utils.cpu_speed.completion_scoring import completion_tokens_only
from course_utils.cpu_speed.cpu_allocator import freed_memory_reused, release_freed_memory
from course_utils.cpu_speed.frozen_layers import frozen_layers_from_sampling
from course_utils.cpu_speed.group_generation import INSTALLED_FLAG, install, keeping_frozen_packs
from course_utils.cpu_speed.logit_tiles import logit_tiles_kept
from course_utils.cpu_speed.probe import lean_layer_mismatch, probe_key
from course_utils.cpu_speed.shared_prefix import prefix_read_once

PARTS: tuple[str, ...] = (
    "reuse_freed_memory",
    "group_generation",
    "score_completions_only",
    "keep_logit_tiles",
    "score_shared_prefix_once",
    "frozen_layers_from_sampling",
)
# Parts for any trainer; the others change how a GRPOTrainer samples and scores
ANY_TRAINER = ("reuse_freed_memory",)
# Parts that patch the process (a TRL function, the C allocator), not one model: installed once at a time
PROCESS_WIDE = ("reuse_freed_memory", "score_completions_only", "keep_logit_tiles")
# Parts that run the rewritten decoder layer, checked once per model against the model's own (probe)
NEED_PROBE = ("group_generation", "frozen_layers_from_sampling")
# Parts that rewrite the training pass: gradient checkpointing runs it without a cache and again in the backward,
# where they have neither the prompt's cache nor the sampled states they read
NOT_WITH_CHECKPOINTING = ("score_shared_prefix_once", "frozen_layers_from_sampling")

_LEDGER: list[tuple[str, int | None]] = []  # (part, id of its model or None), in the order installed
_EVER: set[str] = set()  # every part installed at some time in this process
_WARNED: set[str] = set()
_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> (probe_key, lean_layer_mismatch's answer)


def installed() -> tuple[str, ...]:
    """What the plug-in has patched in this process right now, part by part (empty after every exit)."""
    return tuple(name for name, _ in _LEDGER)


def ever_installed() -> tuple[str, ...]:
    """Every part the plug-in has installed in this process so far, sorted: () means nothing was ever patched."""
    return tuple(sorted(_EVER))


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, UserWarning, stacklevel=3)


def _device_of(model: Any) -> str:
    parameter = next(iter(model.parameters()), None)
    return "cpu" if parameter is None else parameter.device.type


def _probe(model: Any) -> str | None:
    """:func:`lean_layer_mismatch` for ``model``, computed again whenever what it depends on (:func:`probe_key`:
    its layers, adapters, dtypes, attention) changed since the last time: an adapter added later is checked too."""
    key, known = probe_key(model), _PROBED.get(model)
    if known is None or known[0] != key:
        _PROBED[model] = (key, lean_layer_mismatch(model))
    return _PROBED[model][1]


def _why_off(model: Any, profile: Profile | str | None, parts: Iterable[str]) -> str | None:
    """Why the plug-in stays off for ``model`` (the switch, the device, the versions, the probe), or None."""
    if _env_switch() is False:
        return f"{ENV_VAR}={os.environ[ENV_VAR]}"
    device = _device_of(model)
    if device != "cpu":
        return f"the model is on {device}"
    reason = _switched_off_because(profile)
    if reason:
        return reason
    untested = versions.gate()
    if untested:
        _warn_once(f"CPU speed-ups off, training runs as plain TRL: {untested}.")
        return "untested library versions (see the warning)"
    if set(parts) & set(NEED_PROBE):
        mismatch = _probe(model)
        if mismatch:
            _warn_once(f"CPU speed-ups off for {type(model).__name__}, which runs as plain TRL: {mismatch}")
            return f"the rewritten decoder layer does not match the model's ({mismatch})"
    return None


@contextmanager
def _recorded(name: str, model: Any, context: AbstractContextManager) -> Iterator[Any]:
    """``context``, with ``name`` in the ledger (:func:`installed`) from its enter to its exit."""
    entry = (name, None if model is None else id(model))
    with context as value:
        _LEDGER.append(entry)
        _EVER.add(name)
        try:
            yield value
        finally:
            _LEDGER.remove(entry)


class _ReleaseFreedMemoryEachStep(TrainerCallback):
    """Gives the free pages back to the OS after each optimizer step, while freed blocks are kept for reuse."""

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        release_freed_memory()


@contextmanager
def _freed_memory_reused_while(trainer: Any) -> Iterator[None]:
    callback = _ReleaseFreedMemoryEachStep()
    with freed_memory_reused():
        trainer.add_callback(callback)
        try:
            yield
        finally:
            trainer.remove_callback(callback)


@contextmanager
def _group_generation(model: Any) -> Iterator[None]:
    with install(model), keeping_frozen_packs(model):
        yield


# part -> its context, given the trainer and its model
_CONTEXTS: dict[str, Callable[[Any, Any], AbstractContextManager]] = {
    "reuse_freed_memory": lambda trainer, model: _freed_memory_reused_while(trainer),
    "group_generation": lambda trainer, model: _group_generation(model),
    "score_completions_only": lambda trainer, model: completion_tokens_only(),
    "keep_logit_tiles": lambda trainer, model: logit_tiles_kept(),
    "score_shared_prefix_once": lambda trainer, model: prefix_read_once(model),
    "frozen_layers_from_sampling": lambda trainer, model: frozen_layers_from_sampling(model),
}


def _gradient_checkpointing(trainer: Any, model: Any) -> bool:
    """Whether the trainer runs with gradient checkpointing (``args.gradient_checkpointing``, on by default in
    TRL's ``GRPOConfig``), or a module of the model has it switched on already (as transformers itself asks)."""
    if getattr(getattr(trainer, "args", None), "gradient_checkpointing", False):
        return True
    return any(getattr(module, "gradient_checkpointing", False) is True for module in model.modules())


def _checkpointing_note(left_out: list[str]) -> str:
    """What the printed line says of the parts left out under gradient checkpointing (empty when none was)."""
    if not left_out:
        return ""
    return (
        f"{', '.join(left_out)} left out: they rewrite the training pass, which gradient checkpointing runs without "
        "a cache and again in the backward; GRPOConfig(gradient_checkpointing=False) runs them"
    )


def _checked_parts(parts: Iterable[str] | None) -> tuple[str, ...]:
    if parts is None:
        return PARTS
    chosen = (parts,) if isinstance(parts, str) else tuple(parts)
    unknown = [name for name in chosen if name not in PARTS]
    if unknown:
        raise ValueError(f"Unknown CPU speed-up part(s) {unknown}; choose from {', '.join(PARTS)}.")
    return tuple(name for name in PARTS if name in chosen)  # installed in PARTS's order, each once


def _report_address() -> str:
    """Where a learner reports a plug-in failure: the course repository's issues, from the installed metadata."""
    try:
        urls = importlib.metadata.metadata("grpo-course").get_all("Project-URL") or []
    except importlib.metadata.PackageNotFoundError:
        urls = []
    repository = next((url.split(",", 1)[1].strip() for url in urls if url.startswith("Repository,")), None)
    return f"{repository}/issues" if repository else "the course repository's issues"


def failed_install_line(part: str, model: Any, error: BaseException) -> str:
    """The one line a part that failed to install prints: which part, why, that plain TRL runs, how to report it."""
    found = ", ".join(f"{name} {found or 'missing'}" for name, found in versions.installed_versions().items())
    return (
        f"CPU speed-ups: off, training runs as plain TRL: the part {part} failed to install on "
        f"{type(model).__name__} ({type(error).__name__}: {error}). Please report this line and your versions "
        f"({found}) at {_report_address()}; {ENV_VAR}=0 silences it."
    )


def _is_grpo_trainer(trainer: Any) -> bool:
    return isinstance(trainer, GRPOTrainer)


class SpeedUps:
    """The plug-in on one trainer: a context manager and a handle (:meth:`remove`). See :func:`enabled`."""

    def __init__(self, trainer: Any, parts: Iterable[str] | None = None, profile: Profile | str | None = None):
        self.trainer, self.requested, self.profile = trainer, _checked_parts(parts), profile
        self.active: tuple[str, ...] = ()
        self._stack: ExitStack | None = None
        self._depth = 0  # enters not yet exited: the outermost exit puts everything back

    def _wanted(self, model: Any) -> list[str]:
        """The requested parts this trainer takes that are not installed already (on its model, or process-wide)."""
        grpo = _is_grpo_trainer(self.trainer)
        there = {name for name, owner in _LEDGER if owner in (None, id(model))}
        return [name for name in self.requested if (grpo or name in ANY_TRAINER) and name not in there]

    def __enter__(self) -> SpeedUps:
        self._depth += 1
        if self._stack is not None:  # entered already: nothing installed twice
            return self
        model = self.trainer.model
        self._stack = ExitStack()
        wanted = self._wanted(model)
        checkpointed = _gradient_checkpointing(self.trainer, model)
        left_out = [name for name in wanted if checkpointed and name in NOT_WITH_CHECKPOINTING]
        wanted, note = [name for name in wanted if name not in left_out], _checkpointing_note(left_out)
        reason = _why_off(model, self.profile, wanted)
        if reason or not wanted:
            print(f"CPU speed-ups: off ({reason or note or 'already installed'}); training runs as plain TRL.")
            return self
        active = []
        try:
            for name in wanted:
                owner = None if name in PROCESS_WIDE else model
                try:
                    self._stack.enter_context(_recorded(name, owner, _CONTEXTS[name](self.trainer, model)))
                except Exception as error:  # a part that cannot install: the whole plug-in off, said in one line
                    self.remove()
                    print(failed_install_line(name, model, error))
                    return self
                active.append(name)
        except BaseException:
            self.remove()
            raise
        self.active = tuple(active)
        said = f"; {note}" if note else ""
        print(f"CPU speed-ups: on ({', '.join(self.active)}){said}; {ENV_VAR}=0 turns them off (appendix notebook 99).")
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._depth = max(self._depth - 1, 0)
        if not self._depth:
            self.remove()

    def remove(self) -> None:
        """Put back everything installed (safe to call more than once, and before or without entering)."""
        stack, self._stack, self.active, self._depth = self._stack, None, (), 0
        if stack is not None:
            stack.close()


def enabled(trainer: Any, parts: Iterable[str] | None = None, *, profile: Profile | str | None = None) -> SpeedUps:
    """The CPU speed-ups on ``trainer`` (its model already wrapped in its adapters) while the block runs.

    ``with cpu_speed.enabled(trainer): trainer.train()``, or ``h = enabled(trainer); h.__enter__()`` ...
    ``h.remove()``. On enter the parts (all :data:`PARTS`, or those named in ``parts``) are installed on
    ``trainer.model``; on exit or :meth:`SpeedUps.remove` everything is put back, whether training ended, raised
    or was interrupted. A trainer other than a ``GRPOTrainer`` gets only ``reuse_freed_memory``. When the switch
    is off (:func:`switched_on`, ``profile`` else ``COURSE_PROFILE``'s), the model is not on the CPU, the
    library versions are untested or the decoder-layer probe finds a mismatch, it is a no-op that prints why in
    one line (``SpeedUps.active`` is then empty). A part that fails to install takes the others out with it:
    plain TRL runs, and one line (:func:`failed_install_line`) names the part, the error and where to report it.
    """
    return SpeedUps(trainer, parts, profile)


@contextmanager
def for_generation(model: Any, *, profile: Profile | str | None = None) -> Iterator[None]:
    """Inside: ``model.generate`` samples as in training (``group_generation.install``), its frozen layers' packs
    kept between calls; everything restored on exit. For evaluation outside training. A no-op when the switch is
    off, the model is not on the CPU, the versions are untested or the probe finds a mismatch, and inside a block
    that installed it already; where it fails to install, generation is plain and one line says why."""
    if getattr(model, INSTALLED_FLAG, False) or _why_off(model, profile, ["group_generation"]):
        yield
        return
    stack = ExitStack()
    try:
        stack.enter_context(_recorded("for_generation", model, _group_generation(model)))
    except Exception as error:  # generation runs as plain transformers, said in one line
        print(failed_install_line("group_generation", model, error))
    with stack:
        yield
