"""Tests of benchmarks/benchmark.py: a fast smoke run, the memory subprocess, and the FLOP count target."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch
from _scripts import load_script
from datasets import ClassLabel, Dataset, Features, Image

REPO = Path(__file__).resolve().parents[1]
BENCHMARK = REPO / "benchmarks" / "benchmark.py"

# Tiny settings shared by the smoke runs: one function iteration, batch 2, one repeat, no warm-up, one
# thread (several threads on a busy 2-core machine are many times slower, not faster, at this size).
TINY = [
    "--threads",
    "1",
    "--batch-size",
    "2",
    "--repeats",
    "1",
    "--warmup",
    "0",
    "--override",
    "num_function_iterations=1",
    "--quiet",
]

MODEL_KEYS = {
    "model",
    "gradient_checkpointing",
    "attn_implementation",
    "parameters",
    "flops",
    "inference",
    "training",
    "achieved_gflops",
    "memory",
}
STATS_KEYS = {
    "images_per_s_median",
    "images_per_s_min",
    "images_per_s_max",
    "images_per_s_q1",
    "images_per_s_q3",
    "images_per_s_iqr",
    "seconds",
}
DENSITY_KEYS = {
    "per_iteration",
    "mean",
    "per_function_mean",
    "functions_per_token_mean",
    "num_functions",
    "num_images",
    "inputs",
    "model",
}


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """benchmarks/benchmark.py imported as a module (benchmarks/ is not a package)."""
    return load_script(BENCHMARK, "ni_benchmark")


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """`--threads 1` sets torch's global thread count: give later tests in this process their own back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _write_parquet(path: Path, num_rows: int, size: int, mode: str) -> None:
    """A tiny Hub-layout Parquet file of random images (Image feature) and labels (ClassLabel)."""
    rng = np.random.default_rng(0)
    shape = (size, size, 3) if mode == "RGB" else (size, size)
    images = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(num_rows)]
    features = Features({"image": Image(), "label": ClassLabel(names=[str(i) for i in range(10)])})
    path.parent.mkdir(parents=True, exist_ok=True)
    Dataset.from_dict(
        {"image": images, "label": [i % 10 for i in range(num_rows)]}, features=features
    ).to_parquet(str(path))


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    """Local digits data laid out as /work/shared/data: mnist (28x28 L) and mnist_m (32x32 RGB)."""
    root = tmp_path / "data"
    for split in ("train", "test"):
        _write_parquet(root / "mnist" / f"{split}.parquet", 3, 28, "L")
        _write_parquet(root / "mnist_m" / f"{split}.parquet", 3, 32, "RGB")
    return root


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """A saved (untrained) digits model with one function iteration."""
    from ni_hf import NeuralInterpreterConfig, NeuralInterpreterForImageClassification

    path = tmp_path / "checkpoint"
    config = NeuralInterpreterConfig.from_paper("digits", num_function_iterations=1)
    NeuralInterpreterForImageClassification(config).save_pretrained(path)
    return path


def test_forward_flops_of_digits_preset_within_target(bench: ModuleType) -> None:
    """SPEC.md "Cost": the math needs ~2.15 GFLOP per image; the target is <= 2.2 GFLOP (reference: 3.55)."""
    args = bench.parse_args(["--preset", "digits"])
    flops = bench.forward_flops_per_image(args)
    assert 1.0e9 < flops <= 2.2e9, f"forward FLOPs per image: {flops / 1e9:.3f} G"


