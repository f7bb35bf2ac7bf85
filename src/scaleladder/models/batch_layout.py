"""What a synthetic batch holds, as numbers: torch-free, so the memory planner can
import the very constants the batch generator uses (the workflow plans on a login node
that may have no torch). ``scaleladder.rung.batches`` makes the tensors from these."""

from __future__ import annotations

from scaleladder.flavors import Flavor

# Token ids shared with the real tokenizer's special tokens (data/tokenizer.py).
PAD, MASK, FIRST_WORD = 0, 4, 5
MASKED_PATCH_FRACTION = 75 / 196  # FLAVA pretraining: 75 of 196 patches
MLM_FRACTION = 0.15
ITM_NEGATIVE_EVERY = 10
# Batches held on the device for the whole run. Every one of them counts in the peak
# memory the rung reports and so lowers its max batch: a pool of 8 ViT-Huge batches of
# 64 fp32 images is 8 × 37 MiB that no real input pipeline keeps resident. Two still vary
# the data between consecutive steps (a loss that stays finite on one repeated batch
# proves less). The planner counts exactly this many; docs/metrics.md says so.
SYNTHETIC_POOL = 2


def masked_counts(flavor: Flavor) -> tuple[int, int]:
    """(masked text tokens, masked patches) per sample in synthetic batches."""
    text = max(1, round(MLM_FRACTION * (flavor.text_len - 2)))  # CLS and SEP are never masked
    patches = max(1, round(MASKED_PATCH_FRACTION * flavor.patches))
    return text, patches
