"""Model shapes: from a local folder or config.json, the offline Hugging Face cache, or a built-in preset.

Everything here is pure data plus small file reads; nothing is downloaded and nothing heavy is imported.
An `Arch` knows its linear modules (name -> in/out features, count per layer) so that parameter
counts, LoRA parameter counts and quantized sizes all come from one table.
"""

from __future__ import annotations

import os
from loradoctor.record import asdict, record
from pathlib import Path
from typing import Any, Optional

from loradoctor.errors import UserError

# Canonical module names (HF Llama naming) and the aliases people and other frameworks use.
CANONICAL_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
MODULE_ALIASES = {
    "dense": "o_proj", "out_proj": "o_proj", "output_proj": "o_proj", "proj": "o_proj", "wo": "o_proj",
    "c_proj": "o_proj",
    "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj", "fc1": "up_proj", "fc2": "down_proj",
    "fc_1": "gate_proj", "fc_2": "up_proj", "dense_h_to_4h": "up_proj", "dense_4h_to_h": "down_proj",
    "wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "query": "q_proj", "key": "k_proj", "value": "v_proj",
    "output": "lm_head",
}
# Fused names expand to several canonical modules (Phi-3, Falcon/NeoX, GPT-2).
FUSED_ALIASES = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "query_key_value": ("q_proj", "k_proj", "v_proj"),
    "c_attn": ("q_proj", "k_proj", "v_proj"),
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


