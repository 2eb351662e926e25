"""Tests of benchmarks/: benchmark.py at tiny sizes, the authors' model from a given copy, the GPU suite's part check,
the ONNX export benchmark, and the FLOP invariant of the digits preset."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from _scripts import load_script

REPO = Path(__file__).resolve().parents[1]
BENCHMARK = REPO / "benchmarks" / "benchmark.py"

# One function iteration, batch 2, one repeat, no warm-up, one thread: seconds, not minutes.
TINY = ["--threads", "1", "--batch-size", "2", "--repeats", "1", "--warmup", "0"]
TINY += ["--override", "num_function_iterations=1", "--quiet"]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    """benchmarks/benchmark.py imported as a module (benchmarks/ is not a package)."""
    return load_script(BENCHMARK, "ni_benchmark")


@pytest.fixture(autouse=True)
def _restore_torch_threads() -> Iterator[None]:
    """`--threads 1` sets torch's global thread count: give later tests in this process theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def authors_code(tmp_path: Path) -> Iterator[Path]:
    """A stand-in for a copy of nasimrahaman/neural-interpreter: its layout and interface, a linear model inside.

    `NeuralInterpreter(**read_yaml("presets/digits.yml").model.kwargs)(images).predictions` is a dict of logits per
    dataset, as in the authors' code.
    """
    root = tmp_path / "neural-interpreter"
    (root / "neural_interpreters" / "core").mkdir(parents=True)
    (root / "presets").mkdir()
    (root / "neural_interpreters" / "__init__.py").write_text("")
    (root / "neural_interpreters" / "core" / "__init__.py").write_text("")
    (root / "neural_interpreters" / "utils.py").write_text(
        "import json\nfrom types import SimpleNamespace\n\n\n"
        "def read_yaml(path):\n"
        "    with open(path) as f:\n"
        "        return SimpleNamespace(model=SimpleNamespace(kwargs=json.load(f)['model']['kwargs']))\n"
    )
    (root / "neural_interpreters" / "core" / "interface.py").write_text(
        "from types import SimpleNamespace\n\nfrom torch import nn\n\n\n"
        "class NeuralInterpreter(nn.Module):\n"
        "    def __init__(self, *, num_classes_in_dataset, image_size, image_input_channels, **kwargs):\n"
        "        super().__init__()\n"
        "        features = image_input_channels * image_size * image_size\n"
        "        self.heads = nn.ModuleDict({k: nn.Linear(features, n) for k, n in num_classes_in_dataset.items()})\n\n"
        "    def forward(self, image, mask=None):\n"
        "        x = image.flatten(1)\n"
        "        return SimpleNamespace(predictions={k: head(x) for k, head in self.heads.items()})\n"
    )
    kwargs = {"num_classes_in_dataset": {"mnist": 10, "mnistm": 10, "svhn": 10}, "image_size": 32}
    kwargs |= {"image_input_channels": 3, "patch_size": 4}
    (root / "presets" / "digits.yml").write_text(json.dumps({"model": {"kwargs": kwargs}}))  # JSON is YAML
    yield root
    for name in [
        m for m in sys.modules if m == "neural_interpreters" or m.startswith("neural_interpreters.")
    ]:
        del sys.modules[name]
    if str(root) in sys.path:
        sys.path.remove(str(root))


def test_forward_flops_of_the_digits_preset_stay_within_the_target(bench: ModuleType) -> None:
    """At most 2.2 GFLOP per image forward (the authors' implementation: 3.55)."""
    flops = bench.forward_flops_per_image(bench.parse_args([]))
    assert 1.0e9 < flops <= 2.2e9, f"forward FLOPs per image: {flops / 1e9:.3f} G"