def test_smoke_run_writes_all_keys(
    bench: ModuleType, tmp_path: Path, data_dir: Path, checkpoint: Path
) -> None:
    """The full benchmark runs at tiny settings; JSON and Markdown hold every measurement."""
    out_json, out_md = tmp_path / "out.json", tmp_path / "RESULTS.md"
    out_md.write_text("# Results\n")
    bench.main(
        [
            *TINY,
            "--memory",
            "inprocess",
            "--density-samples",
            "4",
            "--data-dir",
            str(data_dir),
            "--checkpoint",
            str(checkpoint),
            "--output-json",
            str(out_json),
            "--append-results",
            str(out_md),
        ]
    )
    report = json.loads(out_json.read_text())
    assert set(report) == {"environment", "settings", "models", "ratios", "checkpointing", "routing_density"}
    env = report["environment"]
    for key in ("date", "cpu", "cpu_count", "torch", "torch_threads", "command", "gpu"):
        assert key in env
    assert "benchmark.py" in env["command"] or "pytest" in env["command"]
    assert set(report["models"]) == {"ni-sdpa", "ni-eager", "vit"}
    for name, result in report["models"].items():
        assert MODEL_KEYS <= set(result), name
        assert result["parameters"]["total"] >= result["parameters"]["trainable"] > 0
        assert result["flops"]["forward_per_image"] > 0
        assert result["flops"]["training_per_image_counted"] > result["flops"]["forward_per_image"]
        for mode in ("inference", "training"):
            assert STATS_KEYS <= set(result[mode]), (name, mode)
            assert result[mode]["images_per_s_median"] > 0
            assert result["achieved_gflops"][mode] > 0
            assert result["memory"][mode]["peak_mib"] >= 0
    assert report["models"]["vit"]["parameters"]["total"] == 1_809_226
    assert report["models"]["ni-sdpa"]["attn_implementation"] == "sdpa"
    assert report["models"]["ni-eager"]["attn_implementation"] == "eager"
    assert all(value is not None for value in report["ratios"].values())
    density = report["routing_density"]
    assert set(density) == {"fresh", "checkpoint"}
    for d in density.values():
        assert DENSITY_KEYS <= set(d)
        assert len(d["per_iteration"]) == 1 and 0.0 <= d["mean"] <= 1.0
        assert d["inputs"].startswith("real images")
        assert d["num_images"] == 4
    text = out_md.read_text()
    assert text.startswith("# Results\n")
    for needle in ("Hardware:", "Command:", "| ni-sdpa |", "| vit |", "Routing density", "Ratios"):
        assert needle in text


def test_compare_checkpointing_and_random_density(bench: ModuleType, tmp_path: Path) -> None:
    """--compare-checkpointing reports speed and memory with and without; density falls back to random patches."""
    report = bench.main(
        [
            *TINY,
            "--models",
            "ni-sdpa",
            "--modes",
            "training",
            "--memory",
            "inprocess",
            "--compare-checkpointing",
        ]
        + ["--density-samples", "3", "--no-training-flop-count"]
    )
    assert set(report["models"]) == {"ni-sdpa", "ni-sdpa+ckpt"}
    assert report["models"]["ni-sdpa+ckpt"]["gradient_checkpointing"] is True
    assert report["models"]["ni-sdpa"]["inference"] is None
    row = report["checkpointing"]["ni-sdpa"]
    for key in ("images_per_s_off", "images_per_s_on", "slowdown_pct", "peak_mib_off", "peak_mib_on"):
        assert row[key] is not None
    assert "memory_reduction_pct" in row
    assert report["ratios"]["gflops_training_ni_sdpa_over_vit"] is None  # no ViT in this run
    assert report["routing_density"]["fresh"]["inputs"].startswith("random patches")


def test_memory_child_subprocess() -> None:
    """`--_measure-memory MODEL MODE` runs in a fresh process and prints one JSON line with the peak."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    result = subprocess.run(
        [sys.executable, str(BENCHMARK), "--_measure-memory", "ni-sdpa", "training", *TINY],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    assert measured["peak_mib"] >= 0 and measured["method"]


def test_helpers(bench: ModuleType) -> None:
    """Override parsing, model selection and throughput statistics."""
    assert bench.parse_overrides(["num_function_iterations=[2, 1]", "truncation_tau=1.2", "name=x"]) == {
        "num_function_iterations": [2, 1],
        "truncation_tau": 1.2,
        "name": "x",
    }
    with pytest.raises(ValueError):
        bench.parse_overrides(["no_equals_sign"])
    assert bench.parse_args(["--models", "vit,ni-sdpa"]).models == ["vit", "ni-sdpa"]
    with pytest.raises(SystemExit):
        bench.parse_args(["--models", "resnet"])
    stats = bench.throughput_stats([1.0, 2.0, 4.0], images_per_run=8)
    assert stats["images_per_s_median"] == 4.0
    assert (stats["images_per_s_min"], stats["images_per_s_max"]) == (2.0, 8.0)
    assert stats["images_per_s_q1"] <= stats["images_per_s_median"] <= stats["images_per_s_q3"]
    assert bench.throughput_stats([], 8) is None


def test_keep_freed_memory_reaches_the_memory_subprocess_and_the_report(bench: ModuleType) -> None:
    """--keep-freed-memory is passed on to the memory subprocesses and stated in the report's settings."""
    args = bench.parse_args(["--keep-freed-memory"])
    assert "--keep-freed-memory" in bench._child_args(args, "ni-sdpa", "training", False)
    assert "--keep-freed-memory" not in bench._child_args(bench.parse_args([]), "ni-sdpa", "training", False)
    args.kept_freed_memory = True
    assert bench.settings(args)["keep_freed_memory"] is True