@record(frozen=True)
class Arch:
    """The shape numbers of a decoder-only transformer that the memory model needs."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    head_dim: int = 0  # 0: hidden // heads
    tied: bool = False
    attn_bias: bool = False
    mlp: str = "gated"  # gated: gate/up/down (SwiGLU, GeGLU); plain: up/down with GELU (Phi-2, NeoX)
    norm: str = "rms"  # rms | layer
    norms_per_layer: int = 2
    parallel_residual: bool = False  # attention and MLP read the same normed input (Phi-1.5/2)
    experts: int = 0
    experts_per_token: int = 0
    moe_intermediate: int = 0  # per-expert width when it differs from intermediate
    fused: bool = False  # Phi-3: qkv_proj and gate_up_proj are single Linear layers
    attn_softcap: float = 0.0  # Gemma-2 tanh-caps attention scores (needs eager attention to apply it)
    final_softcap: float = 0.0  # Gemma-2 tanh-caps the logits
    vision_params: int = 0  # a multimodal checkpoint's vision tower + projector (from vision_config), frozen
    source: str = "preset"  # where the numbers came from: a file path, 'hf-cache:<path>' or 'preset:<name>'

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * self.hd

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.hd

    @property
    def expert_width(self) -> int:
        return self.moe_intermediate or self.intermediate

    def linear_modules(self) -> dict[str, tuple[int, int, int]]:
        """Per-layer linear modules: canonical name -> (in_features, out_features, copies per layer).

        MoE expert MLPs have `experts` copies per layer; the router is listed as `router`.
        """
        h = self.hidden
        mods: dict[str, tuple[int, int, int]] = {
            "q_proj": (h, self.q_dim, 1),
            "k_proj": (h, self.kv_dim, 1),
            "v_proj": (h, self.kv_dim, 1),
            "o_proj": (self.q_dim, h, 1),
        }
        copies = self.experts or 1
        width = self.expert_width
        if self.mlp == "gated":
            mods["gate_proj"] = (h, width, copies)
        mods["up_proj"] = (h, width, copies)
        mods["down_proj"] = (width, h, copies)
        if self.experts:
            mods["router"] = (h, self.experts, 1)
        return mods

    def layer_params(self) -> int:
        """Parameters of one decoder layer (linears, biases, norms)."""
        n = sum(i * o * c for i, o, c in self.linear_modules().values())
        if self.attn_bias:
            n += self.q_dim + 2 * self.kv_dim
        if self.mlp == "plain":
            # GPT-NeoX / Phi keep biases on every linear
            n += self.q_dim + 2 * self.kv_dim + self.hidden + self.expert_width + self.hidden
        norm_params = self.hidden * (2 if self.norm == "layer" else 1)
        n += self.norms_per_layer * norm_params
        return n

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def lm_head_params(self) -> int:
        """0 when the output projection shares the embedding matrix."""
        return 0 if self.tied else self.vocab * self.hidden

    def total_params(self) -> int:
        """All parameters, as `sum(p.numel() for p in model.parameters())` counts them (tied counted once)."""
        final_norm = self.hidden * (2 if self.norm == "layer" else 1)
        return self.layers * self.layer_params() + self.embedding_params() + self.lm_head_params() + final_norm

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["head_dim"] = self.hd
        data["total_params"] = self.total_params()
        return data


def normalize_module(name: str) -> tuple[str, ...]:
    """'w1' -> ('gate_proj',); 'qkv_proj' -> ('q_proj','k_proj','v_proj'); 'model.layers.0.self_attn.q_proj' -> ('q_proj',)."""
    leaf = name.strip().split(".")[-1]
    if leaf in FUSED_ALIASES:
        return FUSED_ALIASES[leaf]
    if leaf in MODULE_ALIASES:
        return (MODULE_ALIASES[leaf],)
    return (leaf,)


# --- reading config.json -------------------------------------------------------------------------

def arch_from_config(cfg: dict[str, Any], source: str = "config.json") -> Arch:
    """Build an Arch from a Hugging Face config.json dict (Llama, Mistral, Mixtral, Qwen2/3(+MoE), Gemma/2,
    Phi-3, Phi/Phi-2, GPT-NeoX, Falcon). Nested `text_config` (multimodal wrappers) is followed."""
    vision = vision_tower_params(cfg)
    if "text_config" in cfg and "hidden_size" not in cfg:
        cfg = {**cfg, **cfg["text_config"]}
    model_type = str(cfg.get("model_type", ""))

    def pick(*keys: str, default: Any = None) -> Any:
        for k in keys:
            if cfg.get(k) is not None:
                return cfg[k]
        return default

    hidden = pick("hidden_size", "n_embd", "d_model")
    layers = pick("num_hidden_layers", "n_layer", "num_layers")
    heads = pick("num_attention_heads", "n_head")
    vocab = pick("vocab_size", "padded_vocab_size")
    if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, heads, vocab)):
        raise UserError(f"{source}: not a decoder config I can read (need hidden_size, num_hidden_layers, "
                        f"num_attention_heads, vocab_size; model_type={model_type or '?'})")
    kv = pick("num_key_value_heads", "num_kv_heads", default=None)
    if kv is None:
        kv = 1 if cfg.get("multi_query") else heads
    intermediate = pick("intermediate_size", "n_inner", "ffn_hidden_size", default=None) or 4 * hidden
    plain = model_type in ("phi", "gpt_neox", "falcon", "gpt2", "gpt_bigcode", "stablelm_epoch", "starcoder2")
    norm = "layer" if plain or model_type in ("stablelm",) else "rms"
    norms = 2
    if model_type in ("gemma2", "gemma3", "gemma3_text"):
        norms = 4
    if model_type in ("phi", "falcon"):
        norms = 1
    experts = pick("num_local_experts", "num_experts", "n_routed_experts", default=0) or 0
    return Arch(
        name=str(cfg.get("_name_or_path") or cfg.get("name") or model_type or "model"),
        hidden=int(hidden),
        intermediate=int(intermediate),
        layers=int(layers),
        heads=int(heads),
        kv_heads=int(kv),
        vocab=int(vocab),
        head_dim=int(cfg.get("head_dim") or 0),
        tied=bool(cfg.get("tie_word_embeddings", model_type in ("gemma", "gemma2"))),
        attn_bias=bool(cfg.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
        mlp="plain" if plain else "gated",
        norm=norm,
        norms_per_layer=norms,
        parallel_residual=model_type in ("phi",),
        experts=int(experts),
        experts_per_token=int(pick("num_experts_per_tok", "moe_top_k", default=0) or 0),
        moe_intermediate=int(cfg.get("moe_intermediate_size") or 0),
        fused=model_type in ("phi3",),
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        final_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        vision_params=vision,
        source=source,
    )


def vision_tower_params(cfg: dict[str, Any]) -> int:
    """Parameters of a ViT vision tower from `vision_config` (CLIP / SigLIP / Qwen-VL spellings) + the projector
    into the text model (2-layer MLP), about +-5%: per layer q/k/v/o (4 w^2), the MLP (2 w i), biases and norms;
    patch and position embeddings. 0 without a vision_config."""
    vc = cfg.get("vision_config")
    if not isinstance(vc, dict):
        return 0
    width = vc.get("embed_dim") or vc.get("hidden_size") or vc.get("width")
    depth = vc.get("num_hidden_layers") or vc.get("depth") or vc.get("layers")
    if not (isinstance(width, int) and isinstance(depth, int) and width > 0 and depth > 0):
        return 0
    inter = vc.get("intermediate_size") or int((vc.get("mlp_ratio") or 4) * width)
    patch = int(vc.get("patch_size") or 14)
    image = int(vc.get("image_size") or 336)
    per_layer = 4 * width * width + 2 * width * inter + 4 * width + inter + 5 * width
    embed = (int(vc.get("num_channels") or 3) * patch * patch + 1) * width + (image // patch) ** 2 * width
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    text_hidden = int(text.get("hidden_size") or width) if isinstance(text, dict) else width
    projector = width * text_hidden + text_hidden * text_hidden
    return int(depth * per_layer + embed + projector)


def read_config_file(path: Path) -> dict[str, Any]:
    from loradoctor.safe_yaml import load_json  # size, encoding and depth limits; one line naming the file

    data = load_json(path)
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a JSON object")
    return data


# --- the offline Hugging Face cache --------------------------------------------------------------

def hf_cache_dirs() -> list[Path]:
    """Hub cache folders in the order transformers looks: HF_HUB_CACHE, HF_HOME/hub, ~/.cache/huggingface/hub."""
    dirs: list[Path] = []
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE"):
        if os.environ.get(var):
            dirs.append(Path(os.environ[var]).expanduser())
    if os.environ.get("HF_HOME"):
        dirs.append(Path(os.environ["HF_HOME"]).expanduser() / "hub")
    xdg = os.environ.get("XDG_CACHE_HOME")
    dirs.append((Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "huggingface" / "hub")
    seen: list[Path] = []
    for d in dirs:
        if d not in seen:
            seen.append(d)
    return seen


def find_in_hf_cache(model_id: str) -> Optional[Path]:
    """models--org--name/snapshots/*/config.json for an id like 'org/name' (newest snapshot), or None."""
    if "/" not in model_id:
        return None
    folder = "models--" + model_id.replace("/", "--")
    for cache in hf_cache_dirs():
        base = cache / folder
        if _path_kind(base) != "dir":  # (an id too long for a file name is in no cache)
            continue
        ref = base / "refs" / "main"
        if ref.is_file():
            snap = base / "snapshots" / ref.read_text().strip() / "config.json"
            if snap.is_file():
                return snap
        snaps = sorted((base / "snapshots").glob("*/config.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        if snaps:
            return snaps[0]
    return None


