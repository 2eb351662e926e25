"""benchmarks/gpu_pgm.sh (PGM at the paper's size in one GPU call): its plan, its control flow with stand-in
scripts, and a dry run on the CPU."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from _scripts import load_script

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_pgm.sh"


def plan(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """PLAN_ONLY=1: the call's plan and command lines, nothing run."""
    env = {
        **os.environ,
        "PLAN_ONLY": "1",
        "RUNS_DIR": str(tmp_path / "runs"),
        "PYTHON": sys.executable,
        **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=60
    )


def commands_of(stdout: str) -> dict[str, list[str]]:
    return {
        name: shlex.split(command)
        for name, command in (
            line[2:].split(": ", 1) for line in stdout.splitlines() if line.startswith("+ ")
        )
    }


def test_the_gpu_plan_trains_the_papers_models_side_by_side_on_each_regime(tmp_path: Path) -> None:
    """The paper's per-regime Neural Interpreter and the ViT, bf16, the epochs that fit each regime's share of the
    call, the time guard, DataLoader workers; every command line accepted by run_pgm.py's parser."""
    from ni_hf import MultiTaskViTConfig, NeuralInterpreterConfig

    proc = plan(tmp_path, REGIMES="neutral attr.rels")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    commands = commands_of(proc.stdout)
    assert list(commands) == ["neutral_ni", "neutral_vit", "attr.rels_ni", "attr.rels_vit"], proc.stdout
    # (540 s - 30 s for the plots) / 2 regimes = 255 s a stage, 100 s of it start-up and evaluation: 155 s of
    # training at 330 puzzles/s (the H200's measured speed) of 20,000 puzzles = 2 epochs.
    assert "plan: neutral: 2 epochs of 20000 puzzles" in proc.stdout
    run_pgm = load_script(REPO / "examples" / "run_pgm.py", "run_pgm")
    for name, argv in commands.items():
        regime, model = name.rsplit("_", 1)
        assert argv[1:3] == ["-u", "examples/run_pgm.py"]
        model_args, data_args, args = run_pgm.parse_arguments([*argv[3:], "--use_cpu", "true"])
        assert model_args.preset == "paper" and model_args.config_overrides is None
        assert model_args.architecture == ("vit" if model == "vit" else "neural_interpreter")
        assert (data_args.dataset_source, data_args.regime, data_args.max_triples) == ("generated", regime, 4)
        assert (data_args.num_train_puzzles, data_args.num_eval_puzzles) == (20_000, 1_000)
        assert args.bf16 and not args.torch_compile and args.per_device_train_batch_size == 72
        assert args.num_train_epochs == 2 and args.max_train_minutes == pytest.approx(155 / 60, abs=0.02)
        assert args.dataloader_num_workers == 7 and not args.dataloader_persistent_workers
        assert args.eval_strategy == "no" and args.save_strategy == "no" and args.anytime
        assert args.output_dir == str(tmp_path / "runs" / regime / model)
        config = run_pgm.build_config(model_args, regime)
        expected = (
            MultiTaskViTConfig.from_paper("pgm")
            if model == "vit"
            else NeuralInterpreterConfig.from_paper("pgm", regime=regime)
        )
        assert config.to_dict() == expected.to_dict()
    assert not (tmp_path / "runs" / "neutral").exists()