def test_no_finite_check_turns_the_check_off_in_our_models_and_the_memory_subprocess(
    bench: ModuleType,
) -> None:
    args = bench.parse_args(["--no-finite-check"])
    assert "--no-finite-check" in bench._child_args(args, "ni-sdpa", "training", False)
    assert bench.settings(args)["finite_check"] is False
    assert bench.build_model("ni-sdpa", args).checks_finite is False
    assert bench.build_model("ni-sdpa", bench.parse_args([])).checks_finite is True


def test_the_token_aligned_model_is_asked_for_by_name_and_counts_the_models_flops(bench: ModuleType) -> None:
    """ni-eager-aligned: eager attention on tokens padded to 8; its FLOPs are the model's, its padding "as run"."""
    from ni_hf.modeling_neural_interpreter import LineOfCode

    assert "ni-eager-aligned" not in bench.parse_args([]).models
    args = bench.parse_args(["--models", "ni-eager-aligned", "--override", "num_function_iterations=1"])
    model = bench.build_model("ni-eager-aligned", args)
    locs = [m for m in model.modules() if isinstance(m, LineOfCode)]
    assert (
        locs and {loc.token_alignment for loc in locs} == {8} and model.config._attn_implementation == "eager"
    )
    assert {
        m.token_alignment for m in bench.build_model("ni-eager", args).modules() if isinstance(m, LineOfCode)
    } == {1}
    padded = bench.count_flops("ni-eager-aligned", args, "eager")
    assert padded > bench.count_flops("ni-eager", args, "eager")  # 67 tokens padded to 72


def test_the_fused_attention_model_is_asked_for_by_name_and_counts_the_models_flops(
    bench: ModuleType,
) -> None:
    """ni-fused: the eager model with Eq. 6 through SDPA on padded keys and columns; its FLOPs are the model's."""
    from ni_hf.modeling_neural_interpreter import LineOfCode

    assert "ni-fused" not in bench.parse_args([]).models
    args = bench.parse_args(["--models", "ni-fused", "--override", "num_function_iterations=1"])
    model = bench.build_model("ni-fused", args)
    locs = [m for m in model.modules() if isinstance(m, LineOfCode)]
    assert locs and all(loc.fused_attention for loc in locs) and model.config._attn_implementation == "eager"
    assert not any(
        m.fused_attention for m in bench.build_model("ni-eager", args).modules() if isinstance(m, LineOfCode)
    )
    # SDPA's FLOPs on 72 padded keys and 56 columns: more than the model's, which is what the report names
    assert bench.count_flops("ni-fused", args, "eager") > bench.count_flops("ni-eager", args, "eager")


def test_the_bilinear_logits_model_is_asked_for_by_name_and_runs_fewer_flops_than_the_model(
    bench: ModuleType,
) -> None:
    """ni-bilinear: the eager model with q.k as (h A) . h; the digits preset executes fewer FLOPs that way."""
    from ni_hf.modeling_neural_interpreter import LineOfCode

    assert "ni-bilinear" not in bench.parse_args([]).models
    args = bench.parse_args(
        ["--models", "ni-bilinear", "--override", "num_function_iterations=1", "--flop-batch", "32"]
    )
    model = bench.build_model("ni-bilinear", args)
    locs = [m for m in model.modules() if isinstance(m, LineOfCode)]
    assert locs and all(loc.bilinear_logits for loc in locs) and model.config._attn_implementation == "eager"
    assert not any(
        m.bilinear_logits for m in bench.build_model("ni-eager", args).modules() if isinstance(m, LineOfCode)
    )
    combined = bench.build_model("ni-bilinear-columns-aligned", args)
    assert {
        (loc.bilinear_logits, loc.columns_attention, loc.token_alignment)
        for loc in combined.modules()
        if isinstance(loc, LineOfCode)
    } == {(True, True, 8)}
    # d = 192 < 2 x 128: h A (d x d per function and head) costs less than the q and k projections, also with
    # the per-forward d x d products A_uh divided by a batch of 32 (not of 8: 189 MFLOP per function iteration)
    assert bench.count_flops("ni-bilinear", args, "eager") < bench.count_flops("ni-eager", args, "eager")


