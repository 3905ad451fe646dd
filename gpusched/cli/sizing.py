"""How much GPU memory a model needs: weights, gradients, optimizer state, activations. Pure.

The rule of thumb (FIELD.md), per GPU, for one process that holds the whole model:

    weights          = P x bytes per value of the weights' dtype (fp32 4, fp16/bf16 2, ...)
    gradients        = P x the same bytes (training only: one gradient per weight)
    optimizer state  = P x 4 bytes x moments (states kept in fp32: SGD 0, SGD with
                       momentum 1, Adam/AdamW 2)
    master weights   = P x 4 bytes when training in half precision: mixed precision
                       keeps an fp32 copy of the weights for the optimizer to update
    activations      = batch x per-sample (measure it: memory at two batch sizes gives
                       the fixed part and the per-sample slope)
    CUDA context     = a few hundred MB per process (512M by default) before any tensor

In fp32 this is FIELD.md's "x2 for SGD, x3 for SGD with momentum, x4 for Adam of the
weight memory, weights included"; in bf16 with AdamW it is the usual 16 bytes per
parameter (2 + 2 + 4 x 2 + 4). Inference (`training=False`) keeps weights, activations
and the context only.

The suggested --mem is the total plus 10 %, rounded up (`gpusched.core.hints.suggest_mem`,
the same rule as for a measured peak): the caching allocator rounds blocks up and
fragments, so a job needs somewhat more than the sum of its tensors.

Imported by the CLI: stdlib and gpusched.core.errors/units/hints only.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from gpusched.core.errors import UsageError
from gpusched.core.hints import suggest_mem
from gpusched.core.units import format_size

MiB = 2**20
DEFAULT_CONTEXT_BYTES = 512 * MiB
STATE_BYTES = 4  # optimizer moments and the master copy are kept in fp32

DTYPES: dict[str, float] = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
DTYPE_ALIASES = {
    "float32": "fp32",
    "float": "fp32",
    "tf32": "fp32",
    "float16": "fp16",
    "half": "fp16",
    "bfloat16": "bf16",
}
QUANTIZED = {"fp8", "int8", "int4"}  # inference formats here: no training in them

# Optimizer -> fp32 moments kept per parameter.
OPTIMIZERS: dict[str, int] = {"sgd": 0, "sgd-momentum": 1, "adam": 2, "adamw": 2}
OPTIMIZER_ALIASES = {"momentum": "sgd-momentum", "sgdm": "sgd-momentum"}
OPTIMIZER_NAMES = {
    "sgd": "SGD",
    "sgd-momentum": "SGD with momentum",
    "adam": "Adam",
    "adamw": "AdamW",
}

_PARAMS_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?(?:e[0-9]+)?)\s*([KMBT]?)\s*$", re.IGNORECASE)
_PARAMS_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def parse_params(text: str | int) -> int:
    """ "7B" -> 7_000_000_000; "350M", "1.3B", "125000000", "7e9". Decimal, as models are named."""
    if isinstance(text, int) and not isinstance(text, bool):
        value = text
    else:
        match = _PARAMS_RE.match(str(text))
        if not match:
            raise UsageError(
                f"invalid parameter count {text!r}: expected e.g. 7B, 350M or 125000000"
            )
        number, suffix = match.groups()
        scaled = float(number) * _PARAMS_SUFFIX[suffix.upper()]
        if not math.isfinite(scaled):  # 1e400: infinity, which round() cannot make an int
            raise UsageError(f"invalid parameter count {text!r}: too large")
        value = round(scaled)
    if value <= 0:
        raise UsageError(f"invalid parameter count {text!r}: must be more than zero")
    return value


def params_text(params: int) -> str:
    for suffix, scale in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if params >= scale:
            return f"{params / scale:.3g}{suffix}"
    return str(params)


def normalize_dtype(name: str) -> str:
    key = DTYPE_ALIASES.get(name.lower(), name.lower())
    if key not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}: expected one of {', '.join(DTYPES)}")
    return key


def normalize_optimizer(name: str) -> str:
    key = OPTIMIZER_ALIASES.get(name.lower(), name.lower())
    if key not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer {name!r}: expected one of {', '.join(OPTIMIZERS)}")
    return key


@dataclass(frozen=True)
class Estimate:
    params: int
    dtype: str
    optimizer: str | None  # None: inference
    batch: int
    per_sample_bytes: int | None
    weights: int
    gradients: int
    optimizer_state: int
    master_weights: int
    activations: int
    context: int

    @property
    def training(self) -> bool:
        return self.optimizer is not None

    @property
    def total(self) -> int:
        return (
            self.weights
            + self.gradients
            + self.optimizer_state
            + self.master_weights
            + self.activations
            + self.context
        )

    @property
    def suggested_mem(self) -> int:
        return suggest_mem(self.total)

    def rows(self) -> list[tuple[str, int, str]]:
        """(part, bytes, how it was computed) for each part that applies."""
        p, per = params_text(self.params), DTYPES[self.dtype]
        rows = [("weights", self.weights, f"{p} x {per:g} bytes ({self.dtype})")]
        if self.optimizer is not None:
            moments = OPTIMIZERS[self.optimizer]
            name = OPTIMIZER_NAMES[self.optimizer]
            rows.append(("gradients", self.gradients, f"{p} x {per:g} bytes, one per weight"))
            rows.append(
                (
                    "optimizer state",
                    self.optimizer_state,
                    f"{name}: {moments} fp32 moment(s) x {p} x {STATE_BYTES} bytes",
                )
            )
            if self.master_weights:
                rows.append(
                    (
                        "master weights",
                        self.master_weights,
                        f"fp32 copy kept by mixed precision: {p} x {STATE_BYTES} bytes",
                    )
                )
        if self.per_sample_bytes is not None:
            per_sample = format_size(self.per_sample_bytes, tabular=False)
            how = f"batch {self.batch} x {per_sample} per sample"
        else:
            how = "not counted: give --batch and --per-sample"
        rows.append(("activations", self.activations, how))
        rows.append(("CUDA context", self.context, "per process, before any tensor"))
        return rows

    def to_json(self) -> dict[str, object]:
        return {
            "params": self.params,
            "dtype": self.dtype,
            "optimizer": self.optimizer,
            "training": self.training,
            "batch": self.batch,
            "per_sample": self.per_sample_bytes,
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer_state": self.optimizer_state,
            "master_weights": self.master_weights,
            "activations": self.activations,
            "context": self.context,
            "total": self.total,
            "suggested_mem": self.suggested_mem,
        }


def estimate(
    params: int,
    dtype: str = "fp32",
    optimizer: str | None = "adamw",
    *,
    batch: int = 1,
    per_sample_bytes: int | None = None,
    context_bytes: int = DEFAULT_CONTEXT_BYTES,
) -> Estimate:
    """The memory one process needs; `optimizer=None` means inference (no gradients)."""
    dtype = normalize_dtype(dtype)
    if params <= 0:
        raise UsageError("the parameter count must be more than zero")
    if batch < 1:
        raise UsageError("--batch must be at least 1")
    if context_bytes < 0:
        raise UsageError("the CUDA context size must not be negative")
    per_value = DTYPES[dtype]
    weights = math.ceil(params * per_value)
    gradients = optimizer_state = master = 0
    if optimizer is not None:
        optimizer = normalize_optimizer(optimizer)
        if dtype in QUANTIZED:
            raise UsageError(
                f"{dtype} weights are for inference here: add --inference, or train in"
                " fp32, fp16 or bf16"
            )
        gradients = weights
        optimizer_state = params * STATE_BYTES * OPTIMIZERS[optimizer]
        master = params * STATE_BYTES if per_value < STATE_BYTES else 0
    activations = batch * per_sample_bytes if per_sample_bytes is not None else 0
    return Estimate(
        params=params,
        dtype=dtype,
        optimizer=optimizer,
        batch=batch,
        per_sample_bytes=per_sample_bytes,
        weights=weights,
        gradients=gradients,
        optimizer_state=optimizer_state,
        master_weights=master,
        activations=activations,
        context=context_bytes,
    )
