"""examples/run_digits_adaptation.py: the paper's adaptation studies on a tiny checkpoint and scikit-learn's digits."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path
from types import ModuleType

import datasets
import pytest
import torch
from _scripts import load_script, run_with_forkserver, torchrun_command
from conftest import NeuralInterpreterModelTester

import ni_hf
import ni_hf.training.run_setup

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "run_digits_adaptation.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    return load_script(SCRIPT, "run_digits_adaptation")


TESTER = NeuralInterpreterModelTester.digits_like(task_names=["sklearn_digits"])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tester's tiny (untrained) digits classifier (3 functions, 2 function iterations) on scikit-learn's
    digits, saved as run_digits.py saves it."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("pretrained")
    ni_hf.NeuralInterpreterForImageClassification(TESTER.get_config()).save_pretrained(path)
    return path


def sklearn_study_args(checkpoint: Path) -> list[str]:
    """The checkpoint, adapted to scikit-learn's digits (offline)."""
    return [
        "--model_name_or_path",
        str(checkpoint),
        "--new_task",
        "sklearn_digits",
        "--dataset_source",
        "sklearn",
    ]


def test_all_studies_run_and_write_their_results(
    script: ModuleType, checkpoint: Path, tmp_path: Path
) -> None:
    output_dir = tmp_path / "studies"
    args = sklearn_study_args(checkpoint)
    args += ["--num_train_samples", "32", "64", "--adaptation_seeds", "0", "1", "--adapt_epochs", "1"]
    args += ["--batch_size", "32", "--capacity_new_functions", "0", "2", "--capacity_train_samples", "32"]
    args += ["--dropped_draws", "2", "--max_eval_samples", "40", "--output_dir", str(output_dir)]
    results = script.main(args)
    saved = json.loads((output_dir / "adaptation_results.json").read_text())
    assert saved["fast_adaptation"] == results["fast_adaptation"]
    for study in ("fast_adaptation", "reinitialized_functions"):
        for n, steps in (("32", 1), ("64", 2)):  # one epoch of the batch of 32
            entry = saved[study][n]
            assert entry["runs"] == 2 and [r["seed"] for r in entry["details"]] == [0, 1]
            assert all(r["train_steps"] == steps for r in entry["details"])
            assert all(0.0 <= v <= 1.0 for v in entry["values"]) and math.isclose(
                entry["mean"], sum(entry["values"]) / 2
            )
    # Capacity extension: 3 functions as trained, 5 with two added; far fewer trainable parameters than 'all'.
    capacity = saved["capacity_extension"]
    assert sorted(capacity) == ["3", "5"] and capacity["5"]["new_functions"] == 2
    all_params = saved["fast_adaptation"]["32"]["details"][0]["trainable_parameters"]
    assert capacity["3"]["details"][0]["trainable_parameters"] < all_params / 4
    # Dropped functions: k = 0, 1, 2 of 3, k functions per draw, the undisturbed model once.
    dropped = saved["dropped_functions"]
    assert sorted(dropped) == ["0", "1", "2"] and dropped["0"]["accuracy"]["runs"] == 1
    assert all(len(d["0"]) == 2 for d in dropped["2"]["draws"]) and dropped["2"]["accuracy"]["runs"] == 2
    assert dropped["1"]["accuracy_sklearn_digits"] == dropped["1"]["accuracy"]
    table = (output_dir / "adaptation_results.md").read_text()
    assert "| 64 |" in table and "| 5 | 2 |" in table and "functions dropped per script" in table


def test_quick_runs_every_study_and_draws_one_plot_per_study(
    script: ModuleType, checkpoint: Path, tmp_path: Path
) -> None:
    args = sklearn_study_args(checkpoint)
    results = script.main([*args, "--preset", "quick", "--output_dir", str(tmp_path)])
    quick = script.PRESETS["quick"].arguments
    assert results["studies"] == list(script.STUDIES)
    assert sorted(results["fast_adaptation"], key=int) == [str(n) for n in quick["num_train_samples"]]
    assert results["arguments"]["adapt_epochs"] == quick["adapt_epochs"]
    assert sorted(results["function_iterations"]) == ["1", "2"]  # the checkpoint's 2 trained iterations
    for study in ("fast_adaptation", "capacity_extension", "dropped_functions", "function_iterations"):
        assert (tmp_path / f"{study}.png").stat().st_size > 1000, study
    table = (tmp_path / "adaptation_results.md").read_text()
    assert "| function iterations | all | sklearn_digits |" in table