def test_compiled_agreement_flags_a_compiled_model_that_computes_another_function(bench: ModuleType) -> None:
    """Every compiled speed comes with the compiled training forward against eager: equal runs agree to rounding and
    are not flagged, a runner that computes another function is flagged, and without --compile nothing is checked."""
    argv = ["--batch-size", "2", "--override", "num_function_iterations=1", "--compile"]
    args = bench.parse_args(argv)
    variant = bench.make_variant("ni-eager", False, args)
    variant.runner = variant.model  # the compiled graph's function, without the compile time
    same = bench.compiled_agreement(variant, args)
    assert same["max_abs_logit_difference"] < 1e-5 and not same["flagged"]  # grad on and off round apart
    assert same["compiled_loss"] == pytest.approx(same["eager_loss"])

    def another_function(**inputs):
        out = variant.model(**inputs)
        out.logits = out.logits + 1.0  # what a miscompile looks like: logits off by O(1)
        return out

    variant.runner = another_function
    other = bench.compiled_agreement(variant, args)
    assert other["flagged"] and other["max_abs_logit_difference"] == pytest.approx(1.0)

    def failing(**inputs):
        raise RuntimeError("replay failed")

    variant.runner = failing
    assert bench.compiled_agreement(variant, args) == {
        "error": "RuntimeError: replay failed",
        "flagged": True,
    }
    assert bench.compiled_agreement(variant, bench.parse_args(argv[:-1])) is None
    report_line = bench._fmt_agreement("ni-eager", other)
    assert "a different function" in report_line


def test_cuda_graph_modes_are_recognised_and_skip_the_misleading_memory_reading(bench: ModuleType) -> None:
    """Under CUDA graphs the pool is allocated while recording, so one replayed step's growth is not a peak."""
    assert bench.uses_cuda_graphs(bench.parse_args(["--cuda-graphs"]))
    assert bench.uses_cuda_graphs(bench.parse_args(["--compile-mode", "max-autotune"]))
    assert not bench.uses_cuda_graphs(bench.parse_args(["--compile"]))
    assert not bench.uses_cuda_graphs(bench.parse_args([]))
    args = bench.parse_args(["--cuda-graphs", "--memory", "inprocess"])
    args.device = torch.device("cuda")  # nothing runs on it: the reading is refused before any model is built
    assert bench.measure_memory("ni-sdpa", "training", False, args) is None


def test_thread_profile_reports_the_step_operators_per_thread_count(capsys: pytest.CaptureFixture) -> None:
    module = load_script(REPO / "benchmarks" / "profile_threads.py", "ni_profile_threads")
    threads_before = torch.get_num_threads()
    try:
        per_threads = module.main(["--batch-size", "2", "--threads", "1", "2", "--top", "5"])
        with pytest.raises(SystemExit):
            module.main(["--threads", "1", "1"])
    finally:
        torch.set_num_threads(threads_before)
    assert set(per_threads) == {1, 2}
    assert all(per_threads[t]["aten::mm"] > 0 and per_threads[t]["aten::bmm"] > 0 for t in (1, 2))
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].startswith("1 thread(s): step ") and lines[1].startswith("2 thread(s): step ")
    assert len(lines) == 2 + 1 + 5  # one line per thread count, a header, the top five operators
    assert all(float(line.split()[-1]) > 0 for line in lines[3:])  # each operator's speed-up over 1 thread
    assert "distinct positive thread counts" in out.err


def test_token_padding_times_the_six_attention_products_per_key_count(capsys: pytest.CaptureFixture) -> None:
    module = load_script(REPO / "benchmarks" / "token_padding.py", "ni_token_padding")
    threads_before = torch.get_num_threads()
    tiny = ["--tokens", "5", "--batch-size", "2", "--functions", "2", "--heads", "1", "--hidden", "8"]
    try:
        results = module.main(
            ["--threads", "1", "--keys", "5", "8", "--value-head", "4", "--repeats", "1", *tiny]
        )
        with pytest.raises(SystemExit):
            module.main(["--keys", "4", *tiny])
    finally:
        torch.set_num_threads(threads_before)
    assert set(results) == {1} and set(results[1]) == {5, 8}
    assert all(len(times) == 6 and min(times.values()) > 0 for times in results[1].values())
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [line.split()[1] for line in table[1:]] == ["5", "8"]  # after the header, one row per key count