def test_a_tiny_run_measures_every_model_in_both_modes(bench: ModuleType, tmp_path: Path) -> None:
    """ours (the CPU kernels, fastest for the digits preset on a CPU), ours literal and the ViT: parameters, FLOPs,
    images/s, GFLOP/s, memory."""
    out_json = tmp_path / "out.json"
    report = bench.main([*TINY, "--memory", "inprocess", "--output-json", str(out_json)])
    assert json.loads(out_json.read_text()) == json.loads(json.dumps(report))
    assert set(report) == {"environment", "settings", "models", "ratios"}
    env = report["environment"]
    assert env["cpu"] and env["torch_threads"] == 1 and env["gpu"] is None and env["date"].endswith("+00:00")
    assert env["commit"] is None or len(env["commit"].split("+")[0]) >= 7
    models = report["models"]
    assert list(models) == ["ni", "ni-eager", "vit"]
    assert models["ni"]["attn_implementation"] == "fast"
    assert models["ni-eager"]["attn_implementation"] == "eager"
    assert models["vit"]["parameters"]["total"] == 1_809_226
    assert models["ni"]["parameters"] == models["ni-eager"]["parameters"]
    assert models["ni"]["forward_flops_per_image"] == models["ni-eager"]["forward_flops_per_image"] > 0
    for result in models.values():
        for mode in ("inference", "training"):
            stats = result[mode]
            assert stats["images_per_s_min"] <= stats["images_per_s_median"] <= stats["images_per_s_max"]
            assert stats["images_per_cpu_s_median"] > 0 and len(stats["cpu_seconds"]) == 1
            assert result["achieved_gflops"][mode] > 0 and result["memory"][mode]["peak_mib"] >= 0
        assert result["achieved_gflops"]["training"] == pytest.approx(
            3 * result["forward_flops_per_image"] * result["training"]["images_per_s_median"] / 1e9
        )
    ratios = report["ratios"]
    assert ratios["training_gflops_ours_over_vit"] == pytest.approx(
        models["ni"]["achieved_gflops"]["training"] / models["vit"]["achieved_gflops"]["training"]
    )
    assert ratios["inference_gflop_per_cpu_s_ours_over_vit"] > 0
    assert ratios["training_images_per_s_ours_over_authors"] is None  # no copy of the authors' code given
    text = bench.markdown_report(report)
    for needle in ("| ni |", "| ni-eager |", "| vit |", "Ours over the ViT", env["command"]):
        assert needle in text


def test_bfloat16_runs_ni_on_sdpa_and_says_why(bench: ModuleType, capsys: pytest.CaptureFixture) -> None:
    """ "fast" computes float32 only and refuses autocast: under --dtype bfloat16 "ni" runs "sdpa", and says so."""
    report = bench.main([*TINY, "--dtype", "bfloat16", "--models", "ni", "vit", "--memory", "off"])
    ni = report["models"]["ni"]
    assert (
        ni["attn_implementation"] == "sdpa"
        and "refuses bfloat16 autocast" in ni["attn_implementation_reason"]
    )
    assert ni["training"]["images_per_s_median"] > 0 and report["settings"]["dtype"] == "bfloat16"
    assert (
        "ni runs 'sdpa': 'fast' computes float32 only and refuses bfloat16 autocast."
        in capsys.readouterr().out
    )
    float32 = bench.parse_args([])
    assert bench.default_attn_implementation(float32)[0] == "fast"
    assert (
        bench.build_model("ni", bench.parse_args(["--dtype", "bfloat16"])).config._attn_implementation
        == "sdpa"
    )


@pytest.mark.parametrize("schedule", ["steady", "rotate"])
def test_each_schedule_times_the_models_in_its_order(
    bench: ModuleType, monkeypatch: pytest.MonkeyPatch, schedule: str
) -> None:
    """steady (the default): each model's own warm-up steps just before its own timed steps, one model after another;
    rotate: warm-up rounds of all, then repeats in which the models take turns."""
    calls: list[tuple[str, str]] = []

    def time_steps(b, mode, args):
        calls.append((b.key, mode))
        return 1.0, 1.0

    monkeypatch.setattr(bench, "time_steps", time_steps)
    args = bench.parse_args(
        ["--models", "ni", "vit", "--repeats", "2", "--warmup", "1", "--schedule", schedule]
    )
    assert bench.parse_args([]).schedule == "steady"
    model = torch.nn.Linear(1, 1)
    snapshot = [p.detach().clone() for p in model.parameters()]
    benches = [bench.Bench(key, model, model, None, {}, snapshot) for key in ("ni", "vit")]
    bench.benchmark_throughput(benches, args)
    inf, train = "inference", "training"
    if schedule == "steady":
        expected = [("ni", inf)] * 3 + [("ni", train)] * 3 + [("vit", inf)] * 3 + [("vit", train)] * 3
    else:
        warm = [("ni", inf), ("ni", train), ("vit", inf), ("vit", train)]
        expected = warm + warm + [("vit", inf), ("vit", train), ("ni", inf), ("ni", train)]
    assert calls == expected
    assert all(
        len(b.seconds[mode]) == 2 for b in benches for mode in (inf, train)
    )  # the warm-ups are not kept
    text = bench.schedule_text(bench.settings(args))
    assert ("its steady state" in text) == (schedule == "steady") and ("taking turns" in text) != (
        schedule == "steady"
    )


