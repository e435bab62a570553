"""Fast fine-tuning: AdaRound and AdaQuant layer by layer (``include_fast_ft``; PyTorch)."""

from __future__ import annotations

from raysearch.quantize.techniques.fast_finetune._fast_finetune import (
    FastFinetune,
    FinetuneOptions,
    finetune_model,
    finetune_options,
)

__all__ = ["FastFinetune", "FinetuneOptions", "finetune_options", "finetune_model"]
