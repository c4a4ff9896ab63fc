"""Loss kernels: what the cross-entropy of a causal LM keeps on the GPU at its peak, kernel by kernel.

Pure arithmetic on shapes (tokens, hidden, vocab, bytes per element). Each kernel is modelled from which
tensors exist at its peak moment:

* ``standard``: transformers' ``ForCausalLMLoss`` upcasts the logits to fp32 and calls ``cross_entropy``:
  at the start of backward the half-precision logits, their fp32 copy, the fp32 log-softmax and its
  gradient exist together (measured on CPU: 12.1 bytes per logit in half precision, 16 in fp32).
* ``chunked:N``: torchtune's ``CEWithChunkedOutputLoss`` (and litgpt's chunked loss): the half-precision
  logits are all materialised (the lm_head output is split into N chunks), each chunk is upcast to
  fp32 in turn: a + 12 / N bytes per logit (a + 4 / N under torch.compile, which fuses the upcast).
* ``cce``: Apple's Cut Cross Entropy (axolotl's CutCrossEntropyPlugin, Unsloth >= 2024.12): the logits
  never exist; the kernel saves the final hidden states it multiplies (a x h per token), a log-sum-exp per
  token (fp32), and in backward writes the gradient of the hidden states (a x h per token).
* ``liger-flce``: Liger's fused linear cross-entropy: in the forward it takes ``chunk`` tokens at a time,
  ``chunk = next_pow2(ceil(tokens / ceil(V / h)))``, materialises that chunk's logits (a x chunk x V),
  turns them into their gradient in place, and accumulates the gradient of the hidden states
  (``zeros_like(hidden)``, in the hidden states' dtype) which it keeps for backward; an fp32 loss per token.
* ``fused-ce``: an in-place cross-entropy on materialised half-precision logits (Liger's ``cross_entropy``,
  Unsloth's ``fast_cross_entropy_loss`` as axolotl patches it): the kernel writes the gradient into the logits
  in the forward, so only the half-precision logits exist (a bytes per logit).
* ``unsloth``: Unsloth's fused loss (``unsloth_zoo`` fused CE): the same shape of computation as Liger's
  (token chunks, gradient of the hidden states computed in the forward), modelled with Liger's chunking.

The trained lm_head (modules_to_save, or full fine-tuning) adds its fp32/half gradient accumulator in the
fused kernels; that is counted with the gradients by the caller, not here.
"""

from __future__ import annotations

from typing import Optional

from loradoctor.errors import UserError

LOSSES = ("standard", "cce", "liger-flce", "chunked", "unsloth", "fused-ce")
DEFAULT_CHUNKS = 8  # torchtune's num_output_chunks


def parse_loss(text: Optional[str]) -> tuple[Optional[str], int]:
    """'chunked:16' -> ('chunked', 16); 'liger' -> ('liger-flce', 0); None -> (None, 0). UserError when unknown."""
    if text is None:
        return None, 0
    key = str(text).strip().lower().replace("_", "-")
    name, _, arg = key.partition(":")
    name = {"liger": "liger-flce", "flce": "liger-flce", "liger-fused-linear-cross-entropy": "liger-flce",
            "cut-cross-entropy": "cce", "cut": "cce", "hf": "standard", "default": "standard",
            "torchtune": "chunked", "liger-ce": "fused-ce", "inplace-ce": "fused-ce"}.get(name, name)
    if name not in LOSSES:
        raise UserError(f"--loss must be one of standard, cce, liger-flce, chunked[:N], unsloth, fused-ce; not {text!r}")
    if name != "chunked":
        if arg:
            raise UserError(f"--loss {text!r}: only chunked takes a number of chunks (chunked:8)")
        return name, 0
    if not arg:
        return name, DEFAULT_CHUNKS
    try:
        chunks = int(arg)
    except ValueError:
        raise UserError(f"--loss {text!r}: the number of chunks after 'chunked:' must be an integer") from None
    if chunks < 1:
        raise UserError(f"--loss {text!r}: at least one chunk")
    return name, chunks


def next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


def liger_chunk_tokens(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's FLCE chunk: inc_factor = ceil(V / h); chunk = next_pow2(ceil(BT / inc_factor)), at most BT rows."""
    inc = -(-vocab // hidden)
    return min(tokens, next_pow2(-(-tokens // inc)))


def loss_peak_bytes(kind: str, chunks: int, tokens: int, hidden: int, vocab: int, act_bytes: int,
                    hidden_bytes: int, softcap: bool = False, compiled: bool = False,
                    half_log_softmax: bool = False) -> int:
    """Bytes the loss holds at its peak (beyond the activations the layers keep).

    act_bytes: the logits' dtype (2 in half precision, 4 in fp32); hidden_bytes: the final hidden states'
    dtype (4 in HF k-bit training, which upcasts the final norm); softcap: Gemma-2's tanh(logits / cap) is
    saved for backward (only where logits exist); half_log_softmax: litgpt keeps a half-precision
    log-softmax instead of an fp32 upcast.
    """
    a = act_bytes
    logits = tokens * vocab
    if kind == "standard":
        per_logit = (12 if a == 2 else 16) + (a if softcap else 0)
        return int(per_logit * logits)
    if kind == "chunked":
        if half_log_softmax:
            per_logit = 2 * a
        else:
            per_logit = a + (4 if compiled else 12) / chunks
        return int((per_logit + (a if softcap else 0)) * logits)
    if kind == "fused-ce":
        return int((a + (a if softcap else 0)) * logits)
    if kind == "cce":
        # saved hidden states + their gradient + fp32 lse; the classifier gradient is the caller's
        return int(tokens * (hidden_bytes * hidden + a * hidden + 4))
    if kind in ("liger-flce", "unsloth"):
        chunk = liger_chunk_tokens(tokens, hidden, vocab)
        # grad of hidden states (kept), one chunk of logits (turned into its gradient in place), fp32 loss
        return int(tokens * (hidden_bytes * hidden + 4) + chunk * vocab * a)
    raise ValueError(kind)
