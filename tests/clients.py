"""The language-model clients a search's folders are for, run in their own environments:
onnxruntime-genai (``og.Model`` + ``og.Generator``) and Optimum (``ORTModelForCausalLM``).
Each needs the ``onnxruntime`` distribution, and Optimum pins transformers 4, so neither
lives in raysearch's environment (``requirements/*-client.txt``; the README's test command
makes ``.venv-genai`` and ``.venv-optimum``). ``RAYSEARCH_GENAI_PYTHON`` and
``RAYSEARCH_OPTIMUM_PYTHON`` name other interpreters. A missing client skips its tests, except
in CI (``CI`` set), where that fails.

Example:
    >>> generate("genai", out / "best", 100)        # doctest: +SKIP
    100
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The project's shared models (``../shared/models`` beside the checkout, as CI lays it out).
SHARED_MODELS = Path(os.environ.get("RAYSEARCH_SHARED_MODELS", REPO.parent / "shared" / "models"))
BYTELLAMA = SHARED_MODELS / "bytellama"
BYTEGPT = SHARED_MODELS / "bytegpt"

_ENVIRONMENTS = {"genai": ".venv-genai", "optimum": ".venv-optimum"}

#: Loads the folder, decodes greedily from a prompt of bytes for exactly N new tokens, prints
#: {"new_tokens": N}.
_GENERATE = {
    "genai": """
import json, sys, onnxruntime_genai as og
model = og.Model(sys.argv[1])
params = og.GeneratorParams(model)
prompt, n = list(b"def main():\\n    "), int(sys.argv[2])
params.set_search_options(
    max_length=len(prompt) + n, min_length=len(prompt) + n, do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens(prompt)
while not generator.is_done():
    generator.generate_next_token()
print(json.dumps({"new_tokens": len(generator.get_sequence(0)) - len(prompt)}))
""",
    "optimum": """
import json, sys, torch
from optimum.onnxruntime import ORTModelForCausalLM
model = ORTModelForCausalLM.from_pretrained(sys.argv[1])
ids, n = torch.tensor([list(b"def main():\\n    ")]), int(sys.argv[2])
out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                     min_new_tokens=n, do_sample=False)
print(json.dumps({"new_tokens": out.shape[1] - ids.shape[1]}))
""",
}


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def client_python(kind: str) -> Path:
    """The interpreter with the client ``kind`` (``genai`` or ``optimum``); skips (fails in
    CI) when there is none."""
    named = os.environ.get(f"RAYSEARCH_{kind.upper()}_PYTHON")
    python = Path(named) if named else REPO / _ENVIRONMENTS[kind] / "bin" / "python"
    if not python.exists():
        message = f"no {kind} client environment: {python} (requirements/{kind}-client.txt)"
        if _in_ci():
            pytest.fail(f"CI: {message}")
        pytest.skip(message)
    return python


def _run(kind: str, args: list[str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    return subprocess.run(
        [str(client_python(kind)), *args], capture_output=True, text=True, timeout=600, env=env
    )


def generate(kind: str, folder: Path, tokens: int) -> int:
    """The number of tokens the client ``kind`` decodes from ``folder`` when asked for
    ``tokens``; the test fails with the client's error when it cannot load or decode it."""
    done = _run(kind, ["-c", _GENERATE[kind], str(folder), str(tokens)])
    assert done.returncode == 0, done.stderr[-3000:]
    return int(json.loads(done.stdout.strip().splitlines()[-1])["new_tokens"])


def export_optimum(checkpoint: Path, out: Path) -> Path:
    """``optimum-cli export onnx --task text-generation-with-past`` of the Hugging Face
    ``checkpoint`` into ``out``, with its tokenizer files copied (Optimum does not)."""
    done = _run("optimum", [
        "-m", "optimum.commands.optimum_cli", "export", "onnx", "--model", str(checkpoint),
        "--task", "text-generation-with-past", str(out),
    ])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for item in checkpoint.glob("tokenizer*"):
        shutil.copyfile(item, out / item.name)
    return out
