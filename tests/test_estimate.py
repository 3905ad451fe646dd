"""The memory estimator against hand computations, and `gpusched estimate` itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpusched.cli.sizing import estimate, parse_params
from gpusched.core.errors import UsageError

GiB = 2**30
MiB = 2**20
CONTEXT = 512 * MiB


def test_7b_bf16_adamw_by_hand() -> None:
    # 7e9 parameters in bf16 (2 bytes), trained with AdamW, moments and master copy in fp32:
    #   weights          7e9 x 2             = 14e9 bytes
    #   gradients        7e9 x 2             = 14e9
    #   optimizer state  7e9 x 4 x 2 moments = 56e9
    #   master weights   7e9 x 4             = 28e9     (16 bytes per parameter so far)
    #   activations      8 x 1.2G            = 8 x int(1.2 x 2^30) = 8 x 1288490188
    #                                        = 10307921504
    #   CUDA context     512 MiB             = 536870912
    #   total  = 112e9 + 10307921504 + 536870912 = 122844792416 bytes = 114.4 GiB
    #   --mem  = total x 1.1 = 135129271657.6 bytes = 125.85 GiB -> rounded up: 126G
    result = estimate(parse_params("7B"), "bf16", "adamw", batch=8, per_sample_bytes=int(1.2 * GiB))
    assert result.weights == 14 * 10**9
    assert result.gradients == 14 * 10**9
    assert result.optimizer_state == 56 * 10**9
    assert result.master_weights == 28 * 10**9
    assert result.activations == 10307921504
    assert result.context == 536870912
    assert result.total == 122844792416
    assert result.suggested_mem == 126 * GiB


def test_1_3b_fp16_inference_by_hand() -> None:
    # weights 1.3e9 x 2 = 2.6e9; no gradients, optimizer or master copy; batch 4 x 256M;
    # context 512M. Total 2.6e9 + 1 GiB + 512 MiB = 4210612736 bytes (3.92 GiB);
    # x 1.1 = 4.31 GiB -> 5G.
    result = estimate(parse_params("1.3B"), "fp16", None, batch=4, per_sample_bytes=256 * MiB)
    assert (result.gradients, result.optimizer_state, result.master_weights) == (0, 0, 0)
    assert result.total == 2_600_000_000 + GiB + CONTEXT
    assert result.suggested_mem == 5 * GiB
    assert [row[0] for row in result.rows()] == ["weights", "activations", "CUDA context"]


@given(st.integers(min_value=1, max_value=10**12))
def test_fp32_training_is_2x_3x_4x_the_weights(params: int) -> None:
    # FIELD.md: SGD x2 (weights + gradients), SGD with momentum x3, Adam/AdamW x4.
    for optimizer, factor in (("sgd", 2), ("sgd-momentum", 3), ("adam", 4), ("adamw", 4)):
        result = estimate(params, "fp32", optimizer, context_bytes=0)
        assert result.master_weights == 0
        assert result.total == factor * 4 * params


@given(st.integers(min_value=1, max_value=10**12), st.sampled_from(["fp16", "bf16"]))
def test_half_precision_training_keeps_an_fp32_master_copy(params: int, dtype: str) -> None:
    result = estimate(params, dtype, "adamw", context_bytes=0)
    assert result.master_weights == 4 * params
    assert result.total == 16 * params  # 2 + 2 + 8 + 4 bytes per parameter


@pytest.mark.parametrize(
    ("text", "count"),
    [("7B", 7 * 10**9), ("1.3b", 1_300_000_000), ("350M", 350 * 10**6), ("125000000", 125 * 10**6),
     ("7e9", 7 * 10**9), ("1.5T", 15 * 10**11), ("20K", 20_000)],
)  # fmt: skip
def test_parse_params(text: str, count: int) -> None:
    assert parse_params(text) == count


@pytest.mark.parametrize("text", ["", "7X", "-1B", "0", "B"])
def test_parse_params_refuses_nonsense(text: str) -> None:
    with pytest.raises(UsageError):
        parse_params(text)


def test_bad_inputs_are_usage_errors_with_the_choices() -> None:
    with pytest.raises(UsageError, match="expected one of fp32"):
        estimate(10, "fp64")
    with pytest.raises(UsageError, match="expected one of sgd"):
        estimate(10, "fp32", "lion")
    with pytest.raises(UsageError, match="--inference"):
        estimate(10, "int8", "adamw")
    assert estimate(10, "int4", None, context_bytes=0).total == 5
    assert estimate(10, "bfloat16", "momentum", context_bytes=0).total == 2 * 10 + 2 * 10 + 40 + 40


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpusched", "estimate", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_estimate_command_prints_the_breakdown_and_a_mem_without_a_daemon() -> None:
    result = cli("--params", "7B", "--dtype", "bf16", "--optimizer", "adamw", "--batch", "8",
                 "--per-sample", "1.2G")  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    parts = [line.split()[0] for line in lines[2:9]]
    assert parts == ["weights", "gradients", "optimizer", "master", "activations", "CUDA", "total"]
    assert lines[9] == "suggested: --mem 126G (total + 10%, rounded up)"
    assert "note: no single GPU holds this" not in result.stdout
    data = json.loads(cli("--params", "7B", "--dtype", "bf16", "--json").stdout)
    assert data["total"] == 112 * 10**9 + CONTEXT
    assert data["suggested_mem"] == 116 * GiB  # 104.8 GiB x 1.1 = 115.3 -> 116
    huge = cli("--params", "70B", "--dtype", "bf16")
    assert "note: no single GPU holds this" in huge.stdout
    assert "optimizer state  params x 4 bytes x moments" in cli("--help").stdout


def test_estimate_command_refuses_bad_usage_with_exit_2() -> None:
    for args in ((), ("--params", "7Q"), ("--params", "7B", "python"), ("--history",)):
        result = cli(*args)
        assert result.returncode == 2, (args, result.stderr)
        assert result.stderr.startswith("gpusched: ")


def test_a_parameter_count_past_a_float_is_a_usage_error() -> None:
    # Before: OverflowError (a traceback) from round(inf).
    with pytest.raises(UsageError, match="too large"):
        parse_params("1e400")


def test_estimate_labels_its_units_and_checks_the_suggestion_against_this_servers_cards(
    daemon_factory: Any,
) -> None:
    """14 GB of bf16 weights is 13.0 GiB, said so (not a bare "13G"); a suggestion no card
    of this server holds is said to be too large for them, one that fits says where."""
    alone = cli("--params", "7B", "--dtype", "bf16")
    weights = next(line for line in alone.stdout.splitlines() if line.split()[:1] == ["weights"])
    assert "13.0 GiB" in weights
    assert "GB: 10^9 bytes" in alone.stdout
    daemon = daemon_factory(simulate="2x24G").start()
    env = {**os.environ, "GPUSCHED_CONFIG": str(daemon.config_path)}
    big = daemon.cli("estimate", "--params", "7B", "--dtype", "bf16", env=env)
    assert "note: no GPU here holds this: the largest is GPU 0" in big.stdout, big.stdout
    assert "24.0 GiB" in big.stdout
    small = daemon.cli("estimate", "--params", "1B", "--dtype", "bf16", "--inference", env=env)
    assert "here: 2 of 2 GPU(s) hold it" in small.stdout, small.stdout