def test_the_pgm_preset_measures_the_multiple_choice_models_per_puzzle(bench: ModuleType) -> None:
    """--preset pgm: the paper's PGM Neural Interpreter and ViT taking turns; FLOPs, rates and memory per puzzle."""
    from torch.utils.flop_counter import FlopCounterMode

    from ni_hf import MultiTaskViTConfig, MultiTaskViTForMultipleChoice

    report = bench.main(["--preset", "pgm", "--models", "ni", "vit", *TINY, "--memory", "inprocess"])
    assert report["settings"]["sample"] == "puzzle" and report["settings"]["regime"] is None
    models = report["models"]
    assert list(models) == ["ni", "vit"]
    vit = MultiTaskViTForMultipleChoice(MultiTaskViTConfig.from_paper("pgm")).eval()
    vit.set_attn_implementation("eager")  # the literal attention, on which the benchmark counts FLOPs
    assert models["vit"]["parameters"]["total"] == vit.num_parameters()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        vit(pixel_values=torch.zeros(1, 16, 1, 80, 80))  # one puzzle
    assert models["vit"]["forward_flops_per_image"] == counter.get_total_flops()
    assert models["ni"]["forward_flops_per_image"] > 0
    for result in models.values():
        assert result["batch_size"] == 2
        for mode in ("inference", "training"):
            assert result[mode]["images_per_s_median"] > 0 and result["memory"][mode]["peak_mib"] >= 0
        assert result["achieved_gflops"]["training"] == pytest.approx(
            3 * result["forward_flops_per_image"] * result["training"]["images_per_s_median"] / 1e9
        )
    assert report["ratios"]["training_gflops_ours_over_vit"] > 0
    text = bench.markdown_report(report)
    for needle in (
        "| Fwd GFLOP/puzzle | Inference puzzle/s | Training puzzle/s |",
        "PGM puzzles (the neutral",
    ):
        assert needle in text

    args = bench.parse_args(["--preset", "pgm", "--regime", "attr.rels"])
    assert bench.ni_config(args).type_dim == 24  # the regime's selection
    child = bench.parse_args(bench.child_argv(args, "ni", "training")[2:])
    assert (child.preset, child.regime) == ("pgm", "attr.rels")
    for bad in (["--regime", "neutral"], ["--preset", "pgm", "--regime", "held-out"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    with pytest.raises(SystemExit):
        bench.parse_args(["--preset", "pgm", "--models", "ni", "authors", "--authors-code", "."])


def test_the_authors_model_runs_from_a_given_copy_at_its_own_batch_size(
    bench: ModuleType, authors_code: Path
) -> None:
    argv = [*TINY, "--models", "ni", "--modes", "training", "--memory", "off"]
    report = bench.main([*argv, "--authors-code", str(authors_code), "--authors-batch-size", "3"])
    authors = report["models"]["authors"]
    assert authors["batch_size"] == 3 and report["models"]["ni"]["batch_size"] == 2
    assert authors["attn_implementation"] == "einsum (the authors')"
    assert authors["parameters"]["total"] == 3 * (3 * 32 * 32 * 10 + 10)
    assert authors["forward_flops_per_image"] == 3 * 2 * 3 * 32 * 32 * 10
    assert authors["inference"] is None and authors["training"]["images_per_s_median"] > 0
    assert report["ratios"]["training_images_per_s_ours_over_authors"] == pytest.approx(
        report["models"]["ni"]["training"]["images_per_s_median"] / authors["training"]["images_per_s_median"]
    )
    assert "| authors (batch 3) |" in bench.markdown_report(report)

    model = bench.AuthorsClassifier(str(authors_code), "digits")
    images = torch.randn(4, 3, 32, 32)
    task_ids, labels = torch.tensor([0, 1, 2, 1]), torch.tensor([3, 1, 4, 1])
    out = model(pixel_values=images, task_ids=task_ids, labels=labels)
    predictions = model.model(images).predictions
    expected = torch.stack(
        [predictions[name][i] for i, name in enumerate(["mnist", "mnistm", "svhn", "mnistm"])]
    )
    torch.testing.assert_close(out.logits, expected)  # each image is scored by its own task's head
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(expected, labels))


def test_the_command_line_is_checked(bench: ModuleType, authors_code: Path) -> None:
    assert bench.parse_overrides(["num_function_iterations=[2, 1]", "truncation_tau=1.2", "name=x"]) == {
        "num_function_iterations": [2, 1],
        "truncation_tau": 1.2,
        "name": "x",
    }
    with pytest.raises(ValueError):
        bench.parse_overrides(["no_equals_sign"])
    assert bench.parse_args(["--models", "vit,ni"]).models == ["vit", "ni"]
    assert bench.parse_args(["--authors-code", str(authors_code)]).models == [
        "ni",
        "ni-eager",
        "vit",
        "authors",
    ]
    for bad in (["--models", "resnet"], ["--models", "authors"], ["--batch-size", "0"], ["--warmup", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)
    args = bench.parse_args(["--compile-mode", "reduce-overhead"])
    assert args.compile and args.steps_per_repeat == 1 and args.memory == "subprocess"
    assert args.authors_batch_size == args.batch_size == 128
    stats = bench.throughput_stats([1.0, 2.0, 4.0], images_per_run=8)
    assert (stats["images_per_s_min"], stats["images_per_s_median"], stats["images_per_s_max"]) == (
        2.0,
        4.0,
        8.0,
    )
    assert bench.throughput_stats([], 8) is None


def test_the_memory_child_measures_one_step_and_gets_the_runs_settings(
    bench: ModuleType, capsys: pytest.CaptureFixture
) -> None:
    """A fresh process per model and mode runs `--_measure-memory MODEL MODE` with the run's settings."""
    assert bench.main(["--_measure-memory", "ni-eager", "training", *TINY]) is None
    measured = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert measured["peak_mib"] is None or measured["peak_mib"] >= 0
    assert measured["method"]
    args = bench.parse_args([*TINY, "--dtype", "bfloat16", "--authors-batch-size", "3"])
    argv = bench.child_argv(args, "vit", "inference")
    assert argv[1] == str(BENCHMARK) and argv[2:5] == ["--_measure-memory", "vit", "inference"]
    child = bench.parse_args(argv[2:])
    for name in ("batch_size", "authors_batch_size", "dtype", "threads", "overrides", "seed", "lr", "preset"):
        assert getattr(child, name) == getattr(args, name), name


def test_the_gpu_suite_refuses_an_unknown_part_before_doing_anything(tmp_path: Path) -> None:
    """A typo in the part list must not spend a lent GPU's time on nothing."""
    done = subprocess.run(
        ["bash", str(REPO / "benchmarks" / "gpu_suite.sh"), str(tmp_path / "out"), "tests,bnech"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2 and "unknown part 'bnech'" in done.stderr
    assert not (tmp_path / "out").exists()


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
    assert json.loads(out_json.read_text()) == json.loads(json.dumps(results))
    assert set(results["runners"]) == {"pytorch-eager", "onnxruntime"}
    assert all(
        r["images_per_s_min"] <= r["images_per_s_median"] <= r["images_per_s_max"]
        for r in results["runners"].values()
    )
    assert results["max_abs_logit_difference"] < 1e-4  # the export computes the model's logits
    assert results["onnx_megabytes"] > 0 and results["threads"] == 1
    table = [line for line in out_md.read_text().splitlines() if line.startswith("| ")]
    assert [line.split()[1] for line in table[1:]] == ["pytorch-eager", "onnxruntime"]  # after the header


def test_the_generator_timing_reports_every_regime_and_panel_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    speed = load_script(REPO / "benchmarks" / "pgm_generator_speed.py", "ni_pgm_generator_speed")
    out = tmp_path / "speed.json"
    report = speed.main(
        ["--num-puzzles", "3", "--regimes", "neutral", "extrapolation", "--panel-sizes", "16", "24"]
        + ["--output-json", str(out), "--quiet"]
    )
    rows = [(row["regime"], row["panel_size"], row["num_puzzles"]) for row in report["rows"]]
    assert rows == [
        ("neutral", 16, 3),
        ("neutral", 24, 3),
        ("extrapolation", 16, 3),
        ("extrapolation", 24, 3),
    ]
    for row in report["rows"]:
        assert row["seconds"] > 0
        assert row["puzzles_per_second"] == pytest.approx(3 / row["seconds"])
    assert json.loads(out.read_text()) == report
    printed = capsys.readouterr().out
    assert "| extrapolation | 24x24 | 3 |" in printed and report["environment"]["commit"] in printed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--panel-sizes", "8"], "--panel-sizes: expected sizes >= 16, got 8"),
        (["--num-puzzles", "0"], "--num-puzzles: expected an integer >= 1, got 0"),
        (["--regimes", "mnist"], "invalid choice: 'mnist'"),
    ],
)
def test_the_generator_timing_refuses_a_bad_argument_by_name(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    speed = load_script(REPO / "benchmarks" / "pgm_generator_speed.py", "ni_pgm_generator_speed")
    with pytest.raises(SystemExit) as exit_info:
        speed.main(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