def test_a_regime_without_time_to_train_is_skipped_and_epochs_can_be_set(tmp_path: Path) -> None:
    """A stage too short for TAIL_S + MIN_TRAIN_S is skipped, not started, and leaves its time to the next."""
    proc = plan(tmp_path, REGIMES="neutral attr.rels", BUDGET_S="300", EPOCHS="2", COMPILE="1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "!! neutral skipped" in proc.stdout and "135s left for its stage" in proc.stdout
    commands = commands_of(proc.stdout)
    assert list(commands) == ["attr.rels_ni", "attr.rels_vit"]
    assert "plan: attr.rels: 2 epochs" in proc.stdout and "stage 270s" in proc.stdout
    argv = commands["attr.rels_ni"]
    assert argv[argv.index("--torch_compile") + 1] == "true"
    assert argv[argv.index("--max_train_minutes") + 1] == "2.83"  # 270 s - 100 s


def write_templates(folder: Path) -> Path:
    """Results a stand-in run_pgm.py copies: <regime>_<architecture>.json."""
    folder.mkdir()
    for regime in ("neutral", "attr.rels"):
        for architecture, accuracy in (("neural_interpreter", 0.6), ("vit", 0.5)):
            split = {"loss": 1.0, "accuracy": accuracy, "num_samples": 1000}
            results = {
                "train": {"train_runtime": 300.0, "epoch": 3.0},
                "val": split,
                "test": {**split, "accuracy": accuracy / 2, "loss": 2.0},
                "architecture": architecture,
                "regime": regime,
                "dataset_source": "generated",
                "preset": "paper",
                "sizes": {"train": 20000, "val": 1000, "test": 1000},
                "max_triples": 4,
            }
            if architecture == "neural_interpreter":
                results["anytime"] = [
                    {
                        "function_iterations": k,
                        "val_accuracy": accuracy * k / 8,
                        "test_accuracy": accuracy * k / 16,
                    }
                    for k in range(1, 9)
                ]
            (folder / f"{regime}_{architecture}.json").write_text(json.dumps(results))
    return folder


STAND_IN_PYTHON = """#!/usr/bin/env bash
# The scripts' stand-in: the check of the packages passes, run_pgm.py "trains" at once (copying a results file)
# or fails for FAIL_RUN=<regime>_<architecture>; anything else (plot_pgm.py) goes to the real interpreter.
value() { local flag=$1; shift; while [ $# -gt 1 ]; do [ "$1" = "$flag" ] && echo "$2"; shift; done; }
case " $* " in
*" -c "*) echo "torch (stand-in)" ;;
*" examples/run_pgm.py "*)
    out=$(value --output_dir "$@") run=$(value --regime "$@")_$(value --architecture "$@")
    [ "$run" = "${FAIL_RUN:-}" ] && { echo "RuntimeError: CUDA error: out of memory" >&2; exit 1; }
    mkdir -p "$out" && cp "TEMPLATES/$run.json" "$out/pgm_results.json" && touch "$out/model.safetensors"
    echo "{'train_runtime': '300.0', 'train_samples_per_second': '200.0', 'epoch': '3'}"
    echo "test (out of distribution): accuracy 30.00% of 1000 puzzles" ;;
*) exec PYTHON "$@" ;;
esac
"""


def test_the_call_tabulates_the_runs_that_finished_and_names_the_missing_ones(tmp_path: Path) -> None:
    """With stand-in runs, one failing: the tables, plots, summary and runs.tar.gz of the others, exit 1 naming
    the missing result; OUT_DIR holds few enough files for a device call to bring back."""
    templates = write_templates(tmp_path / "templates")
    fake = tmp_path / "python"
    fake.write_text(STAND_IN_PYTHON.replace("TEMPLATES", str(templates)).replace("PYTHON", sys.executable, 1))
    fake.chmod(0o755)
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = {**os.environ, "PYTHON": str(fake), "RUNS_DIR": str(runs), "REGIMES": "neutral attr.rels"}
    env |= {"FAIL_RUN": "attr.rels_vit", "MPLBACKEND": "Agg"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "!! missing: attr.rels/vit/pgm_results.json" in proc.stdout
    assert "attr.rels_vit exited 1" in proc.stdout and "CUDA error: out of memory" in proc.stdout
    files = sorted(path.name for path in out.iterdir())
    assert files == [
        "call.log", "pgm_accuracy.png", "pgm_anytime.png", "pgm_summary.json", "pgm_tables.md", "runs.tar.gz",
        "summary.md",
    ]  # fmt: skip
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", name) for name in files)
    summary = json.loads((out / "pgm_summary.json").read_text())
    assert [(g["architecture"], g["regime"]) for g in summary["groups"]] == [
        ("neural_interpreter", "neutral"),
        ("vit", "neutral"),
        ("neural_interpreter", "attr.rels"),
    ]
    text = (out / "summary.md").read_text()
    assert "## neutral, ni: training and accuracy" in text and "- {'train_runtime': '300.0'" in text
    assert "### Accuracy, test (out of distribution)" in text and "| neutral | 30.0 (1) | 25.0 (1) |" in text
    with tarfile.open(out / "runs.tar.gz") as archive:
        names = set(archive.getnames())
    assert {"neutral/ni/pgm_results.json", "attr.rels_vit.log", "plots.log"} <= names
    assert not any(name.endswith(".safetensors") for name in names)  # weights only with KEEP_WEIGHTS=1


def test_an_interpreter_without_the_packages_stops_the_call_at_once(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\necho \"ModuleNotFoundError: No module named 'datasets'\" >&2\nexit 1\n"
    )
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake), "RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 1
    assert "No module named 'datasets'" in proc.stdout and "prepare_device_files.sh" in proc.stdout
    assert not list((tmp_path / "runs").iterdir())


@pytest.mark.slow  # 1 to 3 minutes on 2 cores (two run_pgm.py runs side by side, then the plots)
def test_the_dry_run_trains_both_models_and_writes_the_tables_plots_and_summary(tmp_path: Path) -> None:
    """DRY_RUN=1: every step of the GPU call on the CPU, --preset quick sized; exit 0 with every output."""
    out, runs = tmp_path / "out", tmp_path / "runs"
    env = {**os.environ, "DRY_RUN": "1", "PYTHON": sys.executable, "RUNS_DIR": str(runs)}
    env |= {"HF_HOME": str(tmp_path / "hf_home"), "MPLBACKEND": "Agg", "NI_HF_COMMIT": "0123abc"}
    proc = subprocess.run(
        ["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=400
    )
    logs = "".join(f"\n--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(runs.glob("*.log")))
    assert proc.returncode == 0, proc.stdout + proc.stderr + logs
    assert "plan: neutral: 1 epochs of 64 puzzles, 32 val and test puzzles" in proc.stdout
    for name, architecture in (("ni", "neural_interpreter"), ("vit", "vit")):
        results = json.loads((runs / "neutral" / name / "pgm_results.json").read_text())
        assert (results["architecture"], results["preset"], results["regime"]) == (
            architecture,
            "quick",
            "neutral",
        )
        assert results["sizes"] == {"train": 64, "val": 32, "test": 32}
        assert ("anytime" in results) == (name == "ni")
    summary = json.loads((out / "pgm_summary.json").read_text())
    assert [g["architecture"] for g in summary["groups"]] == ["neural_interpreter", "vit"]
    assert (out / "pgm_accuracy.png").stat().st_size > 0 and (out / "pgm_anytime.png").stat().st_size > 0
    text = (out / "summary.md").read_text()
    assert text.startswith("# PGM on one GPU: ") and text.splitlines()[0].endswith(", commit 0123abc"), text[
        :200
    ]
    assert "val (in distribution): accuracy" in text and "## Anytime inference" in text.replace("###", "##")
