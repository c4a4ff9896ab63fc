"""What a card can run, and names that do not say which card: the feature half of the card table.

`loradoctor/data/gpus.yaml` lists per card its compute capability and whether it has native bf16,
FlashAttention 2 and fp8. A run is judged against a card on its features as well as its memory: bf16
on a T4 stops in transformers (`Your setup doesn't support bf16/gpu`), FlashAttention 2 on a pre-Ampere
card stops in the kernel. `unsupported(inputs, gpu)` lists what the run asks for and the card lacks,
each with what to use instead.

Some short names are several cards ('A100' is 40 GB or 80 GB): `variants(name)` lists them, and
`--gpu` with such a name asks for the variant instead of picking one.
"""

from __future__ import annotations

from loradoctor.record import record
from typing import Any, Optional

from loradoctor.errors import UserError

# The oldest compute capability with the feature (used when a card is not in the table: a local GPU's
# capability from NVML, or a card known only by its capability).
FEATURE_MIN_CC: dict[str, tuple[int, int]] = {"bf16": (8, 0), "flash_attn2": (8, 0), "fp8": (8, 9)}
FEATURE_NAMES = {"bf16": "native bf16", "flash_attn2": "FlashAttention 2", "fp8": "fp8 matmuls"}


@record(frozen=True)
class Unsupported:
    """A feature the run needs that the card lacks, and the change that runs on the card."""

    feature: str  # bf16 | flash_attn2 | fp8
    card: str
    compute_capability: Optional[str]
    instead: str  # the setting to use, in words
    option: str  # the command-line change

    @property
    def text(self) -> str:
        cc = f" (compute capability {self.compute_capability})" if self.compute_capability else ""
        return f"{self.card}{cc} has no {FEATURE_NAMES[self.feature]}: use {self.instead} ({self.option})"

    def to_dict(self) -> dict[str, Any]:
        return {"feature": self.feature, "card": self.card, "compute_capability": self.compute_capability,
                "instead": self.instead, "option": self.option, "text": self.text}


def _cc_tuple(text: Any) -> Optional[tuple[int, int]]:
    try:
        major, _, minor = str(text).strip().partition(".")
        return int(major), int(minor or 0)
    except ValueError:
        return None


def supports(gpu: Any, feature: str) -> Optional[bool]:
    """True / False for a card of the table (its own entry) or a card with a known compute capability;
    None when nothing says (a `--vram` size)."""
    from loradoctor.estimate.fit import gpu_table

    spec = gpu_table().get(gpu.name) if getattr(gpu, "source", "") == "table" else None
    if isinstance(spec, dict) and isinstance(spec.get(feature), bool):
        return bool(spec[feature])
    cc = _cc_tuple(gpu.compute_capability) if getattr(gpu, "compute_capability", None) else None
    if cc is not None:
        return cc >= FEATURE_MIN_CC[feature]
    if feature == "bf16" and getattr(gpu, "bf16", None) is not None:
        return bool(gpu.bf16)
    return None


def required_features(inputs: Any) -> list[str]:
    """The card features this run needs: bf16 (bf16 precisions), FlashAttention 2, fp8 (fp8 precisions)."""
    precision = str(getattr(inputs, "precision", ""))
    need = []
    if precision.startswith("bf16"):
        need.append("bf16")
    if getattr(inputs, "attn", "") == "flash_attention_2":
        need.append("flash_attn2")
    if "fp8" in precision:
        need.append("fp8")
    return need


def _instead(feature: str, inputs: Any, gpu: Any) -> tuple[str, str]:
    precision = str(getattr(inputs, "precision", ""))
    if feature == "bf16":
        half = "fp16-true" if precision.endswith("-true") else "fp16"
        return ("fp16 mixed precision (same memory)" if half == "fp16" else "fp16 throughout"), f"--precision {half}"
    if feature == "flash_attn2":
        return "PyTorch SDPA attention", "--attn sdpa"
    fallback = "bf16" if supports(gpu, "bf16") is not False else "fp16"
    return f"{fallback} instead of fp8", f"--precision {fallback}"


def unsupported(inputs: Any, gpu: Any) -> list[Unsupported]:
    """What the run needs that this card does not have (unknown features are not reported)."""
    out = []
    for feature in required_features(inputs):
        if supports(gpu, feature) is False:
            instead, option = _instead(feature, inputs, gpu)
            out.append(Unsupported(feature, gpu.name, getattr(gpu, "compute_capability", None), instead, option))
    return out


def variants(name: str) -> list[str]:
    """The cards a short, ambiguous name stands for ('A100' -> ['A100 40GB', 'A100 80GB']); [] when the
    name is a card's own name or alias, or names no family."""
    from loradoctor.estimate.fit import _key, gpu_table

    want = _key(name)
    if not want:
        return []
    table = gpu_table()
    for card, spec in table.items():
        if want == _key(card) or any(want == _key(a) for a in spec.get("aliases") or []):
            return []
    exact = [card for card, spec in table.items() if any(want == _key(v) for v in spec.get("variant_of") or [])]
    if exact:
        return exact
    # a longer text that holds a family name and no longer card name ('NVIDIA A100 (PCIe)')
    best_card = max((len(_key(c)) for card, spec in table.items() for c in [card] + list(spec.get("aliases") or [])
                     if _key(c) and _key(c) in want), default=0)
    fams: dict[str, list[str]] = {}
    for card, spec in table.items():
        for v in spec.get("variant_of") or []:
            k = _key(v)
            if k and k in want and len(k) > best_card:
                fams.setdefault(k, []).append(card)
    if not fams:
        return []
    return fams[max(fams, key=len)]


def ambiguous_error(name: str, cards: list[str]) -> UserError:
    from loradoctor.estimate.fit import gpu_table

    listed = ", ".join(f"'{c}' ({int(gpu_table()[c]['memory_mib']) / 1024:.0f} GiB, cc {gpu_table()[c].get('cc')})"
                       for c in cards)
    return UserError(f"--gpu {name!r} names more than one card: {listed}; pass the one you have, e.g. --gpu '{cards[-1]}'")


def parse_vram(text: str) -> int:
    """`--vram SIZE` -> bytes, read as cards are labelled: a '24 GB' card has 24 GiB, so 24GB = 24GiB =
    24 x 2^30 bytes (likewise MB/MiB, TB/TiB). A number without a unit is refused."""
    from loradoctor.units import MAX_PLAUSIBLE_BYTES, parse_size

    raw = str(text).strip()
    stripped = raw.replace(",", "").replace("_", "")
    if not stripped or stripped.replace(".", "", 1).isdigit():
        raise UserError(f"--vram {raw}: give a unit: write {raw or '24'}GB or {raw or '24'}GiB (both mean GiB, as cards are labelled)")
    unit = stripped.lstrip("0123456789.eE+-").strip().lower()
    binary = {"g": "gib", "gb": "gib", "m": "mib", "mb": "mib", "t": "tib", "tb": "tib"}.get(unit)
    try:
        size = parse_size(stripped[: len(stripped) - len(unit)] + binary if binary else stripped)
    except (ValueError, OverflowError) as exc:
        raise UserError(f"--vram: {exc}") from None
    if size <= 0:
        raise UserError(f"--vram {raw}: must be more than zero")
    if size > MAX_PLAUSIBLE_BYTES:
        raise UserError(f"--vram {raw}: more than any GPU has")
    return size
