"""Tiny random-weight Hugging Face models, built offline for tests.

``build_model(folder, family="llama", ...)`` writes config.json, model.safetensors, a
byte-level BPE tokenizer (trained with ``tokenizers`` on a few paragraphs below) and a chat
template, so vLLM and transformers can load the folder with no Hub access. torch and
transformers are imported inside the functions: importing this module is cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SEED = 1234

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
SPECIAL_TOKENS = (BOS, EOS, PAD)

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}{{ eos_token }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS = (
    "The quick brown fox jumps over the lazy dog. A large language model predicts the next "
    "token from the tokens before it, one step at a time, and keeps the keys and values of "
    "every earlier token in a cache so that it does not compute them again.",
    "Paged attention splits that cache into blocks of a fixed number of tokens. The engine "
    "hands blocks to requests as they grow and takes them back when they finish, so memory "
    "is not reserved for the longest possible answer up front.",
    "Memory on an accelerator is shared by the weights, the activations of the largest "
    "batch, the workspaces of the kernels, and whatever remains goes to the key-value cache. "
    "If a single request at the maximum context length does not fit, the server refuses to "
    "start and says how long a context would fit instead.",
    "Hello! How are you today? I am fine, thank you. What is the weather like? It is sunny "
    "and warm, with a light breeze from the west. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000.",
    "User: Summarise the report in three sentences.\nAssistant: The report covers the first "
    "quarter. Revenue grew by twelve percent. Costs stayed flat, so the margin improved.",
)

# family -> transformers config class
FAMILIES: dict[str, str] = {
    "llama": "LlamaConfig",
    "qwen2": "Qwen2Config",
    "mistral": "MistralConfig",
    "gemma": "GemmaConfig",
    "gemma2": "Gemma2Config",
    "qwen3": "Qwen3Config",
}


def build_tokenizer(folder: Path | str, *, vocab_size: int = 512) -> Any:
    """Train a byte-level BPE tokenizer on CORPUS and save it (with a chat template) to
    ``folder``. Returns the ``PreTrainedTokenizerFast``. Deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(CORPUS), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=None
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 1 << 30
    fast.save_pretrained(str(folder))
    return fast


def build_model(
    folder: Path | str,
    *,
    family: str = "llama",
    layers: int = 2,
    hidden: int = 128,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    intermediate: int = 256,
    vocab: int | None = None,
    max_position_embeddings: int = 131072,
    dtype: str = "bfloat16",
    tie: bool = False,
    sliding_window: int | None = None,
    seed: int = SEED,
) -> Path:
    """Build a tiny random-weight causal LM of ``family`` in ``folder`` and return the folder.

    ``vocab`` defaults to the tokenizer's size. vLLM's CPU attention needs head_dim in
    {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}.
    """
    import torch
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; known: {sorted(FAMILIES)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(folder)
    vocab_size = vocab or len(tokenizer)

    fields: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie,
        bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
        dtype=dtype,
    )
    if family in ("mistral", "qwen2", "qwen3", "gemma2"):
        fields["sliding_window"] = sliding_window
    elif sliding_window is not None:
        raise ValueError(f"{family} has no sliding window")
    if family in ("qwen2", "qwen3"):
        fields["use_sliding_window"] = sliding_window is not None
        if sliding_window is not None:
            fields["max_window_layers"] = 0
    if family == "gemma2":
        fields["query_pre_attn_scalar"] = head_dim
        if sliding_window is None:
            fields["sliding_window"] = 4096

    config = getattr(transformers, FAMILIES[family])(**fields)
    torch_dtype = getattr(torch, dtype)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    model.eval()
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def kv_bytes_per_token(*, layers: int, kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """K and V bytes one token takes over all layers of a full-attention model."""
    return layers * 2 * kv_heads * head_dim * dtype_bytes
