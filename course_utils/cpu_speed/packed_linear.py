"""Linear layers packed for decoding on a CPU: the same products, with the weights read faster.

Each new token multiplies a few rows (one per completion) by every weight matrix of the model, so a decoding
step is bound by how fast the weights stream from memory. torch's default product (``F.linear``) lays the
weight out again on every call; oneDNN and MKL can reorder a weight once into the layout their kernels read
best ("packing", as inductor's freezing does), and then reuse it at every token of a ``generate`` call.

oneDNN offers two packed products: its linear layer, and the same product as a 1x1 convolution over the rows
(``mkldnn_conv``), whose kernel reads the weight in blocks of 24 outputs. Which kernel streams fastest depends
on the machine and the weight's shape (MKL on one CPU, either of oneDNN's or plain ``F.linear`` on another), so
:func:`fastest_kernels` measures the candidates on the model's own weights, and keeps a candidate only if its
output equals ``F.linear``'s (``make bench`` prints the choices as ``generate_linear_kernels``). The choices
are kept in the course's cache folder, per machine (CPU, kernels, torch, threads), so each notebook does not
measure again.

Packing takes time too (oneDNN's or MKL's reorder of the 113 MB output head is most of it). During a LoRA training
run the base weights never change, so :class:`KeptPacks` keeps their packed copies from one ``generate`` call to the
next, and only the weights that do change are packed again.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from course_utils.core.hardware import cpu_model_name, kernel_limits
from course_utils.core.paths import cache_dir

KERNELS = ("linear", "mkl", "mkldnn", "mkldnn_conv")
PACKED_DTYPES = (torch.float32, torch.bfloat16)
KERNEL_CACHE_FILE = "packed_kernels.json"
KERNEL_CACHE_ENV_VAR = "COURSE_KERNEL_CACHE"  # a file to keep the choices in instead (the tests use their own)
# (weight shape, dtype, rows) -> the kernel measured fastest in this process
_MEASURED: dict[tuple[tuple[int, ...], torch.dtype, int], str] = {}

Product = Callable[[torch.Tensor], torch.Tensor]


class StackedLinear:
    """Linear layers that read the same input, as one product: their weights (and biases) stacked by rows.

    A decoding step's products are small, so each call costs more than its arithmetic; ``q``, ``k`` and ``v``
    (or ``gate`` and ``up``) as one product are one call, and the outputs split back in :attr:`sizes`.
    """

    def __init__(self, layers: list[torch.nn.Linear]) -> None:
        if not layers or len({(layer.in_features, layer.weight.dtype) for layer in layers}) != 1:
            raise ValueError("StackedLinear needs one or more linear layers of one input size and dtype")
        biases = [layer.bias for layer in layers]
        self.weight = torch.cat([layer.weight.detach() for layer in layers])
        self.bias = None
        if any(bias is not None for bias in biases):
            zeros = [layer.weight.new_zeros(layer.out_features) for layer in layers]
            self.bias = torch.cat([z if b is None else b.detach() for z, b in zip(zeros, biases, strict=True)])
        self.in_features = layers[0].in_features
        self.sizes = [layer.out_features for layer in layers]


def pack(kernel: str, layer: torch.nn.Linear, rows: int) -> Product:
    """``layer``'s product ``x -> x @ W.T + b`` through ``kernel``, its weight packed for inputs of ``rows`` rows.

    Inputs of another number of rows still get the right result (the packed kernels fall back on their own).
    """
    weight, bias = layer.weight.detach(), None if layer.bias is None else layer.bias.detach()
    if kernel == "linear":
        return lambda x: F.linear(x, weight, bias)
    if kernel == "mkl":
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
        return lambda x: torch.ops.mkl._mkl_linear(x, packed, weight, bias, rows)
    if kernel == "mkldnn":
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
        return lambda x: torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    if kernel == "mkldnn_conv":
        # oneDNN lays an image of another size out again at every call: those go to F.linear on the weight itself
        return partial(_rows_as_pixels_or_linear, _conv_pack(weight, rows), weight, bias, rows)
    raise ValueError(f"Unknown kernel {kernel!r}; choose one of {', '.join(KERNELS)}.")


def _conv_pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """``weight`` laid out for oneDNN's 1x1 convolution over an image of ``rows`` pixels (one per row)."""
    size = [1, weight.shape[1], rows, 1]
    return torch.ops.mkldnn._reorder_convolution_weight(weight[:, :, None, None], [0, 0], [1, 1], [1, 1], 1, size)


