"""benchmarks/gpu_dynamic_inference.sh (study (a) in one GPU call) dry-run on the CPU, and --max_train_minutes.

The data are scikit-learn's 8x8 digits written as tiny Parquet files in the Hub layout
``<dir>/<task>/{train,test}.parquet`` (columns image, label) for MNIST, MNIST-M and Fashion-MNIST, so that
neither ``../shared/data`` nor the network is needed.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path

import _scripts
import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_dynamic_inference.sh"
PLOT_SCRIPT = REPO / "examples" / "plot_adaptation_studies.py"
TINY_CONFIG = (
    "hidden_size=16,code_dim=8,num_function_iterations=1,num_functions=2,num_attention_heads=2,"
    "attention_head_size=4,type_inference_hidden_size=8,type_dim=4,patch_size=8"
)
SIZES = {  # (training, test) images per dataset: Fashion-MNIST needs the study's N = 64
    "mnist": (24, 10),
    "mnist_m": (24, 10),
    "fashion_mnist": (80, 20),
}


def write_tiny_data(root: Path) -> Path:
    """scikit-learn's digits as gray 'mnist' and 'fashion_mnist' and as RGB 'mnist_m', in the Hub Parquet layout."""
    from datasets import ClassLabel, Dataset, Features, Image
    from sklearn.datasets import load_digits

    bunch = load_digits()
    gray = np.round(bunch.images * (255 / 16)).astype(np.uint8)
    features = Features({"image": Image(), "label": ClassLabel(names=[str(i) for i in range(10)])})
    rng = np.random.default_rng(0)
    start = 0
    for task, splits in SIZES.items():
        for split, size in zip(("train", "test"), splits, strict=True):
            images = gray[start : start + size]
            if task == "mnist_m":
                background = rng.integers(0, 80, size=(size, 1, 1, 3))
                images = np.clip(images[..., None].astype(np.int16) + background, 0, 255).astype(np.uint8)
            labels = bunch.target[start : start + size].tolist()
            (root / task).mkdir(parents=True, exist_ok=True)
            Dataset.from_dict({"image": list(images), "label": labels}, features=features).to_parquet(
                root / task / f"{split}.parquet"
            )
            start += size
    return root


def test_the_dry_run_pretrains_adapts_and_plots_both_models(tmp_path: Path) -> None:
    """DRY_RUN=1: every step of the GPU call on the CPU, tiny, within a small budget; exit 0 with all outputs."""
    data = write_tiny_data(tmp_path / "data")
    out = tmp_path / "out"
    env = {
        **os.environ,
        "DRY_RUN": "1",
        "BUDGET_S": "240",
        "GPU_DATA": str(data),
        "PYTHON": sys.executable,
        "HF_HOME": str(tmp_path / "hf_home"),
        "MPLBACKEND": "Agg",
    }
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(out)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=400
    )
    log = proc.stdout + proc.stderr
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(out.glob("*.log")))
    assert proc.returncode == 0, log + logs
    assert "plan: 1 epochs of 32 images" in log, log
    assert "seeds 0," in log, log
    for name in ("ni", "vit"):
        model = out / f"{name}_pretrained"
        assert (model / "model.safetensors").is_file() and (model / "config.json").is_file()
        config = json.loads((model / "config.json").read_text())
        assert config["task_names"] == ["mnist", "mnistm"]
        assert "eval_accuracy" in json.loads((model / "eval_results.json").read_text())
        results = json.loads((out / f"{name}_adaptation" / "adaptation_results.json").read_text())
        assert "fast_adaptation" in results, results.keys()
        assert results["architecture"] == ("vit" if name == "vit" else "neural_interpreter")
        assert results["new_task"] == "fashion_mnist"
        assert list(results["fast_adaptation"]) == ["64"]
    assert (
        json.loads((out / "vit_pretrained" / "config.json").read_text())["model_type"]
        != json.loads((out / "ni_pretrained" / "config.json").read_text())["model_type"]
    )
    summary = (out / "summary.md").read_text()
    assert "Test accuracy overall" in summary and "fast adaptation" in summary.lower()
    if PLOT_SCRIPT.is_file():
        assert list((out / "plots").glob("*.png")), log
        assert (out / "plots" / "dynamic_inference.md").is_file(), log
    else:
        assert "no plots: examples/plot_adaptation_studies.py is not there" in log