def _git_has(revision: str) -> bool:
    try:
        check = subprocess.run(
            ["git", "cat-file", "-e", f"{revision}^{{commit}}"], cwd=REPO, capture_output=True
        )
    except OSError:
        return False
    return check.returncode == 0


# Batch 3: the smallest at which the digits preset takes the bilinear form (at 1 and 2 it computes q and k).
TINY_COMPARISON = ["--override", "num_function_iterations=1", "--batch-size", "3", "--steps", "1"]


@pytest.mark.skipif(not _git_has("HEAD"), reason="needs a git checkout")
def test_revision_comparison_reports_both_models(capsys: pytest.CaptureFixture) -> None:
    module = load_script(REPO / "benchmarks" / "compare_revisions.py", "ni_compare_revisions")
    threads_before = torch.get_num_threads()
    try:
        results = module.main(["--revision", "HEAD", *TINY_COMPARISON])
    finally:
        torch.set_num_threads(threads_before)
    assert list(results) == ["revision HEAD", "working tree"]
    for r in results.values():
        assert r["max_gradient_difference"] < 1e-5
        assert 0 < r["forward_gflop_per_image"] < r["training_gflop_per_image"]
        assert r["wall_s"] > 0 and r["cpu_s"] > 0 and r["minor_page_faults"] >= 0
    assert "working tree / revision:" in capsys.readouterr().out


@pytest.mark.skipif(not _git_has("HEAD"), reason="needs a git checkout")
def test_process_comparison_runs_each_code_in_its_own_processes(capsys: pytest.CaptureFixture) -> None:
    module = load_script(REPO / "benchmarks" / "compare_processes.py", "ni_compare_processes")
    tiny = ["--override", "num_function_iterations=1", "--batch-size", "3", "--steps", "1", "--rounds", "1"]
    results = module.main(["--revision", "HEAD", "--mode", "inference", *tiny])
    assert list(results) == ["HEAD", "working tree"]
    for runs in results.values():
        (run,) = runs
        assert run["step_s"] > 0 and run["faults"] >= 0 and run["max_rss_mib"] > 0
    out = capsys.readouterr().out
    assert "round 1 HEAD: inference step" in out and "working tree / HEAD:" in out


@pytest.mark.skipif(not _git_has("79af920"), reason="needs the history back to 79af920")
def test_keeping_h_a_and_v_removes_their_recomputation_from_the_training_flops() -> None:
    """Before 2026-11-25 (79af920) the bilinear form redid h A and v in the backward: a (B N x d) @ (d x U H d) GEMM
    and a (B N x d) @ (d x U d) one per function iteration more than now (v was redone until 2026-11-28), with the
    same gradients."""
    module = load_script(REPO / "benchmarks" / "compare_revisions.py", "ni_compare_revisions")
    threads_before = torch.get_num_threads()
    try:
        before, now = module.main(["--revision", "79af920", *TINY_COMPARISON]).values()
    finally:
        torch.set_num_threads(threads_before)
    assert now["max_gradient_difference"] < 1e-5
    assert now["forward_gflop_per_image"] == pytest.approx(before["forward_gflop_per_image"])
    n, d, heads, functions = 67, 192, 4, 5  # digits preset: 64 patches + 3 CLS tokens
    h_a = 2 * n * d * functions * heads * d / 1e9  # GFLOP per image and function iteration
    v = 2 * n * d * functions * d / 1e9  # H value heads of d / H columns each
    assert before["training_gflop_per_image"] - now["training_gflop_per_image"] == pytest.approx(
        h_a + v, rel=1e-3
    )


def test_diagnosis_finds_every_eager_execution_on_cpu_close_to_float32(capsys: pytest.CaptureFixture) -> None:
    module = load_script(REPO / "benchmarks" / "diagnose_compile.py", "ni_diagnose_compile")
    results = module.main(["--device", "cpu", "--skip-compile"])
    expected = {f"{a} {p} eager" for a in ("sdpa", "eager") for p in ("fp32", "bf16")}
    assert set(results) == expected | {"sdpa bf16 eager, plain autograd"}
    assert results["sdpa bf16 eager, plain autograd"] < 0.05
    assert results["sdpa fp32 eager"] < 1e-5 and results["eager fp32 eager"] < 1e-5
    # bf16 rounding only
    assert 0 < results["sdpa bf16 eager"] < 0.05 and 0 < results["eager bf16 eager"] < 0.05
    assert "reference: CPU float32" in capsys.readouterr().out