# --- presets -------------------------------------------------------------------------------------

_PRESETS: Optional[dict[str, dict[str, Any]]] = None


def presets() -> dict[str, dict[str, Any]]:
    """The built-in shapes (loradoctor/data/presets.yaml), loaded once."""
    global _PRESETS
    if _PRESETS is None:
        import yaml

        text = (Path(__file__).resolve().parent.parent / "data" / "presets.yaml").read_text(encoding="utf-8")
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: 10x faster
        _PRESETS = yaml.load(text, Loader=loader) or {}
    return _PRESETS


def _norm_id(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum() or ch == ".")


def find_preset(model_id: str) -> Optional[str]:
    """Preset name for an id ('meta-llama/Llama-3.1-8B', 'llama-3.1-8b', 'Llama-3.1-8B-Instruct'), or None."""
    wanted = _norm_id(model_id)
    short = _norm_id(model_id.split("/")[-1])
    table = presets()
    for name, spec in table.items():
        keys = [name] + list(spec.get("aliases") or [])
        for key in keys:
            if _norm_id(key) in (wanted, short) or _norm_id(key.split("/")[-1]) == short:
                return name
    return None


def arch_from_preset(name: str) -> Arch:
    spec = presets()[name]
    return Arch(
        name=name,
        hidden=spec["hidden"],
        intermediate=spec["intermediate"],
        layers=spec["layers"],
        heads=spec["heads"],
        kv_heads=spec.get("kv_heads", spec["heads"]),
        vocab=spec["vocab"],
        head_dim=spec.get("head_dim", 0),
        tied=bool(spec.get("tied", False)),
        attn_bias=bool(spec.get("attn_bias", False)),
        mlp=spec.get("mlp", "gated"),
        norm=spec.get("norm", "rms"),
        norms_per_layer=2 + int(spec.get("extra_norms", 0)),
        experts=int(spec.get("experts", 0)),
        experts_per_token=int(spec.get("experts_per_token", 0)),
        moe_intermediate=int(spec.get("moe_intermediate", 0)),
        fused=bool(spec.get("fused", False)),
        attn_softcap=float(spec.get("attn_softcap", 0.0)),
        final_softcap=float(spec.get("final_softcap", 0.0)),
        source=f"preset:{name}",
    )


def _named(arch: Arch, name: str) -> Arch:
    return Arch(**{**asdict(arch), "name": name or arch.name})


def _path_kind(path: Path) -> str:
    """'dir', 'file' or '' (nothing there, or a name no file system takes: too long, a NUL byte), so a
    model id that cannot be a path is looked up as an id, never a crash."""
    try:
        return "dir" if path.is_dir() else "file" if path.is_file() else ""
    except (OSError, ValueError):
        return ""


def resolve_arch(model: str) -> Arch:
    """A model folder or config.json path, then an id in the local HF cache, then a preset. UserError otherwise."""
    if not model:
        raise UserError("no model given: pass --model ID|PATH (a folder with config.json, a config.json, or a preset)")
    path = Path(model).expanduser()
    kind = _path_kind(path)
    if kind == "dir":
        cfg = path / "config.json"
        if not cfg.is_file():
            raise UserError(f"{path} has no config.json")
        return _named(arch_from_config(read_config_file(cfg), source=str(cfg)), path.name)
    if kind == "file":
        arch = arch_from_config(read_config_file(path), source=str(path))
        return _named(arch, path.parent.name) if arch.name in ("model", "") or "/" not in arch.name else arch
    cached = find_in_hf_cache(model)
    if cached is not None:
        return _named(arch_from_config(read_config_file(cached), source=f"hf-cache:{cached}"), model)
    name = find_preset(model)
    if name is not None:
        arch = arch_from_preset(name)
        return Arch(**{**asdict(arch), "name": model if "/" in model else name})
    listing = ", ".join(sorted(presets()))
    raise UserError(
        f"unknown model {model if len(model) <= 200 else model[:200] + '...'!r}: not a local folder or config.json, not in the Hugging Face cache "
        f"({', '.join(str(d) for d in hf_cache_dirs()[:2])}), and not a preset. Presets: {listing}"
    )