def test_the_gpu_plan_passes_options_both_scripts_accept(tmp_path: Path) -> None:
    """PLAN_ONLY=1 prints the GPU call's command lines: the paper preset, bf16, CUDA graphs, the time guard, the
    epochs that fit, N = 64 ... 8192 and the paper's learning rates, each accepted by its script's parser."""
    data = write_tiny_data(tmp_path / "data")
    env = {**os.environ, "PLAN_ONLY": "1", "GPU_DATA": str(data), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    commands = dict(line[2:].split(": ", 1) for line in proc.stdout.splitlines() if line.startswith("+ "))
    assert sorted(commands) == ["ni_adapt", "ni_pretrain", "vit_adapt", "vit_pretrain"], proc.stdout
    assert not (tmp_path / "out" / "ni_pretrained").exists()
    run_digits = _scripts.load_script(REPO / "examples" / "run_digits.py", "run_digits")
    adaptation = _scripts.load_script(REPO / "examples" / "run_digits_adaptation.py", "run_digits_adaptation")
    # 48 training images; (210 s - 70 s of start-up and evaluation - 50 s of compilation) x 4,000 images/s
    epochs = (210 - 70 - 50) * 4000 // 48
    for name in ("ni", "vit"):
        argv = shlex.split(commands[f"{name}_pretrain"])
        assert argv[1:3] == ["-u", "examples/run_digits.py"]
        model_args, data_args, args = run_digits.parse_arguments([*argv[3:], "--use_cpu", "true"])
        run_digits.check_arguments(model_args, data_args, args)
        assert model_args.architecture == ("vit" if name == "vit" else "neural_interpreter")
        assert model_args.config_overrides is None and model_args.paper_config == "digits"
        assert (args.bf16, args.torch_compile, args.torch_compile_mode) == (True, True, "reduce-overhead")
        assert args.num_train_epochs == epochs and args.max_train_minutes == pytest.approx(140 / 60, abs=0.01)
        assert data_args.randaugment and args.per_device_train_batch_size == 128
        assert args.dataloader_drop_last and args.per_device_eval_batch_size == 20  # 40 test images

        argv = shlex.split(commands[f"{name}_adapt"])
        assert argv[1:3] == ["-u", "examples/run_digits_adaptation.py"]
        exp, base = adaptation.parse_args([*argv[3:], "--use_cpu", "true"])
        assert exp.studies == "fast_adaptation" and exp.new_task == "fashion_mnist"
        assert exp.num_train_samples == [64 * 2**i for i in range(8)]
        assert exp.adapt_learning_rate == (0.03 if name == "vit" else 0.05) and exp.adapt_epochs == 10
        assert exp.adaptation_seeds == [0, 1, 2]  # the whole budget is left when nothing runs
        assert exp.model_name_or_path == str(tmp_path / "out" / f"{name}_pretrained")
        assert base.bf16 and base.torch_compile


FAKE_PYTHON = """#!/usr/bin/env bash
# The scripts' stand-in: run_digits.py fails with --torch_compile_mode and otherwise "saves" a model at once;
# the adaptation and plot scripts write their files at once; anything else goes to the real interpreter.
out=$(printf '%s\\n' "$@" | grep -A1 -x -- --output_dir | tail -n 1)
case " $* " in
*" examples/run_digits.py "*)
    [[ " $* " == *" --torch_compile_mode "* ]] && { echo "CUDA graphs failed" >&2; exit 3; }
    mkdir -p "$out" && echo '{}' >"$out/config.json" && touch "$out/model.safetensors"
    echo "Test accuracy overall: 50.00% (3000 samples)" ;;
*" examples/run_digits_adaptation.py "*)
    mkdir -p "$out" && echo '{"fast_adaptation": {}}' >"$out/adaptation_results.json"
    echo "| N | accuracy |" >"$out/adaptation_results.md" ;;
*" examples/plot_adaptation_studies.py "*)
    mkdir -p "$out" && touch "$out/fast_adaptation.png" ;;
*) exec PYTHON "$@" ;;
esac
"""


def test_a_pretraining_that_fails_with_cuda_graphs_is_retried_without_them(tmp_path: Path) -> None:
    """The GPU call's control flow with stand-in scripts: a pre-training that fails under CUDA graphs runs again
    in inductor's default mode, its first log kept; the time left then gives three adaptation seeds."""
    data = write_tiny_data(tmp_path / "data")
    fake = tmp_path / "python"
    fake.write_text(FAKE_PYTHON.replace("PYTHON", sys.executable, 1))
    fake.chmod(0o755)
    out = tmp_path / "out"
    env = {**os.environ, "GPU_DATA": str(data), "PYTHON": str(fake), "NI_HF_COMMIT": "0123abc"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in ("ni", "vit"):
        assert f"{name}_pretrain failed with --torch_compile_mode reduce-overhead" in proc.stdout
        assert "CUDA graphs failed" in (out / f"{name}_pretrain.reduce-overhead.log").read_text()
        assert (out / f"{name}_pretrained" / "model.safetensors").is_file()
    assert "seeds 0 1 2, 10 epochs" in proc.stdout
    summary = (out / "summary.md").read_text()
    assert "- Test accuracy overall: 50.00%" in summary and "- plots/fast_adaptation.png" in summary
    assert summary.splitlines()[0].endswith(", commit 0123abc"), summary[
        :200
    ]  # the caller's, not the copy's .git


def test_an_unreadable_data_folder_stops_the_call_at_once(tmp_path: Path) -> None:
    """Without the Parquet files the plan cannot be made: exit 1 with a hint, before any training."""
    env = {**os.environ, "DRY_RUN": "1", "GPU_DATA": str(tmp_path / "nothing"), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1
    assert "prepare_device_files.sh" in proc.stdout
    assert not list((tmp_path / "out").glob("*_pretrain.log"))


# ------------------------------------------------------------------------------------------ --max_train_minutes


def test_max_train_minutes_stops_training_after_the_first_step(tmp_path: Path) -> None:
    """A budget spent before the first step ends stops training there, saves, evaluates, and says so."""
    import evaluate.config

    run_digits = _scripts.load_script(REPO / "examples" / "run_digits.py", "run_digits")
    data = write_tiny_data(tmp_path / "data")
    home = tmp_path / "hf_home"
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    # evaluate copies the metric script to its modules cache and imports it as package "evaluate_modules".
    saved = {name: mod for name, mod in sys.modules.items() if name.split(".")[0] == "evaluate_modules"}
    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HOME", str(home))
        for name, folder in (("HF_MODULES_CACHE", "modules"), ("HF_EVALUATE_CACHE", "evaluate"),
                             ("HF_METRICS_CACHE", "metrics")):  # fmt: skip
            patch.setattr(evaluate.config, name, home / folder)
        patch.setattr(sys, "path", [str(home / "modules"), *sys.path])
        for name in saved:
            del sys.modules[name]
        logging.getLogger().addHandler(handler)
        torch.set_num_threads(1)
        try:
            metrics = run_digits.main(
                [
                    "--output_dir", str(tmp_path / "out"), "--data_dir", str(data), "--task_names", "mnist",
                    "mnist_m", "--config_overrides", TINY_CONFIG, "--per_device_train_batch_size", "8",
                    "--num_train_epochs", "5", "--max_train_minutes", "0.0001", "--eval_strategy", "no",
                    "--save_strategy", "no", "--use_cpu", "true", "--randaugment", "false", "--report_to", "none",
                    "--disable_tqdm", "true",
                ]
            )  # fmt: skip
        finally:
            torch.set_num_threads(threads)
            logging.getLogger().removeHandler(handler)
            for name in [name for name in sys.modules if name.split(".")[0] == "evaluate_modules"]:
                del sys.modules[name]
            sys.modules.update(saved)
    assert metrics["global_step"] == 1  # of 5 epochs x 6 batches
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert "eval_accuracy" in metrics
    stops = [m for m in messages if "stopped training early" in m]
    assert len(stops) == 1, messages
    assert "--max_train_minutes 0.0001" in stops[0] and "at step 1 of 30 (epoch 0.17 of 5)" in stops[0]


def test_max_train_minutes_refuses_a_non_positive_budget() -> None:
    from ni_hf.training import callbacks

    with pytest.raises(ValueError, match="--max_train_minutes 0: must be a positive"):
        callbacks.time_limit_callbacks(0)
    assert callbacks.time_limit_callbacks(None) == []