def test_function_iterations_are_the_models_own_anytime_predictions(
    script: ModuleType, checkpoint: Path, tmp_path: Path
) -> None:
    args = ["--model_name_or_path", str(checkpoint), "--studies", "function_iterations", "--dataset_source"]
    iterations = script.main([*args, "sklearn", "--max_eval_samples", "40", "--output_dir", str(tmp_path)])[
        "function_iterations"
    ]
    model = ni_hf.NeuralInterpreterForImageClassification.from_pretrained(str(checkpoint)).eval()
    test = script.load_task_split("sklearn_digits", "test", "sklearn", max_samples=40)
    batch = ni_hf.NeuralInterpreterImageProcessor()(
        images=list(test["image"]), do_patchify=False, return_tensors="pt"
    )
    task_ids = torch.zeros(len(test), dtype=torch.long)
    for n in (1, 2):
        with torch.no_grad():
            logits = model(**batch, task_ids=task_ids, num_function_iterations=n).logits
        expected = (logits.argmax(-1) == torch.tensor(list(test["label"]))).float().mean().item()
        assert iterations[str(n)]["accuracy"]["values"] == [pytest.approx(expected)]


def test_the_plot_script_draws_several_runs_in_one_fast_adaptation_plot(
    script: ModuleType, checkpoint: Path, tmp_path: Path
) -> None:
    ni_results = script.main([*one_short_adaptation(checkpoint), "--output_dir", str(tmp_path / "ni")])
    vit_results = {**ni_results, "architecture": "vit", "model": "vit-checkpoint"}
    (tmp_path / "vit").mkdir()
    (tmp_path / "vit" / "adaptation_results.json").write_text(json.dumps(vit_results))
    plot_script = load_script(SCRIPT.parent / "plot_adaptation_studies.py", "plot_adaptation_studies")
    paths = [str(tmp_path / run / "adaptation_results.json") for run in ("ni", "vit")]
    written = plot_script.main([*paths, "--output_dir", str(tmp_path / "report")])
    assert [p.name for p in written] == ["fast_adaptation.png"]
    report = (tmp_path / "report" / "dynamic_inference.md").read_text()
    assert (
        "| training samples | Neural Interpreter, pre-trained functions | multi-task ViT, pre-trained |"
        in report
    )
    mean = 100 * ni_results["fast_adaptation"]["64"]["mean"]
    assert f"| 64 | {mean:.2f} ± 0.00 (1) | {mean:.2f} ± 0.00 (1) |" in report
    with pytest.raises(SystemExit):
        plot_script.main([str(tmp_path / "missing.json"), "--output_dir", str(tmp_path)])


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "no such file"),
        ("{}", "no 'model', 'new_task', 'arguments'"),
        ("[1, 2]", "holds a JSON list, not an object"),
        ('{"model": "m",', "not JSON \\(Expecting"),
        (
            '{"model": "m", "new_task": "t", "arguments": {}, "fast_adaptation": [1]}',
            "'fast_adaptation' is not an object",
        ),
    ],
    ids=["missing", "empty object", "list", "malformed", "bad study"],
)
def test_the_plot_script_refuses_a_file_that_is_not_adaptation_results_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, content: str | None, match: str
) -> None:
    plot_script = load_script(SCRIPT.parent / "plot_adaptation_studies.py", "plot_adaptation_studies")
    path = tmp_path / "adaptation_results.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SystemExit) as exit_info:
        plot_script.main([str(path), "--output_dir", str(tmp_path / "report")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and f"error: {path}: " in err and re.search(match, err), err
    assert "expected an adaptation_results.json of run_digits_adaptation.py" in err
    assert not (tmp_path / "report").exists()


def test_reinitialized_functions_redraw_only_codes_and_signatures(
    script: ModuleType, checkpoint: Path
) -> None:
    kept = script.prepare_model(str(checkpoint), "new", 10, seed=0)
    redrawn = script.prepare_model(str(checkpoint), "new", 10, seed=0, reinitialize_functions=True)
    for (name, a), (_, b) in zip(kept.named_parameters(), redrawn.named_parameters(), strict=True):
        changed = not torch.equal(a, b)
        assert changed == name.endswith((".codes", ".signatures")), name


def test_capacity_extension_trains_only_codes_signatures_cls_token_and_head(
    script: ModuleType, checkpoint: Path
) -> None:
    model = script.prepare_model(str(checkpoint), "new", 10, seed=0, new_functions=2, functions_only=True)
    assert model.config.num_functions == 5 and not model.config.freeze_signatures
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(
        name.endswith((".codes", ".signatures")) or "task_tokens" in name or name.startswith("classifier.")
        for name in trainable
    )
    assert any(name.endswith(".signatures") for name in trainable)  # the preset freezes them in pre-training


def test_a_loaded_checkpoint_has_its_problem_type_before_the_first_forward(
    script: ModuleType, checkpoint: Path
) -> None:
    """So that no (compiled) forward writes it into the config, which would recompile the model at step 2."""
    assert json.loads((checkpoint / "config.json").read_text()).get("problem_type") is None
    assert script.load_pretrained(str(checkpoint)).config.problem_type == "single_label_classification"


def test_a_subset_larger_than_the_data_is_refused(script: ModuleType) -> None:
    with pytest.raises(ValueError, match="only 5"):
        script.subset(datasets.Dataset.from_dict({"a": list(range(5))}), 6, seed=0)


def one_short_adaptation(checkpoint: Path) -> list[str]:
    """Arguments of one fast-adaptation run (64 samples, one epoch of batch 32) on the CPU, without --output_dir."""
    args = ["--use_cpu", "true", "--studies", "fast_adaptation", "--model_name_or_path", str(checkpoint)]
    args += ["--new_task", "sklearn_digits", "--dataset_source", "sklearn", "--num_train_samples", "64"]
    return [
        *args,
        "--adaptation_seeds",
        "0",
        "--adapt_epochs",
        "1",
        "--batch_size",
        "32",
        "--max_eval_samples",
        "40",
    ]


def test_a_bf16_run_says_so_in_its_results(script: ModuleType, checkpoint: Path, tmp_path: Path) -> None:
    """`--bf16 true --use_cpu true`: the results record bf16 autocast, so the accuracies are not read as float32's."""
    results = script.main(
        [*one_short_adaptation(checkpoint), "--bf16", "true", "--output_dir", str(tmp_path)]
    )
    assert results["environment"]["mixed_precision"] == "bf16"
    assert "bf16 autocast" in script.results_markdown([results])
    assert "autocast" not in script.results_markdown([{**results, "environment": {"mixed_precision": "no"}}])


def test_two_processes_split_the_global_batch(checkpoint: Path, tmp_path: Path) -> None:
    """torchrun, 2 CPU ranks: the same steps per epoch as one process; only the main process writes results."""
    output_dir = tmp_path / "ddp"
    command = torchrun_command(SCRIPT, *one_short_adaptation(checkpoint), "--output_dir", str(output_dir))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf_home")}
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert log.count("Results written to") == 1
    saved = json.loads((output_dir / "adaptation_results.json").read_text())
    assert saved["environment"]["world_size"] == 2
    assert saved["fast_adaptation"]["64"]["details"][0]["train_steps"] == 2  # 64 samples / global batch 32


def test_dataloader_workers_started_by_forkserver_unpickle_the_transform(
    checkpoint: Path, tmp_path: Path
) -> None:
    """Workers that do not fork get the dataset's transform pickled: it must be an object that pickles, not a closure
    ("Can't pickle local object 'make_transform.<locals>.transform'")."""
    args = [
        *one_short_adaptation(checkpoint),
        "--dataloader_num_workers",
        "1",
        "--output_dir",
        str(tmp_path / "out"),
    ]
    run_with_forkserver(SCRIPT, args, tmp_path)
    assert (tmp_path / "out" / "adaptation_results.json").is_file()


def test_dropped_functions_tries_every_choice_when_there_are_few(
    script: ModuleType, checkpoint: Path, tmp_path: Path
) -> None:
    args = ["--model_name_or_path", str(checkpoint), "--studies", "dropped_functions", "--dataset_source"]
    args += ["sklearn", "--dropped_draws", "10", "--max_eval_samples", "40", "--output_dir", str(tmp_path)]
    dropped = script.main(args)["dropped_functions"]
    assert [d[0] for d in dropped["1"]["draws"]] == [[0], [1], [2]]
    assert [d[0] for d in dropped["2"]["draws"]] == [[0, 1], [0, 2], [1, 2]]
    # Dropping nothing is the plain forward pass of the checkpoint on the processed test images.
    model = ni_hf.NeuralInterpreterForImageClassification.from_pretrained(str(checkpoint)).eval()
    test = script.load_task_split("sklearn_digits", "test", "sklearn", max_samples=40)
    batch = ni_hf.NeuralInterpreterImageProcessor()(
        images=list(test["image"]), do_patchify=False, return_tensors="pt"
    )
    with torch.no_grad():
        predictions = model(**batch, task_ids=torch.zeros(len(test), dtype=torch.long)).logits.argmax(-1)
    expected = (predictions == torch.tensor(list(test["label"]))).float().mean().item()
    assert dropped["0"]["accuracy"]["values"] == [pytest.approx(expected)]


# ----------------------------------------------------------------------------------------- argument checks


@pytest.fixture
def no_data_loading(script: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make loading data an error: the checks below must fail before it."""

    def refuse(*args, **kwargs):
        raise AssertionError("data were loaded before the arguments were checked")

    monkeypatch.setattr(script, "load_task_split", refuse)


def refusal(script: ModuleType, argv: list[str], capsys: pytest.CaptureFixture) -> str:
    """Run the script on ``argv``; it must exit with status 2 (a bad argument); return its stderr."""
    with pytest.raises(SystemExit) as exit_info:
        script.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "run_digits_adaptation.py: error: " in err
    return err


@pytest.mark.parametrize("path", ["absolute", "./does_not_exist", "~/does_not_exist_ni_hf", "a/b/c"])
def test_missing_local_checkpoint_is_named(
    script: ModuleType, no_data_loading, tmp_path: Path, capsys: pytest.CaptureFixture, path: str
) -> None:
    path = str(tmp_path / "does_not_exist") if path == "absolute" else path
    err = refusal(script, ["--model_name_or_path", path, "--output_dir", str(tmp_path / "out")], capsys)
    assert f"--model_name_or_path {path}: no such directory" in err
    assert script.check_model_path("namespace/name") == "namespace/name"  # a Hub repo id stays one
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="not a directory"):
        script.check_model_path(str(tmp_path / "file"))


BAD_ARGUMENTS = [
    (["--studies", "nope"], "--studies: unknown \\['nope'\\]"),
    (["--preset", "fast"], "--preset 'fast': expected one of \\['paper', 'quick'\\]"),
    (["--num_train_samples", "-5"], "--num_train_samples must be at least 1, got -5"),
    (["--num_train_samples", "32", "0", "64"], "--num_train_samples must be at least 1, got 0"),
    (["--num_train_samples", "32", "32"], "--num_train_samples 32 32: expected each value once"),
    (["--adaptation_seeds", "-1"], "--adaptation_seeds must be at least 0, got -1"),
    (["--capacity_new_functions", "-1"], "--capacity_new_functions must be at least 0, got -1"),
    (["--capacity_train_samples", "0"], "--capacity_train_samples must be at least 1, got 0"),
    (["--max_eval_samples", "0"], "--max_eval_samples must be at least 1, got 0"),
    (["--dropped_draws", "0"], "--dropped_draws must be at least 1, got 0"),
    (["--eval_batch_size", "0"], "--eval_batch_size must be at least 1, got 0"),
    (["--batch_size", "0"], "--batch_size must be at least 1, got 0"),
    (["--adapt_epochs", "0"], "--adapt_epochs must be a positive number, got 0.0"),
    (["--adapt_epochs", "nan"], "--adapt_epochs must be a positive number, got nan"),
    (["--adapt_learning_rate", "-0.05"], "--adapt_learning_rate must be a positive number, got -0.05"),
    (["--capacity_learning_rate", "inf"], "--capacity_learning_rate must be a positive number, got inf"),
    (
        ["--learning_rate", "0.1"],
        "--learning_rate 0.1: every fine-tuning run sets it; use --adapt_learning_rate",
    ),
    (
        ["--num_train_epochs", "5"],
        "--num_train_epochs 5.0: every fine-tuning run sets it; use --adapt_epochs",
    ),
    (["--per_device_train_batch_size", "4"], "--per_device_train_batch_size 4: .* use --batch_size"),
    (["--seed", "7"], "--seed 7: every fine-tuning run sets it; use --adaptation_seeds"),
    (["--lr_scheduler_type", "cosine"], "--lr_scheduler_type cosine: .* constant"),
    (["--dataloader_num_workers", "-2"], "--dataloader_num_workers must be at least 0, got -2"),
    (
        ["--num_train_epochs", "0"],
        "--num_train_epochs 0.0: every fine-tuning run sets it; use --adapt_epochs",
    ),
    (["--optim", "sgd"], "--optim sgd: every fine-tuning run sets it; use nothing: every run uses RAdam"),
    (["--radam", "false"], "--radam False: every fine-tuning run sets it; use nothing: every run uses RAdam"),
    (["--do_train", "false"], "--do_train False: .* use --studies dropped_functions,function_iterations"),
    (["--save_strategy", "steps"], "--save_strategy steps: .* a run keeps no model or checkpoint"),
    (
        ["--resume_from_checkpoint", "last"],
        "--resume_from_checkpoint: every run starts from --model_name_or_path",
    ),
    (["--max_train_minutes", "5"], "--max_train_minutes: the runs have no time limit"),
    (["--push_to_hub"], "--push_to_hub: the studies write results and plots, not a model"),
    (
        ["--new_task", "cifar10", "--dataset_source", "sklearn"],
        "--new_task cifar10: not a dataset of --dataset_source sklearn",
    ),
    (
        ["--capacity_new_functions", "0", "10000000"],
        "--batch_size 128 and --eval_batch_size 256 and --capacity_new_functions 10000000 need at least .* GiB for "
        "one batch; cpu has 8.0 GiB",
    ),
]


@pytest.mark.parametrize(("extra", "match"), BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS])
def test_a_bad_argument_is_refused_before_any_data_naming_the_option(
    script: ModuleType,
    checkpoint: Path,
    no_data_loading,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    extra: list[str],
    match: str,
) -> None:
    """Exit status 2 and a message on stderr that names the flag, before any data is loaded (a machine of 8 GiB)."""
    monkeypatch.setattr(ni_hf.training.run_setup, "total_memory", lambda device: 8 * 2**30)
    argv = [*sklearn_study_args(checkpoint), "--output_dir", str(tmp_path / "out"), *extra]
    err = refusal(script, argv, capsys)
    assert re.search(match, err), err
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def vit_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny multi-task ViT on scikit-learn's digits, saved as run_digits.py --architecture vit saves it."""
    config = TESTER.get_vit_config()
    path = tmp_path_factory.mktemp("vit")
    ni_hf.MultiTaskViTForImageClassification(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("folder", ["neural_interpreter", "vit"])
def test_weights_of_another_model_are_refused_naming_the_file(
    script: ModuleType,
    checkpoint: Path,
    vit_checkpoint: Path,
    no_data_loading,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    folder: str,
) -> None:
    """A checkpoint folder whose config is one architecture's and whose model.safetensors is the other's."""
    config_of, weights_of = (
        (checkpoint, vit_checkpoint) if folder == "neural_interpreter" else (vit_checkpoint, checkpoint)
    )
    mixed = tmp_path / "mixed"
    shutil.copytree(config_of, mixed)
    shutil.copyfile(weights_of / "model.safetensors", mixed / "model.safetensors")
    err = refusal(script, ["--model_name_or_path", str(mixed), "--output_dir", str(tmp_path / "out")], capsys)
    assert f"{mixed / 'model.safetensors'} does not fit" in err and "--allow_mismatched_weights" in err


def test_a_vit_checkpoint_runs_fast_adaptation_only_and_refuses_the_function_studies(
    script: ModuleType, vit_checkpoint: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    args = [
        "--model_name_or_path",
        str(vit_checkpoint),
        "--new_task",
        "sklearn_digits",
        "--dataset_source",
        "sklearn",
    ]
    err = refusal(script, [*args, "--studies", "dropped_functions", "--output_dir", str(tmp_path)], capsys)
    assert "is a multi-task ViT, and these studies act on a Neural Interpreter's functions" in err
    args += [
        "--use_cpu",
        "true",
        "--num_train_samples",
        "64",
        "--adaptation_seeds",
        "0",
        "--adapt_epochs",
        "1",
    ]
    results = script.main(
        [*args, "--batch_size", "32", "--max_eval_samples", "40", "--output_dir", str(tmp_path)]
    )
    assert results["architecture"] == "vit" and results["studies"] == ["fast_adaptation"]
    assert results["fast_adaptation"]["64"]["details"][0]["train_steps"] == 2


def test_a_nan_loss_is_logged_as_nan(script: ModuleType) -> None:
    """transformers' logging_nan_inf_filter would average a NaN loss away (and sync the GPU every step): off."""
    _, args = script.parse_args(["--model_name_or_path", "m", "--output_dir", "unused"])
    assert args.logging_nan_inf_filter is False


@pytest.mark.parametrize(
    ("source_args", "error"),
    [
        (["--dataset_source", "sklearn", "--data_dir", "/nonexistent"], "--data_dir only applies to"),
        (["--dataset_source", "hub", "--data_dir", "/nonexistent"], "--data_dir only applies to"),
        (["--dataset_source", "local"], "--dataset_source local needs --data_dir"),
    ],
)
def test_data_dir_goes_only_with_local_data(
    script: ModuleType,
    checkpoint: Path,
    no_data_loading,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    source_args: list[str],
    error: str,
) -> None:
    argv = ["--model_name_or_path", str(checkpoint), *source_args, "--output_dir", str(tmp_path)]
    assert error in refusal(script, argv, capsys)


def test_data_dir_alone_selects_local_data_as_in_run_digits(
    script: ModuleType, checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sklearn.datasets import load_digits

    data_dir = tmp_path / "data"
    bunch = load_digits()
    images = (bunch.images * (255 / 16)).round().astype("uint8")
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=[str(i) for i in range(10)])}
    )
    (data_dir / "mnist").mkdir(parents=True)
    for split, rows in (("train", slice(0, 40)), ("test", slice(40, 60))):
        data = {"image": list(images[rows]), "label": bunch.target[rows].tolist()}
        datasets.Dataset.from_dict(data, features=features).to_parquet(
            data_dir / "mnist" / f"{split}.parquet"
        )
    real = script.load_task_split

    def local_only(task, split, source, *args, **kwargs):
        assert source == "local", f"{task} ({split}) loaded from {source!r}, not from --data_dir"
        return real(task, split, source, *args, **kwargs)

    monkeypatch.setattr(script, "load_task_split", local_only)
    args = ["--model_name_or_path", str(checkpoint), "--new_task", "mnist", "--data_dir", str(data_dir)]
    args += ["--studies", "fast_adaptation", "--num_train_samples", "16", "--adaptation_seeds", "0"]
    args += [
        "--adapt_epochs",
        "1",
        "--batch_size",
        "16",
        "--use_cpu",
        "true",
        "--output_dir",
        str(tmp_path / "out"),
    ]
    results = script.main(args)
    assert results["arguments"]["dataset_source"] == "local"
    assert results["fast_adaptation"]["16"]["runs"] == 1
    resolve = script.resolve_dataset_source
    assert resolve(None, None) == "hub" and resolve("sklearn", None) == "sklearn"


def test_too_large_training_sizes_fail_before_any_run(
    script: ModuleType,
    checkpoint: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("a run started before the sizes were checked")

    monkeypatch.setattr(script, "finetune", refuse)
    args = sklearn_study_args(checkpoint)
    args += ["--studies", "fast_adaptation,capacity_extension", "--num_train_samples", "32", "2048", "5000"]
    args += ["--output_dir", str(tmp_path / "out")]
    expected = (
        "--num_train_samples 2048 5000 and --capacity_train_samples 8192: more than the 1437 images of the "
        "training split of sklearn_digits"
    )
    assert expected in refusal(script, args, capsys)
    assert not (tmp_path / "out").exists()
