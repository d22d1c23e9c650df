"""Every validation message of `gnn-dist train`, reached through the real argument parser.

Each row: the flags a user types, and the message that must name the problem
and its fix. A row whose check were deleted would validate cleanly and fail here.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from gnn_dist.cli import build_parser, train_config_from_args
from gnn_dist.config import SampledConfig, TrainConfig

SAMPLED = ["--mode", "sampled", "--fanouts", "5,5"]

CASES = [
    (["--mode", "batch"], "bad --mode 'batch': use --mode full or --mode sampled"),
    ([*SAMPLED, "--batch-norm"], "--batch-norm is for --mode full"),
    ([*SAMPLED, "--schedule", "stale:2"], "--schedule and --halo-dtype shape full-batch halo traffic"),
    ([*SAMPLED, "--halo-dtype", "int8"], "--schedule and --halo-dtype shape full-batch halo traffic"),
    (["--schedule", "fast"], "valid forms: exact, "),
    (["--halo-dtype", "fp8"], "bad --halo-dtype 'fp8': valid: fp32, fp16, bf16, int8"),
    (["--epochs", "-1"], "--epochs must be 0 or more, got -1"),
    (["--lr", "0"], "--lr must be a positive number, got 0.0"),
    (["--lr", "nan"], "--lr must be a positive number, got nan"),
    (["--lr", "inf"], "--lr must be a positive number, got inf"),
    (["--weight-decay", "-0.1"], "--weight-decay must be 0 or more, got -0.1"),
    (["--threads", "0"], "--threads must be at least 1, got 0"),
    (["--eval-every", "0"], "--eval-every must be at least 1, got 0"),
    (["--eval-chunk-nodes", "0"], "--eval-chunk-nodes must be at least 1, got 0"),
    (["--checkpoint-every", "0"], "--checkpoint-every must be at least 1, got 0"),
    (["--keep-checkpoints", "0"], "--keep-checkpoints must be at least 1, got 0"),
    (["--resume"], "--resume needs --checkpoint-dir DIR"),
    (["--timeout", "-1"], "--timeout must be auto, 0 (off) or positive seconds, got -1.0"),
    (["--task", "link", "--neg-ratio", "0"], "--neg-ratio must be at least 1 (negatives per positive), got 0"),
    (["--task", "link", "--predictions-out", "p.npy"], "for --task link, write embeddings with gnn-dist embed"),
    (["--hidden", "0"], "--hidden must be at least 1, got 0"),
    (["--num-layers", "0"], "--num-layers must be at least 1, got 0"),
    (["--dropout", "1.0"], "--dropout must lie in [0, 1), got 1.0"),
    (["--dropout", "-0.1"], "--dropout must lie in [0, 1), got -0.1"),
    (["--mode", "sampled", "--fanouts", "5,5,5"], "--fanouts has 3 values but the model has 2 layers"),
    (["--mode", "sampled", "--fanouts", "5,0"], "--fanouts must be positive integers, got [5, 0]"),
    ([*SAMPLED, "--batch-size", "0"], "--batch-size must be at least 1, got 0"),
    ([*SAMPLED, "--feature-cache-mb", "-1"], "--feature-cache-mb must be 0 or more, got -1.0"),
]
if not torch.cuda.is_available():  # with a GPU, --device cuda is a valid run
    CASES.append((["--device", "cuda"], "no CUDA device visible: run with --device cpu"))


def config_from(flags: list[str]) -> TrainConfig:
    return train_config_from_args(build_parser().parse_args(["train", "--parts", "unused", *flags]))


@pytest.mark.parametrize("flags, message", CASES, ids=[" ".join(flags) for flags, _ in CASES])
def test_each_bad_setting_is_one_clear_message(flags, message):
    with pytest.raises(ValueError) as caught:
        config_from(flags).validate()
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_defaults_of_both_modes_validate():
    config_from([]).validate()
    config_from(["--mode", "sampled", "--fanouts", "10,10"]).validate()
    TrainConfig(parts="unused").validate()


def test_sampling_strategy_is_checked_from_the_api_too():
    # the CLI restricts --sampling to its choices; a script using the API gets the same message from validate
    bad = dataclasses.replace(TrainConfig(parts="unused", mode="sampled"),
                              sampled=SampledConfig(fanouts=(5, 5), sampling="nearby"))
    with pytest.raises(ValueError, match="--sampling must be remote or local, got 'nearby'"):
        bad.validate()


@pytest.mark.parametrize("flags, message", [
    (["--fanouts", "10,x"], "expected one integer per layer separated by commas, like 15,10,5; got '10,x'"),
    (["--sampling", "nearby"], "invalid choice: 'nearby'"),
    (["--model", "gin"], "invalid choice: 'gin'"),
    (["--timeout", "soon"], "give auto or a number of seconds, got 'soon'"),
    (["--decoder", "cosine"], "invalid choice: 'cosine'"),
])
def test_malformed_flags_are_usage_errors(capsys, flags, message):
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["train", "--parts", "unused", *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
