"""A small GPTQ model for the end-to-end run, made offline with a fixed seed: Llama architecture with
Llama-2-7B layer shapes (hidden 4096, MLP 11008, 32 heads, 8 KV heads) and 8 layers, every linear layer of
the decoder 4-bit GPTQ (symmetric, group 128, no act-order) in the checkpoint format vLLM's GPTQ loader
reads (qweight packed along the input dimension, qzeros stored zero-point minus one, fp16 scales, g_idx),
and a byte-level BPE tokenizer trained with `tokenizers` on generated text. Weights are random: the run
compares pods with each other, never with a reference answer.

usage: make_model.py OUT_DIR   (prints the prompts file it writes beside the model)"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SEED = 0
HIDDEN, MLP, LAYERS, HEADS, KV_HEADS = 4096, 11008, 8, 32, 8
HEAD_DIM = HIDDEN // HEADS
BITS, GROUP = 4, 128
PACK = 32 // BITS
VOCAB_TARGET = 8192
SPECIAL = ["<unk>", "<s>", "</s>"]
PROMPTS = 32


def words(rng: random.Random, count: int) -> list[str]:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    return ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(count)]


def sentences(rng: random.Random, vocabulary: list[str], count: int) -> list[str]:
    return [
        " ".join(rng.choice(vocabulary) for _ in range(rng.randint(6, 24))).capitalize() + "."
        for _ in range(count)
    ]


def make_tokenizer(rng: random.Random, out: Path) -> tuple[Tokenizer, list[str]]:
    vocabulary = words(rng, 6000)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_TARGET,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(sentences(rng, vocabulary, 40000), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 4096,
                "add_bos_token": True,
            },
            indent=1,
        )
    )
    return tokenizer, vocabulary


def gptq(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Round-to-nearest symmetric 4-bit GPTQ tensors for a [out, in] weight (the format, not the method)."""
    out_features, in_features = weight.shape
    w = weight.t().float()  # [in, out]
    grouped = w.reshape(in_features // GROUP, GROUP, out_features)
    scales = (grouped.abs().amax(dim=1) / 7.5).clamp(min=1e-6)  # [groups, out]
    q = torch.clamp(torch.round(grouped / scales[:, None, :]) + 8, 0, 15).to(torch.int32)
    q = q.reshape(in_features // PACK, PACK, out_features)
    shifts = torch.arange(PACK, dtype=torch.int32, device=q.device).view(1, PACK, 1) * BITS
    qweight = (q << shifts).sum(dim=1, dtype=torch.int64).to(torch.int64)
    qweight = torch.where(qweight >= 2**31, qweight - 2**32, qweight).to(torch.int32)
    zero = 7  # checkpoint stores zero point minus one; symmetric: 8 - 1
    zeros_word = sum(zero << (BITS * i) for i in range(PACK))
    qzeros = torch.full(
        (in_features // GROUP, out_features // PACK),
        zeros_word - 2**32 if zeros_word >= 2**31 else zeros_word,
        dtype=torch.int32,
    )
    g_idx = torch.arange(in_features, dtype=torch.int32) // GROUP
    return {
        "qweight": qweight.cpu(),
        "qzeros": qzeros,
        "scales": scales.half().cpu(),
        "g_idx": g_idx,
    }


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)
    torch.manual_seed(SEED)
    tokenizer, vocabulary = make_tokenizer(rng, out)
    vocab_size = tokenizer.get_vocab_size()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    def normal(*shape: int, std: float = 0.02) -> torch.Tensor:
        return torch.randn(*shape, device=device) * std

    tensors: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": normal(vocab_size, HIDDEN, std=1.0).half().cpu(),
        "model.norm.weight": torch.ones(HIDDEN, dtype=torch.float16),
        "lm_head.weight": normal(vocab_size, HIDDEN).half().cpu(),
    }
    shapes = {
        "self_attn.q_proj": (HEADS * HEAD_DIM, HIDDEN),
        "self_attn.k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "self_attn.o_proj": (HIDDEN, HEADS * HEAD_DIM),
        "mlp.gate_proj": (MLP, HIDDEN),
        "mlp.up_proj": (MLP, HIDDEN),
        "mlp.down_proj": (HIDDEN, MLP),
    }
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        tensors[f"{prefix}.input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.float16)
        tensors[f"{prefix}.post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.float16)
        for name, shape in shapes.items():
            for part, tensor in gptq(normal(*shape)).items():
                tensors[f"{prefix}.{name}.{part}"] = tensor
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})

    quantization = {
        "quant_method": "gptq",
        "bits": BITS,
        "group_size": GROUP,
        "desc_act": False,
        "sym": True,
        "lm_head": False,
        "checkpoint_format": "gptq",
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": MLP,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "vocab_size": vocab_size,
        "bos_token_id": tokenizer.token_to_id("<s>"),
        "eos_token_id": tokenizer.token_to_id("</s>"),
        "tie_word_embeddings": False,
        "torch_dtype": "float16",
        "quantization_config": quantization,
    }
    (out / "config.json").write_text(json.dumps(config, indent=1))
    (out / "quantize_config.json").write_text(json.dumps(quantization, indent=1))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]})
    )
    prompts = sentences(random.Random(SEED + 1), vocabulary, PROMPTS)
    (out / "prompts.json").write_text(json.dumps(prompts, indent=1))
    print(f"{out}: vocab {vocab_size}, {LAYERS} layers, {len(tensors)} tensors, {len(prompts)} prompts")


if __name__ == "__main__":
    main()