def _rows_of(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def _rows_as_pixels_or_linear(
    packed: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int, x: torch.Tensor
) -> torch.Tensor:
    return _rows_as_pixels(packed, bias, x) if _rows_of(x) == rows else F.linear(x, weight, bias)


def _only_rows(product: Product, rows: int, kernel: str) -> Product:
    """``product`` for inputs of exactly ``rows`` rows; other inputs get a clear error, not a wrong result."""

    def checked(x: torch.Tensor) -> torch.Tensor:
        if _rows_of(x) != rows:
            raise ValueError(
                f"This stacked {kernel} product is packed for {rows} rows, got {_rows_of(x)}: it keeps no weight to "
                f"compute other row counts with; use it only for inputs of {rows} rows (or another kernel)."
            )
        return product(x)

    return checked


def _rows_as_pixels(packed: torch.Tensor, bias: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """``x @ W.T + b`` as oneDNN's 1x1 convolution: the rows of ``x`` are the pixels of a one-column image whose
    channels are the input features, laid out channels-last, so neither the input nor the output is copied."""
    rows = x.reshape(-1, x.shape[-1])
    image = rows.view(1, rows.shape[0], 1, rows.shape[1]).permute(0, 3, 1, 2)
    out = torch.ops.mkldnn._convolution_pointwise(image, packed, bias, [0, 0], [1, 1], [1, 1], 1, "none", [], "")
    return out.permute(0, 2, 3, 1).reshape(*x.shape[:-1], out.shape[1])


# kernels whose stacked product computes only the rows it is packed for (pack_stacked keeps no stacked weight)
ROWS_ONLY_WHEN_STACKED = ("mkl", "mkldnn_conv")


def pack_stacked(kernel: str, stacked: StackedLinear, rows: int) -> Product:
    """``stacked``'s product through ``kernel``, packed for inputs of ``rows`` rows.

    The packed kernels keep no stacked copy of the weights besides their pack. MKL and the 1x1 convolution need
    the plain weight for inputs of another row count, so their stacked products take exactly ``rows`` rows
    (``ROWS_ONLY_WHEN_STACKED``; other inputs raise); oneDNN's linear layer and ``F.linear`` take any.
    """
    if kernel == "mkl":
        packed = torch.ops.mkl._mkl_reorder_linear_weight(stacked.weight, rows)
        stand_in, bias = stacked.weight.new_zeros(()).expand(stacked.weight.shape), stacked.bias
        return _only_rows(lambda x: torch.ops.mkl._mkl_linear(x, packed, stand_in, bias, rows), rows, kernel)
    if kernel == "mkldnn_conv":
        return _only_rows(partial(_rows_as_pixels, _conv_pack(stacked.weight, rows), stacked.bias), rows, kernel)
    return pack(kernel, stacked, rows)


def packable_layers(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The model's plain ``nn.Linear`` layers on the CPU in fp32 or bf16 (not a quantized or GPU layer)."""
    return [
        module
        for module in model.modules()
        if type(module) is torch.nn.Linear
        and module.weight.device.type == "cpu"
        and module.weight.dtype in PACKED_DTYPES
    ]


def _same_product(candidate: torch.Tensor, reference: torch.Tensor) -> bool:
    """Equal up to the rounding of a different summation order (looser for bf16's 7-bit mantissa)."""
    tolerance = 1e-4 if reference.dtype == torch.float32 else 2e-2
    scale = reference.float().abs().max().clamp(min=1.0)
    return bool(((candidate.float() - reference.float()).abs().max() <= tolerance * scale).item())


def _seconds_for_one_pass(kernel: str, layers: list[torch.nn.Linear], rows: int, passes: int = 3) -> float | None:
    """Seconds to run every layer once on ``rows`` rows through ``kernel`` (best of ``passes``).

    None if the kernel fails here or its product differs from ``F.linear``'s.
    """
    x = torch.randn(rows, layers[0].in_features, dtype=layers[0].weight.dtype)
    try:
        products = [pack(kernel, layer, rows) for layer in layers]
        for product, layer in zip(products, layers, strict=True):
            if not _same_product(product(x), F.linear(x, layer.weight, layer.bias)):
                return None
    except (RuntimeError, AttributeError, NotImplementedError):  # kernel not built into this torch
        return None
    seconds = []
    for _ in range(passes):
        started = time.perf_counter()
        for product in products:
            product(x)
        seconds.append(time.perf_counter() - started)
    return min(seconds)


def kernel_cache_path() -> Path:
    """Where the measured choices are kept, for every process on this machine: the course's cache folder, or the
    file ``COURSE_KERNEL_CACHE`` names (the tests name one of their own, so they never write the learner's)."""
    chosen = os.environ.get(KERNEL_CACHE_ENV_VAR)
    return Path(chosen) if chosen else cache_dir() / KERNEL_CACHE_FILE


def machine_key() -> str:
    """What a measured choice depends on besides the weight: CPU, kernel caps, torch build, thread count, and the
    candidates measured (a choice made among fewer candidates is measured again)."""
    return (
        f"{cpu_model_name()} | {torch.backends.cpu.get_cpu_capability()} | kernel limits: {kernel_limits()} | "
        f"torch {torch.__version__} | {torch.get_num_threads()} threads | candidates: {', '.join(KERNELS)}"
    )


def _entry(shape: tuple[int, ...], dtype: torch.dtype, rows: int) -> str:
    return f"{'x'.join(map(str, shape))} {str(dtype).removeprefix('torch.')} {rows} rows"


def _read_kernel_cache(path: Path) -> dict[str, dict[str, str]]:
    """The cache file's choices; an unreadable file is reported and measured again (then rewritten)."""
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text())
        if not isinstance(saved, dict) or not all(isinstance(v, dict) for v in saved.values()):
            raise ValueError("expected {machine: {weight: kernel}}")
    except (OSError, ValueError) as error:
        print(f"Packed kernels: {path} is not readable ({error}); measuring again and rewriting it.")
        return {}
    return saved


def _remember(path: Path, saved: dict[str, dict[str, str]], measured: dict[str, str]) -> None:
    """Write ``saved`` (the file as read) with this machine's ``measured`` choices added."""
    saved[machine_key()] = {**saved.get(machine_key(), {}), **measured}
    partial = path.with_name(f".{path.name}.{os.getpid()}")  # written whole, then renamed: two kernels at once
    try:  # (two notebooks, or both copies in make test) never read each other's half-written file
        partial.write_text(json.dumps(saved, indent=1, sort_keys=True))
        os.replace(partial, path)
    except OSError as error:
        print(f"Packed kernels: could not save the choices to {path} ({error}); each process will measure again.")


def fastest_kernels(
    layers: list[torch.nn.Linear], rows: int, cache: Path | None = None
) -> dict[tuple[tuple[int, ...], torch.dtype], str]:
    """For each (weight shape, dtype) among ``layers``, the kernel that ran all those layers fastest here.

    Timed on the layers themselves (so the weights stream from memory as in decoding), once per machine: the
    choice is kept in this process and in ``cache`` (default :func:`kernel_cache_path`) under :func:`machine_key`.
    A saved kernel this torch does not have is measured again.
    """
    by_shape: dict[tuple[tuple[int, ...], torch.dtype], list[torch.nn.Linear]] = {}
    for layer in layers:
        by_shape.setdefault((tuple(layer.weight.shape), layer.weight.dtype), []).append(layer)
    missing = [key for key in by_shape if (*key, rows) not in _MEASURED]
    if missing:
        path = kernel_cache_path() if cache is None else Path(cache)
        every_machine = _read_kernel_cache(path)
        saved, measured = every_machine.get(machine_key(), {}), {}
        with torch.no_grad():
            for shape, dtype in missing:
                kernel = saved.get(_entry(shape, dtype, rows))
                if kernel not in KERNELS:
                    seconds = {k: _seconds_for_one_pass(k, by_shape[shape, dtype], rows) for k in KERNELS}
                    timed = {k: s for k, s in seconds.items() if s is not None}
                    kernel = measured[_entry(shape, dtype, rows)] = min(timed, key=timed.get)
                _MEASURED[shape, dtype, rows] = kernel
        if measured:
            _remember(path, every_machine, measured)
    return {key: _MEASURED[key[0], key[1], rows] for key in by_shape}


def stacked_kernels(groups: list[list[torch.nn.Linear]], rows: int) -> list[str]:
    """The fastest kernel for each group's stacked product (:func:`fastest_kernels`, measured on all the
    stacks of a shape together); stacked copies are made only for shapes not measured yet on this machine."""
    keys = [((sum(m.out_features for m in group), group[0].in_features), group[0].weight.dtype) for group in groups]
    missing = [group for group, key in zip(groups, keys, strict=True) if (*key, rows) not in _MEASURED]
    if missing:
        fastest_kernels([StackedLinear(group) for group in missing], rows)
    return [_MEASURED[shape, dtype, rows] for shape, dtype in keys]


class KeptPacks:
    """Packed products of frozen layers, kept from one ``packed_linears`` call to the next.

    For the length of a LoRA training run, where the optimizer never changes a frozen weight. A kept product is
    packed again if its layer's weight is another tensor, was written in place through autograd's view of it
    (its version counter moved), or is packed for another row count or kernel. Writes through ``weight.data``
    move no counter, which is why packs are kept only while the plug-in owns the model (see
    ``course_utils.cpu_speed.group_generation.keeping_frozen_packs``).
    """

    def __init__(self) -> None:
        self._kept: dict[int, tuple[torch.nn.Linear, torch.Tensor, tuple[int, int, int, str], Product]] = {}
        self._stacks: dict[tuple[int, ...], tuple[list[torch.nn.Linear], tuple[torch.Tensor, ...], tuple, Product]] = {}

    def __len__(self) -> int:
        return len(self._kept) + len(self._stacks)

    def stacked_product(self, kernel: str, layers: list[torch.nn.Linear], rows: int) -> Product:
        """``pack_stacked(kernel, StackedLinear(layers), rows)``, reused while each layer's weight is the same,
        unchanged tensor (frozen layers)."""
        key, weights = tuple(map(id, layers)), tuple(layer.weight for layer in layers)
        stamp = (tuple((w.data_ptr(), w._version) for w in weights), rows, kernel)
        kept = self._stacks.get(key)  # the entry holds the layers, so their ids name no other layers meanwhile
        if kept is None or kept[2] != stamp or any(a is not b for a, b in zip(kept[1], weights, strict=True)):
            kept = (list(layers), weights, stamp, pack_stacked(kernel, StackedLinear(layers), rows))
            self._stacks[key] = kept
        return kept[3]

    @staticmethod
    def keeps(layer: torch.nn.Linear) -> bool:
        """Whether ``layer``'s pack may be kept: its weight is frozen (the optimizer does not change it)."""
        return not layer.weight.requires_grad

    def product(self, kernel: str, layer: torch.nn.Linear, rows: int) -> Product:
        """``pack(kernel, layer, rows)``, reused while the layer's weight is the same, unchanged tensor."""
        weight = layer.weight
        stamp = (weight.data_ptr(), weight._version, rows, kernel)
        kept = self._kept.get(id(layer))  # the entry holds the layer, so its id names no other layer meanwhile
        if kept is None or kept[1] is not weight or kept[2] != stamp:
            kept = (layer, weight, stamp, pack(kernel, layer, rows))
            self._kept[id(layer)] = kept
        return kept[3]

    def clear(self) -> None:
        """Drop every kept product (and the memory its packed weight holds)."""
        self._kept.clear()
        self._stacks.clear()


@contextmanager
def packed_linears(
    model: torch.nn.Module, rows: int, skip: Iterable[torch.nn.Module] = (), keep: KeptPacks | None = None
) -> Iterator[dict[tuple[tuple[int, ...], torch.dtype], str]]:
    """Inside: the model's linear layers compute through their fastest packed kernel for ``rows`` rows.

    The weights are packed on entry, from their values at that moment: use it around one ``generate`` call,
    under ``torch.no_grad()`` (the packed products have no backward pass). Layers in ``skip`` (ones that will
    not run) are left as they are. With ``keep``, frozen layers reuse the packs kept there (:class:`KeptPacks`).
    Yields the kernels chosen.
    """
    if rows < 1:
        raise ValueError(f"rows must be at least 1 (the rows of each decoding step), got {rows}")
    if torch.is_grad_enabled():
        raise RuntimeError("packed_linears is for generation: enter torch.no_grad() first.")
    idle = {id(layer) for layer in skip}
    layers = [layer for layer in packable_layers(model) if id(layer) not in idle]
    chosen = fastest_kernels(layers, rows) if layers else {}
    try:
        for layer in layers:
            kernel = chosen[tuple(layer.weight.shape), layer.weight.dtype]
            if kernel == "linear":
                continue
            kept = keep is not None and keep.keeps(layer)
            layer.forward = keep.product(kernel, layer, rows) if kept else pack(kernel, layer, rows)
        yield chosen
    finally:
        for layer in layers:
            layer.__dict__.pop("forward", None)


def describe_kernels(chosen: dict[tuple[tuple[int, ...], torch.dtype], str]) -> str:
    """One line per kernel: which weight shapes it computes, e.g. ``mkl: 576x576, 1536x576 (float32)``."""
    by_kernel: dict[str, list[str]] = {}
    for (shape, dtype), kernel in sorted(chosen.items(), key=lambda item: item[0][0]):
        by_kernel.setdefault(kernel, []).append(f"{'x'.join(map(str, shape))} ({str(dtype).removeprefix('torch.')})")
    return "; ".join(f"{kernel}: {', '.join(shapes)}" for kernel, shapes in sorted(by_kernel.items()))