def test_diagnosis_sdpa_layouts_compute_the_model_attention_exactly() -> None:
    """The candidate workarounds of diagnose_compile.py (materialised bias; keys and value head padded to
    multiples of 8 with the padded keys masked) give Eq. 6's output and gradients of the SDPA call as built."""
    import ni_hf.modeling_neural_interpreter as modeling

    module = load_script(REPO / "benchmarks" / "diagnose_compile.py", "ni_diagnose_compile")
    generator = torch.Generator().manual_seed(0)
    b, u, h, n, d = 2, 3, 2, 67, 48  # the digits preset's 67 tokens and 48 + 1 value columns
    inputs = [torch.randn(b, u, h, n, d, generator=generator) for _ in range(3)]
    compatibilities = torch.rand(u, b, n, generator=generator)
    bias = torch.randn(u, h, n, n, generator=generator)

    def attention(call: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        leaves = [t.clone().requires_grad_() for t in (*inputs, compatibilities, bias)]
        with module.sdpa_call(call):
            out = modeling.modulated_attention_sdpa_kernel(*leaves, scale=d**-0.5, eps=1e-6, dropout=0.0)
        out.pow(2).sum().backward()
        return out.detach(), [leaf.grad for leaf in leaves]

    built, built_grads = attention("as built")
    assert torch.nn.functional.scaled_dot_product_attention is module._SDPA
    for call in ("mask materialised", "padded to multiples of 8"):
        out, grads = attention(call)
        torch.testing.assert_close(out, built, atol=1e-5, rtol=1e-5)
        for grad, built_grad in zip(grads, built_grads, strict=True):
            torch.testing.assert_close(grad, built_grad, atol=1e-4, rtol=1e-4)
    assert torch.nn.functional.scaled_dot_product_attention is module._SDPA  # restored


def test_diagnosis_runs_only_the_executions_asked_for() -> None:
    module = load_script(REPO / "benchmarks" / "diagnose_compile.py", "ni_diagnose_compile")
    results = module.main(["--device", "cpu", "--runs", "fp32 eager"])
    assert set(results) == {"sdpa fp32 eager", "eager fp32 eager"}


def test_checkpoint_report_gives_accuracy_and_routing_density_per_task(
    data_dir: Path, tmp_path: Path
) -> None:
    from ni_hf import (
        NeuralInterpreterConfig,
        NeuralInterpreterForImageClassification,
        NeuralInterpreterImageProcessor,
    )

    config = NeuralInterpreterConfig.from_paper(
        "digits", num_function_iterations=2, task_names=["mnist", "mnistm"]
    )
    NeuralInterpreterForImageClassification(config).save_pretrained(tmp_path / "model")
    processor = NeuralInterpreterImageProcessor(size={"height": 32, "width": 32}, patch_size=4)
    processor.save_pretrained(tmp_path / "model")
    module = load_script(REPO / "benchmarks" / "checkpoint_report.py", "ni_checkpoint_report")
    out = tmp_path / "report.json"
    report = module.main([str(tmp_path / "model"), "--data-dir", str(data_dir), "--output-json", str(out)])
    assert list(report) == ["mnist", "mnistm"] and json.loads(out.read_text()) == report
    for task in report.values():
        assert task["num_images"] == 3 and task["accuracy"] in (0, 1 / 3, 2 / 3, 1)
        assert len(task["density_per_iteration"]) == 2 and 0 < task["density_mean"] <= 1


def test_gpu_suite_refuses_an_unknown_part_before_doing_anything(tmp_path: Path) -> None:
    """A typo in the part list must not spend a lent GPU's time on nothing."""
    suite = REPO / "benchmarks" / "gpu_suite.sh"
    done = subprocess.run(
        ["bash", str(suite), str(tmp_path / "out"), "fp32,diagnos"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "unknown part 'diagnos'" in done.stderr
    assert not (tmp_path / "out").exists()


def test_op_count_counts_each_phase_of_a_training_step_independently_of_the_batch_size() -> None:
    """benchmarks/op_count.py: a step's operations by phase; the count (the per-step overhead) is batch-free."""
    module = load_script(REPO / "benchmarks" / "op_count.py", "ni_op_count")
    small, large = (module.main(["--preset", "fuzzy_boolean", "--batch-size", str(b)]) for b in (2, 5))
    assert small == large
    for counts in small.values():
        assert counts["forward"] > 100 and counts["backward"] > counts["forward"]
        assert counts["total"] == counts["forward"] + counts["backward"] + counts["optimizer_step"]
    # the same parameter tensors, so the same RAdam step, whichever attention
    assert small["sdpa"]["optimizer_step"] == small["eager"]["optimizer_step"] > 0


def test_gpu_profile_counts_each_kernel_once() -> None:
    """profile_gpu.py sums device-side events only: the launching operator's and annotations' copies do not count."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    module = load_script(REPO / "benchmarks" / "profile_gpu.py", "ni_profile_gpu")

    def event(
        device_type: DeviceType, time_us: float, count: int, annotation: bool = False
    ) -> SimpleNamespace:
        return SimpleNamespace(
            device_type=device_type,
            self_device_time_total=time_us,
            count=count,
            is_user_annotation=annotation,
        )

    events = [
        event(DeviceType.CPU, 30.0, 2),  # aten::bmm, carrying its kernels' time
        event(DeviceType.CUDA, 20.0, 1),  # the bmm's two kernels
        event(DeviceType.CUDA, 10.0, 1),
        event(DeviceType.CUDA, 25.0, 1, annotation=True),  # Optimizer.step#RAdam.step on the GPU timeline
        event(DeviceType.CUDA, 5.0, 3),  # an elementwise kernel
    ]
    assert module.device_time_and_launches(events) == (35.0, 5)


def test_gpu_profile_runs_and_groups_by_shape_on_cpu(capsys: pytest.CaptureFixture) -> None:
    """profile_gpu.py end to end on the CPU (eager, batch 2): the summary line and both tables."""
    module = load_script(REPO / "benchmarks" / "profile_gpu.py", "ni_profile_gpu")
    module.main(
        ["--device", "cpu", "--compile-mode", "none", "--batch-size", "2", "--steps", "1", "--shapes"]
    )
    out = capsys.readouterr().out
    assert "batch 2, compile none:" in out and "kernels 0.0 ms/step" in out
    assert "aten::bmm" in out and "Input Shapes" in out


def test_op_count_counts_and_times_the_randaugment_of_a_batch() -> None:
    """--augmentation: run_digits.py's RandAugment of one batch, in operations (each a launch on a GPU) and images/s."""
    module = load_script(REPO / "benchmarks" / "op_count.py", "ni_op_count")
    augmentation = module.count_augmentation(16, torch.device("cpu"), draws=2)
    assert (
        100
        < augmentation["operations_min"]
        <= augmentation["operations_mean"]
        <= augmentation["operations_max"]
    )
    assert augmentation["images_per_s"] > 0


def test_memory_traffic_sums_inductors_byte_counts_by_kernel_kind(capsys: pytest.CaptureFixture) -> None:
    """One function iteration, batch 2: GEMMs, N x N attention kernels, layout copies and the rest each move bytes,
    the floor is the total over the bandwidth, and the largest kernels are named with their shapes."""
    import logging

    from torch._inductor import config as inductor_config

    module = load_script(REPO / "benchmarks" / "memory_traffic.py", "ni_memory_traffic")
    common = ["--override", "num_function_iterations=1", "--dtype", "float32", "--top", "2"]
    caches_off = inductor_config.force_disable_caches
    metrics_level = logging.getLogger("torch._inductor.compile_fx.__inductor_metrics").level
    small = module.main(["--batch-size", "2", *common])
    # the counts need fresh compiles and the metrics logger on, for this compile only (not the process's next ones)
    assert inductor_config.force_disable_caches == caches_off
    assert logging.getLogger("torch._inductor.compile_fx.__inductor_metrics").level == metrics_level
    out = capsys.readouterr().out
    kinds = small["kinds"]
    assert set(kinds) == {"GEMM (extern)", "attention N x N", "elementwise / reduction", "layout copy"}
    assert all(kind["bytes"] > 0 and kind["kernels"] > 0 for kind in kinds.values())
    assert small["total_bytes"] == sum(kind["bytes"] for kind in kinds.values())
    assert small["floor_ms"]["H200"] == pytest.approx(small["total_bytes"] / 4.8e12 * 1e3)
    assert "largest attention N x N kernels" in out and "bmm (" in out
    # the q.k^T product of 2 images x 5 functions x 4 heads, 67 x 128 by 128 x 67 (the reference's 128-wide heads)
    assert "bmm (40, 67, 128) x (40, 128, 67)" in out


def test_memory_traffic_tells_fused_attention_calls_from_gemms() -> None:
    """An extern SDPA kernel (`--attention fused` on a GPU) is its own kind, not a GEMM: its N x N stays on chip."""
    module = load_script(REPO / "benchmarks" / "memory_traffic.py", "ni_memory_traffic")

    class ExternKernelSchedulerNode:  # named as inductor's: kernel_kind reads the type's name
        def __init__(self, kernel: str) -> None:
            self.node = type("Node", (), {"python_kernel_name": kernel, "inputs": ()})()

    efficient = ExternKernelSchedulerNode("torch.ops.aten._scaled_dot_product_efficient_attention.default")
    assert module.kernel_kind(efficient, {67}) == "fused attention (extern)"
    assert module.kernel_kind(ExternKernelSchedulerNode("extern_kernels.bmm"), {67}) == "GEMM (extern)"


def test_memory_traffic_counts_the_bilinear_and_columns_experiments(capsys: pytest.CaptureFixture) -> None:
    """--attention bilinear-columns compiles the eager model with both switches on: the logits come from one
    (h A) @ h^T product per image, not from 128-wide q and k heads, and no N x N modulated weights are formed."""
    module = load_script(REPO / "benchmarks" / "memory_traffic.py", "ni_memory_traffic")
    common = [
        "--override",
        "num_function_iterations=1",
        "--dtype",
        "float32",
        "--top",
        "40",
        "--batch-size",
        "2",
    ]
    module.main([*common, "--attention", "bilinear-columns"])
    out = capsys.readouterr().out
    # 2 images, rows (token, function, head) = 67 x 5 x 4 = 1,340, against h^T (192 x 67)
    assert "bmm (2, 1340, 192) x (2, 192, 67)" in out
    assert "bmm (40, 67, 128) x (40, 128, 67)" not in out
    # A @ [C v, C]: the value head of 48 plus the compatibility column
    assert "bmm (40, 67, 67) x (40, 67, 49)" in out


def test_input_pipeline_times_run_digits_transform_with_and_without_randaugment(tmp_path: Path) -> None:
    """One worker's share of the digits input pipeline, on the embedded 8x8 digits: both pipelines deliver whole
    batches, RandAugment costs time, and the step rate asks for at least one worker."""
    module = load_script(REPO / "benchmarks" / "input_pipeline.py", "ni_input_pipeline")
    out = tmp_path / "pipeline.json"
    args = ["--source", "sklearn", "--batch-size", "32", "--batches", "5", "--warmup", "1"]
    report = module.main([*args, "--step-rate", "100000", "--output-json", str(out)])
    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    plain, augmented = report["pipelines"]["no RandAugment"], report["pipelines"]["RandAugment"]
    assert 0 < augmented["images_per_second"] < plain["images_per_second"]
    for pipeline in (plain, augmented):
        assert pipeline["workers_for_step_rate"] == -(-100000 // pipeline["images_per_second"])
    with pytest.raises(ValueError, match="fewer --batches"):
        module.main(["--source", "sklearn", "--batch-size", "512", "--batches", "3"])


def test_export_inference_times_eager_pytorch_and_onnxruntime_on_the_same_logits(tmp_path: Path) -> None:
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    module = load_script(REPO / "benchmarks" / "export_inference.py", "ni_export_inference")
    out_json, out_md = tmp_path / "out.json", tmp_path / "RESULTS.md"
    out_md.write_text("# Results\n")
    tiny = [
        "--override",
        "num_function_iterations=1",
        "--override",
        "hidden_size=32",
        "--override",
        "code_dim=16",
    ]
    with pytest.raises(SystemExit):
        module.main(["--batch-size", "0"])
    results = module.main(
        ["--threads", "1", "--batch-size", "3", "--repeats", "2", "--warmup", "0", *tiny,
         "--output-json", str(out_json), "--append-results", str(out_md)]
    )  # fmt: skip
    assert json.loads(out_json.read_text()) == results
    assert set(results["runners"]) == {"pytorch-eager", "onnxruntime"}
    assert all(
        r["images_per_s_min"] <= r["images_per_s_median"] <= r["images_per_s_max"]
        for r in results["runners"].values()
    )
    assert results["max_abs_logit_difference"] < 1e-4  # the export computes the model's logits
    assert results["onnx_megabytes"] > 0 and results["threads"] == 1
    table = [line for line in out_md.read_text().splitlines() if line.startswith("| ")]
    assert [line.split()[1] for line in table[1:]] == ["pytorch-eager", "onnxruntime"]  # after the header
