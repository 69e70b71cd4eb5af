"""Packed linear layers compute what ``nn.Linear`` computes, on both precision paths, and leave the model as it was."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from course_utils.core.hardware import cpu_model_name
from course_utils.cpu_speed import packed_linear as pl
from course_utils.lesson.models import build_tiny_random_model

DTYPES = [torch.float32, torch.bfloat16]
KERNEL_CACHE_PATH = pl.kernel_cache_path  # the real one: the fixture below stands in for it in every test


@pytest.fixture(autouse=True)
def kernel_cache(tmp_path, monkeypatch):
    """Every test measures for itself: its own cache file, and nothing remembered from an earlier test."""
    path = tmp_path / pl.KERNEL_CACHE_FILE
    monkeypatch.setattr(pl, "kernel_cache_path", lambda: path)
    monkeypatch.setattr(pl, "_MEASURED", {})
    return path


def measuring_fails(*args, **kwargs):
    raise AssertionError("measured again, where the saved choice should have been used")


def linear(dtype: torch.dtype, bias: bool = True, shape: tuple[int, int] = (48, 32)) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(shape[1], shape[0], bias=bias).to(dtype)


@pytest.mark.parametrize(
    ("kernel", "dtype"),
    [(kernel, dtype) for kernel in pl.KERNELS for dtype in DTYPES if (kernel, dtype) != ("mkl", torch.bfloat16)],
)  # MKL has no bf16 product
@pytest.mark.parametrize("rows", [3, 7])  # packed for 3 rows: 3 rows (decoding) and 7 rows (a prompt) both right
def test_every_kernel_computes_the_linear_product(kernel, dtype, rows):
    layer, x = linear(dtype), torch.randn(rows, 32).to(dtype)
    try:
        product = pl.pack(kernel, layer, rows=3)
        got = product(x)
    except RuntimeError as error:  # e.g. oneDNN's bf16 kernels need AVX-512 on some builds
        pytest.skip(f"{kernel} does not run {dtype} on this machine: {error}")
    assert pl._same_product(got, F.linear(x, layer.weight, layer.bias))


def test_an_unknown_kernel_is_refused_with_the_valid_names():
    with pytest.raises(ValueError, match="linear, mkl, mkldnn"):
        pl.pack("blas", linear(torch.float32), rows=2)


def test_a_different_product_is_not_the_same():
    reference = torch.randn(4, 8)
    assert pl._same_product(reference + 1e-7, reference)
    assert not pl._same_product(reference + 0.1, reference)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_chosen_kernel_is_one_that_ran_and_agreed_and_is_remembered(dtype):
    layers = [linear(dtype, shape=(40, 24)) for _ in range(3)]
    chosen = pl.fastest_kernels(layers, rows=5)
    assert set(chosen) == {((40, 24), dtype)}
    kernel = chosen[(40, 24), dtype]
    assert pl._seconds_for_one_pass(kernel, layers, rows=5) is not None
    assert pl.fastest_kernels(layers, rows=5) == chosen  # measured once per process


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_model_computes_the_same_logits_packed_and_is_restored_after(dtype):
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2).to(dtype).eval()
    ids = torch.randint(1, 128, (4, 6))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        with pl.packed_linears(model, rows=4) as chosen:
            assert chosen, "the tiny model has linear layers to pack"
            packed = model(input_ids=ids).logits
        after = model(input_ids=ids).logits
    assert pl._same_product(packed, expected)
    assert torch.equal(after, expected)
    assert not any("forward" in vars(layer) for layer in pl.packable_layers(model))


def test_the_forwards_are_restored_when_generation_fails():
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2).eval()
    with torch.no_grad(), pytest.raises(KeyError), pl.packed_linears(model, rows=2):
        raise KeyError("a failure inside generate")
    assert not any("forward" in vars(layer) for layer in pl.packable_layers(model))


def test_packing_needs_no_grad_and_a_positive_row_count():
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=1)
    with pytest.raises(RuntimeError, match=r"torch\.no_grad"), pl.packed_linears(model, rows=2):
        pass
    with torch.no_grad(), pytest.raises(ValueError, match="rows must be at least 1"), pl.packed_linears(model, 0):
        pass


def test_only_plain_cpu_float_layers_are_packed():
    model = torch.nn.Sequential(linear(torch.float32), linear(torch.float16), torch.nn.Embedding(4, 4))
    assert pl.packable_layers(model) == [model[0]]


def test_the_kernels_are_described_by_shape():
    chosen = {((576, 576), torch.float32): "mkl", ((49152, 576), torch.float32): "mkldnn"}
    assert pl.describe_kernels(chosen) == "mkl: 576x576 (float32); mkldnn: 49152x576 (float32)"


def test_skipped_layers_are_left_as_they_are(monkeypatch):
    model = torch.nn.Sequential(linear(torch.float32), linear(torch.float32, shape=(32, 48)))
    for shape in ((48, 32), (32, 48)):  # a packed kernel for both, so a packed layer gets a forward of its own
        monkeypatch.setitem(pl._MEASURED, (shape, torch.float32, 2), "mkldnn")
    with torch.no_grad(), pl.packed_linears(model, rows=2, skip=[model[1]]):
        assert "forward" in vars(model[0]) and "forward" not in vars(model[1])


def test_a_choice_is_saved_for_this_machine_and_read_by_the_next_process(kernel_cache, monkeypatch):
    layers = [linear(torch.float32, shape=(40, 24)) for _ in range(2)]
    chosen = pl.fastest_kernels(layers, rows=3)
    saved = json.loads(kernel_cache.read_text())
    assert saved == {pl.machine_key(): {"40x24 float32 3 rows": chosen[(40, 24), torch.float32]}}
    monkeypatch.setattr(pl, "_MEASURED", {})  # a new process
    monkeypatch.setattr(pl, "_seconds_for_one_pass", measuring_fails)
    assert pl.fastest_kernels(layers, rows=3) == chosen


def test_another_machine_or_row_count_is_measured_again(kernel_cache, monkeypatch):
    layers = [linear(torch.float32, shape=(40, 24))]
    pl.fastest_kernels(layers, rows=3)
    monkeypatch.setattr(pl, "_MEASURED", {})
    other = "another CPU | AVX2 | torch 2.13.0 | 2 threads"
    monkeypatch.setattr(pl, "machine_key", lambda: other)
    pl.fastest_kernels(layers, rows=3)
    pl.fastest_kernels(layers, rows=5)
    saved = json.loads(kernel_cache.read_text())
    assert set(saved[other]) == {"40x24 float32 3 rows", "40x24 float32 5 rows"}
    assert len(saved) == 2, "the first machine's choice is kept"


@pytest.mark.parametrize("content", ["not json {", "[1, 2]", '{"machine": "mkl"}'])
def test_an_unreadable_cache_is_reported_measured_again_and_rewritten(kernel_cache, content, capsys):
    kernel_cache.write_text(content)
    chosen = pl.fastest_kernels([linear(torch.float32, shape=(40, 24))], rows=3)
    assert "is not readable" in capsys.readouterr().out
    kernel = chosen[(40, 24), torch.float32]
    assert json.loads(kernel_cache.read_text()) == {pl.machine_key(): {"40x24 float32 3 rows": kernel}}


def test_a_saved_kernel_this_torch_does_not_have_is_measured_again(kernel_cache):
    kernel_cache.write_text(json.dumps({pl.machine_key(): {"40x24 float32 3 rows": "blas"}}))
    chosen = pl.fastest_kernels([linear(torch.float32, shape=(40, 24))], rows=3)
    assert chosen[(40, 24), torch.float32] in pl.KERNELS
    assert json.loads(kernel_cache.read_text())[pl.machine_key()]["40x24 float32 3 rows"] in pl.KERNELS


def test_the_machine_key_names_the_cpu_kernels_torch_threads_and_candidates(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    key = pl.machine_key()
    assert cpu_model_name() in key and "ATEN_CPU_CAPABILITY=avx2" in key
    assert torch.__version__ in key and f"{torch.get_num_threads()} threads" in key
    monkeypatch.setattr(pl, "KERNELS", ("linear", "mkldnn"))
    assert pl.machine_key() != key, "a choice made among other candidates is not reused"


def test_kept_packs_are_reused_until_the_weight_or_the_rows_change():
    layer, x = linear(torch.float32), torch.randn(3, 32)
    layer.weight.requires_grad_(False)
    kept = pl.KeptPacks()
    first = kept.product("mkldnn", layer, rows=3)
    assert kept.product("mkldnn", layer, rows=3) is first and len(kept) == 1
    assert kept.product("mkldnn", layer, rows=5) is not first, "another row count is packed again"
    current = kept.product("mkldnn", layer, rows=3)
    with torch.no_grad():
        layer.weight.mul_(2.0)  # written in place: the version counter moves
    doubled = kept.product("mkldnn", layer, rows=3)
    assert doubled is not current
    assert pl._same_product(doubled(x), F.linear(x, layer.weight, layer.bias))
    layer.weight = torch.nn.Parameter(torch.randn(48, 32), requires_grad=False)  # another tensor
    replaced = kept.product("mkldnn", layer, rows=3)
    assert replaced is not doubled and pl._same_product(replaced(x), F.linear(x, layer.weight, layer.bias))
    kept.clear()
    assert len(kept) == 0


def test_only_frozen_layers_keep_their_packs():
    trained, frozen = linear(torch.float32), linear(torch.float32)
    frozen.weight.requires_grad_(False)
    assert pl.KeptPacks.keeps(frozen) and not pl.KeptPacks.keeps(trained)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_model_computes_the_same_logits_with_kept_packs(dtype, monkeypatch):
    """Each layer through a kernel that runs here (oneDNN's bf16 kernels need native bf16 on some builds)."""
    layer = linear(dtype)
    kernel = next(k for k in ("mkldnn", "mkl", "linear") if pl._seconds_for_one_pass(k, [layer], rows=4) is not None)
    monkeypatch.setattr(pl, "fastest_kernels", lambda layers, rows: {
        (tuple(layer.weight.shape), layer.weight.dtype): kernel for layer in layers
    })
    model = build_tiny_random_model(vocab_size=128, hidden_size=32, num_layers=2).to(dtype).eval()
    model.requires_grad_(False)
    ids = torch.randint(1, 128, (4, 6))
    kept = pl.KeptPacks()
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        for _ in range(2):
            with pl.packed_linears(model, rows=4, keep=kept):
                packed = model(input_ids=ids).logits
            assert pl._same_product(packed, expected)
    assert len(kept) == (0 if kernel == "linear" else len(pl.packable_layers(model)))


def test_the_convolution_kernel_keeps_the_shape_of_any_input():
    layer = linear(torch.float32)
    try:
        product = pl.pack("mkldnn_conv", layer, rows=3)
    except RuntimeError as error:
        pytest.skip(f"oneDNN's convolution does not run here: {error}")
    for x in (torch.randn(3, 1, 32), torch.randn(2, 5, 32), torch.randn(8, 64)[:, ::2], torch.randn(1, 32)):
        got = product(x)
        assert got.shape == (*x.shape[:-1], 48)
        assert pl._same_product(got, F.linear(x, layer.weight, layer.bias))


def test_the_kernel_cache_file_follows_its_variable_and_the_tests_keep_their_own(private_kernel_cache, monkeypatch):
    assert KERNEL_CACHE_PATH() == private_kernel_cache, "the test session's own file (conftest)"
    monkeypatch.delenv(pl.KERNEL_CACHE_ENV_VAR)
    assert KERNEL_CACHE_PATH() == pl.cache_dir() / pl.KERNEL_CACHE_FILE
    assert pl.cache_dir() not in private_kernel_cache.parents
