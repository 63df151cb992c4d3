"""Write the tiny random-weight F32 GGUF models of ../shared/tiny at test time (no .gguf is
tracked in git).

The weights and hyperparameters follow ../shared/tiny/make_tiny_models.py exactly (same
specs, same seeds, same draws in the same order), so ``tiny-<arch>-F32.gguf`` here holds the
same tensors as the file of that name there (the stored llama.cpp logits of the tests pin
this: a different draw fails them), and llama.cpp's logits for those files apply; the
architectures added later (explicit ``seed=``) have their references made from these files by
tests/data/tiny/make_tiny_reference.py. Only the tokenizer
differs: a synthetic 2048-token vocabulary, since the tests that use these files feed token
ids directly.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

N_VOCAB = 2048

BASE = dict(n_layer=2, n_ctx=2048, n_embd=64, n_head=4, n_head_kv=2, head_dim=16,
            n_ff=192, rope_base=10000.0, eps=1e-5, tied=True)

# In the order of ../shared/tiny/make_tiny_models.py's SPECS: the seed is 1000 + index.
_SPECS = [
    dict(name="tiny-llama", arch="llama", n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
         rope_base=10000.0, eps=1e-5),
    None,  # tiny-llama-fullvocab (needs the full SmolLM2 vocabulary; not generated here)
    dict(name="tiny-qwen2", arch="qwen2", head_dim=16, rope_base=1000000.0, eps=1e-6),
    dict(name="tiny-qwen3", arch="qwen3", head_dim=32, rope_base=1000000.0, eps=1e-6),
    dict(name="tiny-qwen3moe", arch="qwen3moe", head_dim=32, rope_base=1000000.0, eps=1e-6,
         n_expert=4, n_expert_used=2, n_ff_exp=64, tied=False),
    dict(name="tiny-phi3", arch="phi3", head_dim=16, n_ff=128, rope_base=10000.0, eps=1e-5,
         tied=False, sliding_window=128),
    dict(name="tiny-phi2", arch="phi2", n_head=4, n_head_kv=4, head_dim=16, n_rot=8, n_ff=256,
         eps=1e-5, tied=False),
    dict(name="tiny-gemma", arch="gemma", n_head=4, n_head_kv=1, head_dim=32, eps=1e-6,
         scale=dict(embd=1 / 3, output_norm=3.0, attn_output=3.0, ffn_down=3.0)),
    dict(name="tiny-gemma2", arch="gemma2", n_head=4, n_head_kv=2, head_dim=32, eps=1e-6,
         sliding_window=64, attn_softcap=50.0, final_softcap=30.0,
         scale=dict(embd=1 / 3, output_norm=3.0, post_norm=3.0, attn_q=2.0, attn_k=2.0)),
    dict(name="tiny-gemma3", arch="gemma3", n_layer=6, n_head=4, n_head_kv=1, head_dim=32, n_ff=128,
         eps=1e-6, rope_base=1000000.0, rope_base_swa=10000.0, sliding_window=64,
         scale=dict(embd=1 / 3, output_norm=3.0, post_norm=3.0)),
    dict(name="tiny-mistral3", arch="mistral3", head_dim=32, rope_base=1000000.0, eps=1e-5,
         yarn=dict(factor=16.0, orig_ctx=128, beta_fast=32.0, beta_slow=1.0, log_mul=1.0),
         attn_temp_scale=0.1),
    # not in ../shared/tiny: pyllama's own fixture (tests/data/tiny/make_tiny_reference.py has
    # llama.cpp's logits for it); 4 layers so that layer 3 is a NoPE layer
    dict(name="tiny-smollm3", arch="smollm3", n_layer=4, head_dim=16, rope_base=100000.0, eps=1e-6),
    # olmo2: no pre-norms, post-norms, q/k norms over the whole projection; output untied
    dict(name="tiny-olmo2", arch="olmo2", head_dim=16, rope_base=500000.0, eps=1e-6, tied=False),
    # granite: embedding/residual/attention/logit scales (Granite 3's magnitudes), and the
    # optional attention-output and FFN biases
    dict(name="tiny-granite", arch="granite", head_dim=16, rope_base=10000000.0, eps=1e-5,
         granite=dict(embedding_scale=12.0, residual_scale=0.22, attention_scale=0.2, logit_scale=8.0)),
    # starcoder2: LayerNorm with biases, biases everywhere, non-gated GELU FFN, output tied
    dict(name="tiny-starcoder2", arch="starcoder2", head_dim=16, n_ff=256, rope_base=100000.0, eps=1e-5),
    # exaone4: olmo2's post-norm layout with per-head q/k norms, output tied (2 layers: no
    # sliding window, which llama.cpp gives the 64-layer model only)
    dict(name="tiny-exaone4", arch="exaone4", head_dim=16, rope_base=1000000.0, eps=1e-5),
    # glm4: pre- and post-norms, q/k/v biases, fused gate+up, NORM rope over half the head
    dict(name="tiny-glm4", arch="glm4", head_dim=16, n_rot=8, rope_base=10000.0, eps=1e-5, tied=False),
    # llama4: 4 layers (layer 3 is NoPE with full attention, 0-2 chunked with q/k L2 norms),
    # MoE (sigmoid routing by the logits, weights on the input, shared expert) in layers 1
    # and 3, dense in 0 and 2; written by _EXTRA below
    dict(name="tiny-llama4", arch="llama4", n_layer=4, head_dim=16, rope_base=500000.0, eps=1e-5, tied=False,
         n_expert=4, n_expert_used=2, n_ff_exp=64, moe_step=2),
    # phimoe: phi3's attention with biased RMS norms, output and attention-output biases,
    # softmax-routed experts of width n_ff in every layer
    dict(name="tiny-phimoe", arch="phimoe", head_dim=16, n_ff=64, rope_base=10000.0, eps=1e-5, tied=False,
         n_expert=4, n_expert_used=2),
    # granitemoe: granite's scales, softmax-routed experts of width n_ff and a shared expert
    # (the granitemoeshared layout)
    dict(name="tiny-granitemoe", arch="granitemoe", head_dim=16, n_ff=64, rope_base=10000000.0, eps=1e-5,
         n_expert=4, n_expert_used=2, n_ff_shexp=96,
         granite=dict(embedding_scale=12.0, residual_scale=0.22, attention_scale=0.2, logit_scale=8.0)),
    # glm4moe: layer 0 dense, 1-2 MoE (sigmoid, selection bias, renormalized and scaled
    # weights, a shared expert), q/k/v biases, per-head q/k norms, NEOX rope over half the
    # head; block 3 is a NextN (MTP) layer that llama.cpp and pyllama skip
    dict(name="tiny-glm4moe", arch="glm4moe", n_layer=4, head_dim=16, n_rot=8, rope_base=1000000.0, eps=1e-5,
         tied=False, n_expert=4, n_expert_used=2, n_ff_exp=64, n_expert_shared=1, n_dense_lead=1, nextn=1,
         w_scale=2.5, scale=dict(router=4.0)),
    # cohere2: parallel attention and FFN from one bias-free LayerNorm, layers 0-2 with a
    # 64-token sliding window and rope, layer 3 global without rope, logits scaled
    dict(name="tiny-cohere2", arch="cohere2", n_layer=4, head_dim=16, rope_base=50000.0, eps=1e-5,
         sliding_window=64, logit_scale=0.25),
    # gpt-oss: attention sinks, q/k/v/o biases, 64-token window on even layers, YaRN,
    # SOFTMAX_WEIGHT routing with router and expert biases, swiglu_oai experts (F32 / Q8_0:
    # the released MXFP4 experts are another issue's kernels)
    dict(name="tiny-gpt-oss", arch="gpt-oss", head_dim=16, rope_base=150000.0, eps=1e-5, tied=False,
         sliding_window=64, n_expert=4, n_expert_used=2, n_ff_exp=64,
         yarn=dict(factor=32.0, orig_ctx=4096, beta_fast=32.0, beta_slow=1.0)),
    # deepseek2 (V3 layout): MLA (q_lora 32, kv_lora 32, 16 rope dims, 32 nope dims, 32
    # value dims; one compressed KV head), YaRN with the log multiplier, layer 0 dense,
    # 1-2 MoE: 8 experts in 4 groups of which 2 are used, sigmoid with selection bias,
    # renormalized and scaled weights, a shared expert
    dict(name="tiny-deepseek2", arch="deepseek2", n_layer=3, n_head=4, n_head_kv=1, head_dim=16,
         rope_base=10000.0, eps=1e-6, tied=False, q_lora=32, kv_lora=32, n_rot=16, n_nope=32, v_mla=32,
         n_expert=8, n_expert_used=2, n_groups=4, n_group_used=2, n_ff_exp=64, n_expert_shared=1,
         n_dense_lead=1, w_scale=2.5, scale=dict(router=2.0),
         yarn=dict(factor=4.0, orig_ctx=512, log_mul=0.1)),
    # mistral4: deepseek2's layout under another name; here with softmax routing, no expert
    # groups, no selection bias, and a YaRN log multiplier other than 1 (where llama.cpp's
    # attention factor differs from deepseek2's)
    dict(name="tiny-mistral4", arch="mistral4", n_layer=3, n_head=4, n_head_kv=1, head_dim=16,
         rope_base=10000.0, eps=1e-6, tied=False, q_lora=32, kv_lora=32, n_rot=16, n_nope=32, v_mla=32,
         n_expert=8, n_expert_used=2, n_ff_exp=64, n_expert_shared=1, n_dense_lead=1, w_scale=1.0,
         gating=1, probs_b=False, yarn=dict(factor=4.0, orig_ctx=512, log_mul=0.0707)),
    # the recurrent / hybrid fixtures were made on a branch beside the MoE ones above: their
    # seeds (and so their llama.cpp references) are fixed here
    # mamba2: no attention (head_count 0, as convert_hf_to_gguf writes it); 8 heads of 16
    # channels in 2 groups; d_state 48 runs both of ggml's scan paths (32 SIMD lanes + tail)
    dict(name="tiny-mamba2", arch="mamba2", seed=1017, n_head=0, n_head_kv=0, n_ff=0, eps=1e-5, tied=False,
         ssm=dict(d_conv=4, d_inner=128, d_state=48, n_head=8, n_group=2)),
    # lfm2: short-convolution layers (head_count_kv 0) and attention layers with per-head
    # q/k norms; output norm named token_embd_norm; output tied
    dict(name="tiny-lfm2", arch="lfm2", seed=1018, n_layer=4, n_head_kv=[0, 2, 0, 2], head_dim=16, rope_base=1000000.0,
         eps=1e-5, l_cache=3),
    # qwen35: three gated delta-net layers, then a gated attention layer (interval 4);
    # 4 value heads over 2 key heads of 16; partial rope (8 of 16 dims, IMROPE sections)
    dict(name="tiny-qwen35", arch="qwen35", seed=1019, n_layer=4, head_dim=16, n_rot=8, rope_base=10000000.0, eps=1e-6,
         tied=False, ssm=dict(d_conv=4, d_inner=64, d_state=16, n_head=4, n_group=2), sections=[2, 1, 1, 0]),
    # qwen35moe: the same layers with 4 experts (2 used) and a gated shared expert
    dict(name="tiny-qwen35moe", arch="qwen35moe", seed=1020, n_layer=4, head_dim=16, n_rot=8, rope_base=10000000.0, eps=1e-6,
         tied=False, ssm=dict(d_conv=4, d_inner=64, d_state=16, n_head=4, n_group=2), sections=[2, 1, 1, 0],
         n_expert=4, n_expert_used=2, n_ff_exp=64, n_ff_shexp=96),
    # qwen3next: qwen35moe's layers with NEOX rope, a fused beta/alpha projection and the
    # key heads repeated interleaved; layer 0 has the older fused ssm_in (q, k, v, z)
    dict(name="tiny-qwen3next", arch="qwen3next", seed=1021, n_layer=4, head_dim=16, n_rot=8, rope_base=10000000.0, eps=1e-6,
         tied=False, ssm=dict(d_conv=4, d_inner=64, d_state=16, n_head=4, n_group=2),
         n_expert=4, n_expert_used=2, n_ff_exp=64, n_ff_shexp=96),
    # falcon-h1: attention and a Mamba-2 mixer side by side in every layer; FFN norm named
    # blk.N.ffn_norm (no .weight), as llama.cpp loads it
    dict(name="tiny-falcon-h1", arch="falcon-h1", seed=1022, head_dim=16, rope_base=1000000.0, eps=1e-5, tied=False,
         ssm=dict(d_conv=4, d_inner=64, d_state=16, n_head=4, n_group=1)),
    # granitehybrid: Mamba-2 layers (head_count_kv 0) and one attention layer, Granite's scales
    dict(name="tiny-granitehybrid", arch="granitehybrid", seed=1023, n_layer=4, n_head_kv=[0, 2, 0, 0], head_dim=16,
         rope_base=10000000.0, eps=1e-5, tied=False, ssm=dict(d_conv=4, d_inner=128, d_state=16, n_head=8, n_group=1),
         granite=dict(embedding_scale=12.0, residual_scale=0.22, attention_scale=0.2, logit_scale=8.0)),
    # lfm2moe: lfm2's layers; layer 0 dense, 1-3 experts (sigmoid, selection bias,
    # renormalized weights)
    dict(name="tiny-lfm2moe", arch="lfm2moe", seed=2402, n_layer=4, n_head_kv=[0, 2, 0, 2], head_dim=16,
         rope_base=1000000.0, eps=1e-5, l_cache=3, n_expert=4, n_expert_used=2, n_ff_exp=64, n_dense_lead=1,
         scale=dict(router=4.0)),
    # gemma4: layers 0-2 and 4 slide (64 tokens, head 16, 2 KV heads, rope base 10000), 3 and
    # 5 are full (head 32, 1 KV head, proportional rope: 4 of 16 frequencies rotate); layers
    # 4-5 reuse the KV cache of 2 and 3 (5 with unused k/v tensors); per-layer embeddings (32 wide); layer 0 without
    # attn_v (v = k), layer 2 with a fused attn_qkv; experts beside the dense FFN in layers 1
    # (fused gate_up) and 4 (split), with per-expert output scales; double-wide FFN in the
    # KV-sharing layers; per-layer output scales; final softcap
    dict(name="tiny-gemma4", arch="gemma4", seed=2401, n_layer=6, n_head=4, n_head_kv=[2, 2, 2, 1, 2, 1], head_dim=16,
         head_dim_full=32, n_rot_full_rotated=4, n_ff=[192, 192, 192, 192, 384, 384], rope_base=1000000.0,
         rope_base_swa=10000.0, eps=1e-6, sliding_window=64, swa=[True, True, True, False, True, False], shared_kv=2,
         n_pl=32, n_expert=4, n_expert_used=2, n_ff_exp=32, moe_layers={1: "fused", 4: "split"}, final_softcap=30.0,
         scale=dict(router=4.0)),
    # mamba (v1): x_proj into dt (rank 8), B and C; d_state 16; no dt/B/C norms
    dict(name="tiny-mamba", arch="mamba", seed=2101, n_head=0, n_head_kv=0, n_ff=0, eps=1e-5, tied=False,
         mamba=dict(d_conv=4, d_inner=128, d_state=16, dt_rank=8, dt_b_c_rms=False)),
    # falcon-mamba: the same layers with Falcon-Mamba's weightless RMS norms on dt, B and C
    dict(name="tiny-falcon-mamba", key="falcon-mamba", arch="mamba", seed=2102, n_head=0, n_head_kv=0, n_ff=0,
         eps=1e-5, mamba=dict(d_conv=4, d_inner=128, d_state=16, dt_rank=8, dt_b_c_rms=True)),
    # rwkv6: 4 WKV heads of 16, LoRA ranks 32, fused lerps, every second layer's output halved
    dict(name="tiny-rwkv6", arch="rwkv6", seed=2103, n_layer=3, n_head=0, n_head_kv=0, head_dim=16, n_ff=192,
         eps=1e-5, tied=False, rwkv=dict(head_size=16, mix_extra=32, decay_extra=32, rescale=2)),
    # rwkv7: 2 WKV heads of 32 (ggml's x86 kernel steps by 32), LoRA ranks 32 (decay, iclr,
    # gate) and 64 (value residual mix)
    dict(name="tiny-rwkv7", arch="rwkv7", seed=2104, n_layer=3, n_head=0, n_head_kv=0, head_dim=32, n_ff=192,
         eps=1e-5, tied=False, rwkv=dict(head_size=32, decay=32, iclr=32, value_mix=64, gate=32)),
    # arwkv7: RWKV-7's time mix in a Qwen2-style decoder (RMS norms, SwiGLU, one token shift);
    # layer 1 without the optional gate LoRA and GroupNorm (five lerps)
    dict(name="tiny-arwkv7", arch="arwkv7", seed=2105, n_layer=3, n_head=0, n_head_kv=0, head_dim=32, n_ff=192,
         eps=1e-6, tied=False, rwkv=dict(head_size=32, decay=32, iclr=32, value_mix=64, gate=32, bare_layers=[1])),
    # rwkv6qwen2 (QRWKV6): RWKV-6's time mix in its QRWKV form in a Qwen2-style decoder; 4 WKV
    # heads of 16 reading 2 key / value heads (GQA-style), layer 0 with the r / k / v biases,
    # the output norm's optional bias
    dict(name="tiny-rwkv6qwen2", arch="rwkv6qwen2", seed=2106, n_layer=3, n_head=0, n_head_kv=2, head_dim=16,
         n_ff=192, eps=1e-6, tied=False, rwkv=dict(head_size=16, mix_extra=32, decay_extra=32)),
    # gemma3n: 22 layers, since llama.cpp fixes the 20 layers that keep a KV cache: layers 20
    # (sliding window) and 21 (global; a pattern of 2 alternates them) read layers 18's and 19's;
    # the FFN gate is sparse on layers 0-9; AltUp, Laurel and the 256 per-layer inputs per
    # layer at llama.cpp's fixed sizes
    dict(name="tiny-gemma3n", arch="gemma3n", seed=1024, n_layer=22, n_head=4, n_head_kv=2, head_dim=32, n_ff=128,
         eps=1e-6, rope_base=1000000.0, rope_base_swa=10000.0, sliding_window=64, swa_pattern=2),
]
# architectures with recurrent layers: their layers are written by _recurrent_layers
RECURRENT = ("mamba2", "lfm2", "qwen35", "qwen35moe", "qwen3next", "falcon-h1", "granitehybrid", "lfm2moe")
SPECS = {s.get("key", s["arch"]): dict(BASE, **dict(s, seed=s.get("seed", 1000 + i))) for i, s in enumerate(_SPECS) if s is not None}


def write_tiny(arch: str, out_dir: Path, qtype: str = "F32", tokenizer_from: Path | None = None) -> Path:
    """Write ``out_dir/tiny-<arch>-<qtype>.gguf`` (qtype "F32", or "Q8_0": every 2-D weight
    quantized as ``llama-quantize --pure Q8_0`` does, norms, biases and the MoE router kept
    F32); return its path. ``tokenizer_from``: copy the tokenizer.* keys of that GGUF (one
    of ../shared/tiny's 2048-token BPE vocabularies) instead of the synthetic one, so that
    llama.cpp loads the file (it refuses a BPE vocabulary without merges); the weights are
    the same either way."""
    import gguf  # test dependency (gguf-py)

    if qtype not in ("F32", "Q8_0"):
        raise ValueError(qtype)
    s = SPECS[arch]
    path = Path(out_dir) / f"{s['name']}-{qtype}.gguf"
    if path.exists():
        return path
    A = s["arch"]
    n_embd, n_ff, hd, n_layer = s["n_embd"], s["n_ff"], s["head_dim"], s["n_layer"]
    n_q, n_kv = s["n_head"] * hd, max(np.atleast_1d(s["n_head_kv"])) * hd
    w = gguf.GGUFWriter(str(path), A)
    rng = np.random.default_rng(s["seed"])

    w.add_type("model")
    w.add_name(s["name"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if qtype == "F32" else gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_uint32(f"{A}.context_length", s["n_ctx"])
    w.add_uint32(f"{A}.embedding_length", n_embd)
    w.add_uint32(f"{A}.block_count", n_layer)
    if isinstance(n_ff, list):  # per layer (gemma4's double-wide FFN)
        w.add_array(f"{A}.feed_forward_length", n_ff)
    else:
        w.add_uint32(f"{A}.feed_forward_length", n_ff)
    w.add_uint32(f"{A}.attention.head_count", s["n_head"])
    if isinstance(s["n_head_kv"], list):  # per layer (hybrids: 0 on the recurrent layers)
        w.add_array(f"{A}.attention.head_count_kv", s["n_head_kv"])
    else:
        w.add_uint32(f"{A}.attention.head_count_kv", s["n_head_kv"])
    if A in ("phi2", "rwkv6", "rwkv7"):
        w.add_float32(f"{A}.attention.layer_norm_epsilon", s["eps"])
    elif A == "starcoder2":
        w.add_float32(f"{A}.attention.layer_norm_epsilon", s["eps"])
        w.add_float32(f"{A}.rope.freq_base", s["rope_base"])
    else:
        w.add_float32(f"{A}.attention.layer_norm_rms_epsilon", s["eps"])
        w.add_float32(f"{A}.rope.freq_base", s["rope_base"])
    if n_q != n_embd or A in ("gemma", "gemma2", "gemma3", "qwen3", "qwen3moe", "mistral3"):
        w.add_uint32(f"{A}.attention.key_length", hd)
        w.add_uint32(f"{A}.attention.value_length", hd)
    if A in ("llama", "mistral3", "smollm3"):
        w.add_uint32(f"{A}.vocab_size", N_VOCAB)
        w.add_uint32(f"{A}.rope.dimension_count", hd)
    if A == "phi3":
        w.add_uint32(f"{A}.rope.scaling.original_context_length", s["n_ctx"])
        w.add_uint32(f"{A}.rope.dimension_count", hd)
        w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    if A in ("phi2", "glm4"):
        w.add_uint32(f"{A}.rope.dimension_count", s["n_rot"])
    if A == "qwen3moe":
        w.add_uint32(f"{A}.expert_count", s["n_expert"])
        w.add_uint32(f"{A}.expert_used_count", s["n_expert_used"])
        w.add_uint32(f"{A}.expert_feed_forward_length", s["n_ff_exp"])
    if A == "gemma2":
        w.add_float32(f"{A}.attn_logit_softcapping", s["attn_softcap"])
        w.add_float32(f"{A}.final_logit_softcapping", s["final_softcap"])
        w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    if A == "gemma3":
        w.add_float32(f"{A}.rope.freq_base_swa", s["rope_base_swa"])
        w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    if A in ("olmo2", "exaone4") and s.get("sliding_window"):
        w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    if A == "granite":
        g = s["granite"]
        w.add_float32(f"{A}.embedding_scale", g["embedding_scale"])
        w.add_float32(f"{A}.residual_scale", g["residual_scale"])
        w.add_float32(f"{A}.attention.scale", g["attention_scale"])
        w.add_float32(f"{A}.logit_scale", g["logit_scale"])
    if A == "mistral3":
        y = s["yarn"]
        w.add_string(f"{A}.rope.scaling.type", "yarn")
        w.add_float32(f"{A}.rope.scaling.factor", y["factor"])
        w.add_uint32(f"{A}.rope.scaling.original_context_length", y["orig_ctx"])
        w.add_float32(f"{A}.rope.scaling.yarn_beta_fast", y["beta_fast"])
        w.add_float32(f"{A}.rope.scaling.yarn_beta_slow", y["beta_slow"])
        w.add_float32(f"{A}.rope.scaling.yarn_log_multiplier", y["log_mul"])
        w.add_float32(f"{A}.attention.temperature_scale", s["attn_temp_scale"])

    if A in _EXTRA:  # the architectures added after glm4 (tests/data/tiny/make_tiny_reference.py)
        _EXTRA[A]["keys"](w, A, s)
    if "ssm" in s:
        m = s["ssm"]
        w.add_uint32(f"{A}.ssm.conv_kernel", m["d_conv"])
        w.add_uint32(f"{A}.ssm.inner_size", m["d_inner"])
        w.add_uint32(f"{A}.ssm.state_size", m["d_state"])
        w.add_uint32(f"{A}.ssm.time_step_rank", m["n_head"])
        w.add_uint32(f"{A}.ssm.group_count", m["n_group"])

    if A in ("lfm2", "lfm2moe"):
        w.add_uint32(f"{A}.shortconv.l_cache", s["l_cache"])
    if A == "lfm2moe":
        _keys_moe(w, A, s)
        w.add_uint32(f"{A}.leading_dense_block_count", s["n_dense_lead"])
        w.add_uint32(f"{A}.expert_gating_func", 2)
    if A == "granitehybrid":
        g = s["granite"]
        w.add_float32(f"{A}.embedding_scale", g["embedding_scale"])
        w.add_float32(f"{A}.residual_scale", g["residual_scale"])
        w.add_float32(f"{A}.attention.scale", g["attention_scale"])
        w.add_float32(f"{A}.logit_scale", g["logit_scale"])
    if A in ("qwen35moe", "qwen3next"):
        w.add_uint32(f"{A}.expert_count", s["n_expert"])
        w.add_uint32(f"{A}.expert_used_count", s["n_expert_used"])
        w.add_uint32(f"{A}.expert_feed_forward_length", s["n_ff_exp"])
        w.add_uint32(f"{A}.expert_shared_feed_forward_length", s["n_ff_shexp"])
    if A in ("qwen35", "qwen35moe", "qwen3next"):
        w.add_uint32(f"{A}.attention.key_length", s["head_dim"])
        w.add_uint32(f"{A}.attention.value_length", s["head_dim"])
        w.add_uint32(f"{A}.rope.dimension_count", s["n_rot"])
        if "sections" in s:
            w.add_array(f"{A}.rope.dimension_sections", s["sections"])
        w.add_uint32(f"{A}.full_attention_interval", 4)

    if tokenizer_from is not None:
        src = gguf.GGUFReader(str(tokenizer_from))
        for k, f in src.fields.items():
            if k.startswith("tokenizer."):
                sub = f.types[1] if len(f.types) > 1 else None
                w.add_key_value(k, f.contents(), f.types[0], sub)
    else:
        _add_synthetic_vocab(w)

    scales = s.get("scale", {})

    def add(name, ne, kind, scale=None):
        shape = tuple(reversed(ne))
        sc = np.float32(scales.get(scale, 1.0)) if scale else np.float32(1.0)
        if kind == "w":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(ne[0]))
        elif kind == "embd":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(3.0 / np.sqrt(n_embd))
        elif kind == "norm":
            a = np.float32(1.0) + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        elif kind == "bias":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.1)
        elif kind == "router":
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(n_embd))
        elif kind == "conv":  # short-convolution taps (llama-quantize keeps them F32)
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(0.5)
        elif kind == "wf":  # a weight kept F32 (rows too short for Q8_0's blocks)
            a = rng.standard_normal(shape, dtype=np.float32) * np.float32(1.0 / np.sqrt(ne[0]))
        elif kind == "lerp":  # token-shift mixing factors, around 1/2
            a = np.float32(0.5) + rng.standard_normal(shape, dtype=np.float32) * np.float32(0.2)
        elif kind == "neg":  # Mamba's A = -exp(A_log)
            a = -(np.float32(0.5) + np.abs(rng.standard_normal(shape, dtype=np.float32)))
        elif isinstance(kind, tuple) and kind[0] == "const":  # given values (no draw)
            a = np.array(kind[1], dtype=np.float32).reshape(shape)
        a = np.ascontiguousarray((a * sc).astype(np.float32))
        if qtype == "Q8_0" and kind in ("w", "embd"):
            w.add_tensor(name, gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(name, a)

    add("token_embd.weight", [n_embd, N_VOCAB], "embd", scale="embd")
    if A in _EXTRA and "embd" in _EXTRA[A]:
        _EXTRA[A]["embd"](add, s)
    if A in RECURRENT:
        _recurrent_layers(add, s)
    for i in range(n_layer if A not in RECURRENT else 0):
        b = f"blk.{i}."
        if A in _EXTRA:
            _EXTRA[A]["layer"](add, b, i, s)
            continue
        if A == "phi2":
            add(b + "attn_norm.weight", [n_embd], "norm")
            add(b + "attn_norm.bias", [n_embd], "bias")
            add(b + "attn_qkv.weight", [n_embd, n_q + 2 * n_kv], "w")
            add(b + "attn_qkv.bias", [n_q + 2 * n_kv], "bias")
            add(b + "attn_output.weight", [n_q, n_embd], "w")
            add(b + "attn_output.bias", [n_embd], "bias")
            add(b + "ffn_up.weight", [n_embd, n_ff], "w")
            add(b + "ffn_up.bias", [n_ff], "bias")
            add(b + "ffn_down.weight", [n_ff, n_embd], "w")
            add(b + "ffn_down.bias", [n_embd], "bias")
            continue
        if A not in ("olmo2", "exaone4"):
            add(b + "attn_norm.weight", [n_embd], "norm")
        if A == "starcoder2":
            add(b + "attn_norm.bias", [n_embd], "bias")
        if A == "phi3":
            add(b + "attn_qkv.weight", [n_embd, n_q + 2 * n_kv], "w")
        else:
            add(b + "attn_q.weight", [n_embd, n_q], "w", scale="attn_q")
            add(b + "attn_k.weight", [n_embd, n_kv], "w", scale="attn_k")
            add(b + "attn_v.weight", [n_embd, n_kv], "w")
            if A in ("qwen2", "starcoder2", "glm4"):
                add(b + "attn_q.bias", [n_q], "bias")
                add(b + "attn_k.bias", [n_kv], "bias")
                add(b + "attn_v.bias", [n_kv], "bias")
        if A in ("qwen3", "qwen3moe", "gemma3", "exaone4"):
            add(b + "attn_q_norm.weight", [hd], "norm")
            add(b + "attn_k_norm.weight", [hd], "norm")
        if A == "olmo2":  # over the whole projection
            add(b + "attn_q_norm.weight", [n_q], "norm")
            add(b + "attn_k_norm.weight", [n_kv], "norm")
        add(b + "attn_output.weight", [n_q, n_embd], "w", scale="attn_output")
        if A in ("granite", "starcoder2"):
            add(b + "attn_output.bias", [n_embd], "bias")
        if A in ("gemma2", "gemma3", "olmo2", "exaone4", "glm4"):
            add(b + "post_attention_norm.weight", [n_embd], "norm", scale="post_norm")
        if A not in ("olmo2", "exaone4"):
            add(b + "ffn_norm.weight", [n_embd], "norm")
        if A == "starcoder2":
            add(b + "ffn_norm.bias", [n_embd], "bias")
        if A in ("phi3", "glm4"):
            add(b + "ffn_up.weight", [n_embd, 2 * n_ff], "w")
            add(b + "ffn_down.weight", [n_ff, n_embd], "w")
        elif A == "starcoder2":
            add(b + "ffn_up.weight", [n_embd, n_ff], "w")
            add(b + "ffn_up.bias", [n_ff], "bias")
            add(b + "ffn_down.weight", [n_ff, n_embd], "w")
            add(b + "ffn_down.bias", [n_embd], "bias")
        elif A == "qwen3moe":
            ne_, fe = s["n_expert"], s["n_ff_exp"]
            add(b + "ffn_gate_inp.weight", [n_embd, ne_], "router")
            add(b + "ffn_gate_exps.weight", [n_embd, fe, ne_], "w")
            add(b + "ffn_up_exps.weight", [n_embd, fe, ne_], "w")
            add(b + "ffn_down_exps.weight", [fe, n_embd, ne_], "w")
        else:
            add(b + "ffn_gate.weight", [n_embd, n_ff], "w")
            add(b + "ffn_up.weight", [n_embd, n_ff], "w")
            add(b + "ffn_down.weight", [n_ff, n_embd], "w", scale="ffn_down")
            if A == "granite":
                add(b + "ffn_gate.bias", [n_ff], "bias")
                add(b + "ffn_up.bias", [n_ff], "bias")
                add(b + "ffn_down.bias", [n_embd], "bias")
        if A in ("gemma2", "gemma3", "olmo2", "exaone4", "glm4"):
            add(b + "post_ffw_norm.weight", [n_embd], "norm", scale="post_norm")
    add("output_norm.weight" if A not in ("lfm2", "lfm2moe") else "token_embd_norm.weight", [n_embd], "norm", scale="output_norm")
    if A in _EXTRA and "output" in _EXTRA[A]:
        _EXTRA[A]["output"](add, s)
    if A in ("phi2", "starcoder2"):
        add("output_norm.bias", [n_embd], "bias")
    if not s["tied"]:
        add("output.weight", [n_embd, N_VOCAB], "embd")
        if A == "phi2":
            add("output.bias", [N_VOCAB], "bias")

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _recurrent_layers(add, s) -> None:
    """The layers of the RECURRENT architectures (llama.cpp's tensor names and shapes)."""
    n_embd, A = s["n_embd"], s["arch"]
    for i in range(s["n_layer"]):
        b = f"blk.{i}."
        if A in ("mamba2", "falcon-h1") or (A == "granitehybrid" and s["n_head_kv"][i] == 0):
            m = s["ssm"]
            di, ds, nh, ng, dc = m["d_inner"], m["d_state"], m["n_head"], m["n_group"], m["d_conv"]
            conv_dim = di + 2 * ng * ds
            add(b + "attn_norm.weight", [n_embd], "norm")
            add(b + "ssm_in.weight", [n_embd, di + conv_dim + nh], "w")
            add(b + "ssm_conv1d.weight", [dc, conv_dim], "conv")
            add(b + "ssm_conv1d.bias", [conv_dim], "bias")
            add(b + "ssm_dt.bias", [nh], "bias")
            add(b + "ssm_a", [1, nh], "neg")
            add(b + "ssm_d", [1, nh], "norm")
            add(b + "ssm_norm.weight", [di // ng, ng], "norm")
            add(b + "ssm_out.weight", [di, n_embd], "w")
            if A == "falcon-h1":
                n_ff, hd = s["n_ff"], s["head_dim"]
                n_q, n_kv = s["n_head"] * hd, s["n_head_kv"] * hd
                add(b + "attn_q.weight", [n_embd, n_q], "w")
                add(b + "attn_k.weight", [n_embd, n_kv], "w")
                add(b + "attn_v.weight", [n_embd, n_kv], "w")
                add(b + "attn_output.weight", [n_q, n_embd], "w")
                add(b + "ffn_norm", [n_embd], "norm")
                add(b + "ffn_gate.weight", [n_embd, n_ff], "w")
                add(b + "ffn_up.weight", [n_embd, n_ff], "w")
                add(b + "ffn_down.weight", [n_ff, n_embd], "w")
        if A == "granitehybrid":
            n_ff, hd = s["n_ff"], s["head_dim"]
            n_q, n_kv = s["n_head"] * hd, s["n_head_kv"][i] * hd
            if n_kv:
                add(b + "attn_norm.weight", [n_embd], "norm")
                add(b + "attn_q.weight", [n_embd, n_q], "w")
                add(b + "attn_k.weight", [n_embd, n_kv], "w")
                add(b + "attn_v.weight", [n_embd, n_kv], "w")
                add(b + "attn_output.weight", [n_q, n_embd], "w")
            add(b + "ffn_norm.weight", [n_embd], "norm")
            add(b + "ffn_gate.weight", [n_embd, n_ff], "w")
            add(b + "ffn_up.weight", [n_embd, n_ff], "w")
            add(b + "ffn_down.weight", [n_ff, n_embd], "w")
        elif A in ("qwen35", "qwen35moe", "qwen3next"):
            m, n_ff, hd = s["ssm"], s["n_ff"], s["head_dim"]
            kd, vd, nh = m["d_state"] * m["n_group"], m["d_inner"], m["n_head"]
            n_q, n_kv = s["n_head"] * hd, s["n_head_kv"] * hd
            add(b + "attn_norm.weight", [n_embd], "norm")
            if (i + 1) % 4 != 0:
                if A == "qwen3next" and i == 0:
                    add(b + "ssm_in.weight", [n_embd, 2 * kd + 2 * vd], "w")
                else:
                    add(b + "attn_qkv.weight", [n_embd, 2 * kd + vd], "w")
                    add(b + "attn_gate.weight", [n_embd, vd], "w")
                add(b + "ssm_conv1d.weight", [m["d_conv"], 2 * kd + vd], "conv")
                add(b + "ssm_dt.bias", [nh], "bias")
                add(b + "ssm_a", [nh], "neg")
                if A == "qwen3next":
                    add(b + "ssm_ba.weight", [n_embd, 2 * nh], "w")
                else:
                    add(b + "ssm_beta.weight", [n_embd, nh], "w")
                    add(b + "ssm_alpha.weight", [n_embd, nh], "w")
                add(b + "ssm_norm.weight", [m["d_state"]], "norm")
                add(b + "ssm_out.weight", [vd, n_embd], "w")
            else:
                add(b + "attn_q.weight", [n_embd, 2 * n_q], "w")
                add(b + "attn_k.weight", [n_embd, n_kv], "w")
                add(b + "attn_v.weight", [n_embd, n_kv], "w")
                add(b + "attn_q_norm.weight", [hd], "norm")
                add(b + "attn_k_norm.weight", [hd], "norm")
                add(b + "attn_output.weight", [n_q, n_embd], "w")
            add(b + "post_attention_norm.weight", [n_embd], "norm")
            if A in ("qwen35moe", "qwen3next"):
                ne_, fe, fs = s["n_expert"], s["n_ff_exp"], s["n_ff_shexp"]
                add(b + "ffn_gate_inp.weight", [n_embd, ne_], "router")
                add(b + "ffn_gate_exps.weight", [n_embd, fe, ne_], "w")
                add(b + "ffn_up_exps.weight", [n_embd, fe, ne_], "w")
                add(b + "ffn_down_exps.weight", [fe, n_embd, ne_], "w")
                add(b + "ffn_gate_inp_shexp.weight", [n_embd], "router")
                add(b + "ffn_gate_shexp.weight", [n_embd, fs], "w")
                add(b + "ffn_up_shexp.weight", [n_embd, fs], "w")
                add(b + "ffn_down_shexp.weight", [fs, n_embd], "w")
                continue
            add(b + "ffn_gate.weight", [n_embd, n_ff], "w")
            add(b + "ffn_up.weight", [n_embd, n_ff], "w")
            add(b + "ffn_down.weight", [n_ff, n_embd], "w")
        elif A in ("lfm2", "lfm2moe"):
            n_ff, hd = s["n_ff"], s["head_dim"]
            n_kv = s["n_head_kv"][i] * hd
            add(b + "attn_norm.weight", [n_embd], "norm")
            if n_kv == 0:
                add(b + "shortconv.conv.weight", [s["l_cache"], n_embd], "conv")
                add(b + "shortconv.in_proj.weight", [n_embd, 3 * n_embd], "w")
                add(b + "shortconv.out_proj.weight", [n_embd, n_embd], "w")
            else:
                add(b + "attn_q.weight", [n_embd, n_embd], "w")
                add(b + "attn_k.weight", [n_embd, n_kv], "w")
                add(b + "attn_v.weight", [n_embd, n_kv], "w")
                add(b + "attn_q_norm.weight", [hd], "norm")
                add(b + "attn_k_norm.weight", [hd], "norm")
                add(b + "attn_output.weight", [n_embd, n_embd], "w")
            add(b + "ffn_norm.weight", [n_embd], "norm")
            if A == "lfm2moe" and i >= s["n_dense_lead"]:
                _experts(add, b, s)
                add(b + "exp_probs_b.bias", [s["n_expert"]], "bias")
                continue
            add(b + "ffn_gate.weight", [n_embd, n_ff], "w")
            add(b + "ffn_up.weight", [n_embd, n_ff], "w")
            add(b + "ffn_down.weight", [n_ff, n_embd], "w")


def _add_synthetic_vocab(w) -> None:
    # synthetic vocabulary: ids 0..2047, 0 = eos/eog, 1 = bos
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list([f"<t{i}>" for i in range(N_VOCAB)])
    w.add_token_types([3 if i < 2 else 1 for i in range(N_VOCAB)])
    w.add_token_merges([])
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)


# ---- the architectures added after glm4: their keys and tensors, one function each -------------


def _keys_moe(w, A, s) -> None:
    w.add_uint32(f"{A}.expert_count", s["n_expert"])
    w.add_uint32(f"{A}.expert_used_count", s["n_expert_used"])
    w.add_uint32(f"{A}.expert_feed_forward_length", s["n_ff_exp"])


def _attn(add, b, s, bias=False) -> None:
    n_embd, hd = s["n_embd"], s["head_dim"]
    n_q, n_kv = s["n_head"] * hd, s["n_head_kv"] * hd
    add(b + "attn_q.weight", [n_embd, n_q], "w")
    add(b + "attn_k.weight", [n_embd, n_kv], "w")
    add(b + "attn_v.weight", [n_embd, n_kv], "w")
    if bias:
        add(b + "attn_q.bias", [n_q], "bias")
        add(b + "attn_k.bias", [n_kv], "bias")
        add(b + "attn_v.bias", [n_kv], "bias")
    add(b + "attn_output.weight", [n_q, n_embd], "w")


def _dense(add, b, s, n_ff=None, suffix="") -> None:
    n_embd, n_ff = s["n_embd"], n_ff or s["n_ff"]
    add(b + f"ffn_gate{suffix}.weight", [n_embd, n_ff], "w")
    add(b + f"ffn_up{suffix}.weight", [n_embd, n_ff], "w")
    add(b + f"ffn_down{suffix}.weight", [n_ff, n_embd], "w")


def _experts(add, b, s, n_ff=None) -> None:
    n_embd, ne, fe = s["n_embd"], s["n_expert"], n_ff or s["n_ff_exp"]
    add(b + "ffn_gate_inp.weight", [n_embd, ne], "router", scale="router")
    add(b + "ffn_gate_exps.weight", [n_embd, fe, ne], "w")
    add(b + "ffn_up_exps.weight", [n_embd, fe, ne], "w")
    add(b + "ffn_down_exps.weight", [fe, n_embd, ne], "w")


def _keys_llama4(w, A, s) -> None:
    _keys_moe(w, A, s)
    w.add_uint32(f"{A}.interleave_moe_layer_step", s["moe_step"])


def _layer_llama4(add, b, i, s) -> None:
    add(b + "attn_norm.weight", [s["n_embd"]], "norm")
    _attn(add, b, s)
    add(b + "ffn_norm.weight", [s["n_embd"]], "norm")
    if (i + 1) % s["moe_step"] == 0:
        _experts(add, b, s)
        _dense(add, b, s, n_ff=s["n_ff_exp"], suffix="_shexp")
    else:
        _dense(add, b, s)


def _keys_phimoe(w, A, s) -> None:
    w.add_uint32(f"{A}.expert_count", s["n_expert"])
    w.add_uint32(f"{A}.expert_used_count", s["n_expert_used"])


def _layer_phimoe(add, b, i, s) -> None:
    n_embd = s["n_embd"]
    add(b + "attn_norm.weight", [n_embd], "norm")
    add(b + "attn_norm.bias", [n_embd], "bias")
    _attn(add, b, s, bias=True)
    add(b + "attn_output.bias", [n_embd], "bias")
    add(b + "ffn_norm.weight", [n_embd], "norm")
    add(b + "ffn_norm.bias", [n_embd], "bias")
    _experts(add, b, s, n_ff=s["n_ff"])


def _output_phimoe(add, s) -> None:
    add("output_norm.bias", [s["n_embd"]], "bias")
    add("output.bias", [N_VOCAB], "bias")  # output.weight: tied=False


def _keys_granitemoe(w, A, s) -> None:
    _keys_phimoe(w, A, s)
    w.add_uint32(f"{A}.expert_shared_feed_forward_length", s["n_ff_shexp"])
    g = s["granite"]
    w.add_float32(f"{A}.embedding_scale", g["embedding_scale"])
    w.add_float32(f"{A}.residual_scale", g["residual_scale"])
    w.add_float32(f"{A}.attention.scale", g["attention_scale"])
    w.add_float32(f"{A}.logit_scale", g["logit_scale"])


def _layer_granitemoe(add, b, i, s) -> None:
    add(b + "attn_norm.weight", [s["n_embd"]], "norm")
    _attn(add, b, s)
    add(b + "ffn_norm.weight", [s["n_embd"]], "norm")
    _experts(add, b, s, n_ff=s["n_ff"])
    _dense(add, b, s, n_ff=s["n_ff_shexp"], suffix="_shexp")


def _keys_glm4moe(w, A, s) -> None:
    _keys_moe(w, A, s)
    w.add_uint32(f"{A}.rope.dimension_count", s["n_rot"])
    w.add_uint32(f"{A}.expert_shared_count", s["n_expert_shared"])
    w.add_uint32(f"{A}.leading_dense_block_count", s["n_dense_lead"])
    w.add_float32(f"{A}.expert_weights_scale", s["w_scale"])
    w.add_bool(f"{A}.expert_weights_norm", True)
    w.add_uint32(f"{A}.expert_gating_func", 2)
    w.add_uint32(f"{A}.nextn_predict_layers", s["nextn"])


def _layer_glm4moe(add, b, i, s) -> None:
    n_embd, hd = s["n_embd"], s["head_dim"]
    add(b + "attn_norm.weight", [n_embd], "norm")
    _attn(add, b, s, bias=True)
    add(b + "attn_q_norm.weight", [hd], "norm")
    add(b + "attn_k_norm.weight", [hd], "norm")
    add(b + "post_attention_norm.weight", [n_embd], "norm")
    if i < s["n_dense_lead"]:
        _dense(add, b, s)
        return
    _experts(add, b, s)
    add(b + "exp_probs_b.bias", [s["n_expert"]], "bias")
    _dense(add, b, s, n_ff=s["n_ff_exp"] * s["n_expert_shared"], suffix="_shexp")
    if i >= s["n_layer"] - s["nextn"]:  # the NextN layer's own tensors
        add(b + "nextn.eh_proj.weight", [2 * n_embd, n_embd], "w")
        add(b + "nextn.enorm.weight", [n_embd], "norm")
        add(b + "nextn.hnorm.weight", [n_embd], "norm")
        add(b + "nextn.shared_head_norm.weight", [n_embd], "norm")


def _keys_cohere2(w, A, s) -> None:
    w.add_float32(f"{A}.attention.layer_norm_epsilon", s["eps"])
    w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    w.add_float32(f"{A}.logit_scale", s["logit_scale"])


def _layer_cohere2(add, b, i, s) -> None:
    add(b + "attn_norm.weight", [s["n_embd"]], "norm")
    _attn(add, b, s)
    _dense(add, b, s)


def _keys_gpt_oss(w, A, s) -> None:
    _keys_moe(w, A, s)
    w.add_uint32(f"{A}.attention.key_length", s["head_dim"])
    w.add_uint32(f"{A}.attention.value_length", s["head_dim"])
    w.add_uint32(f"{A}.rope.dimension_count", s["head_dim"])
    w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    y = s["yarn"]
    w.add_string(f"{A}.rope.scaling.type", "yarn")
    w.add_float32(f"{A}.rope.scaling.factor", y["factor"])
    w.add_uint32(f"{A}.rope.scaling.original_context_length", y["orig_ctx"])


def _layer_gpt_oss(add, b, i, s) -> None:
    n_embd, ne, fe = s["n_embd"], s["n_expert"], s["n_ff_exp"]
    add(b + "attn_norm.weight", [n_embd], "norm")
    _attn(add, b, s, bias=True)
    add(b + "attn_output.bias", [n_embd], "bias")
    add(b + "attn_sinks.weight", [s["n_head"]], "norm")
    add(b + "post_attention_norm.weight", [n_embd], "norm")
    _experts(add, b, s)
    add(b + "ffn_gate_inp.bias", [ne], "bias")
    add(b + "ffn_gate_exps.bias", [fe, ne], "bias")
    add(b + "ffn_up_exps.bias", [fe, ne], "bias")
    add(b + "ffn_down_exps.bias", [n_embd, ne], "bias")


def _keys_deepseek2(w, A, s) -> None:
    _keys_moe(w, A, s)
    kv, r = s["kv_lora"], s["n_rot"]
    w.add_uint32(f"{A}.attention.q_lora_rank", s["q_lora"])
    w.add_uint32(f"{A}.attention.kv_lora_rank", kv)
    w.add_uint32(f"{A}.attention.key_length", kv + r)
    w.add_uint32(f"{A}.attention.value_length", kv)
    w.add_uint32(f"{A}.attention.key_length_mla", s["n_nope"] + r)
    w.add_uint32(f"{A}.attention.value_length_mla", s["v_mla"])
    w.add_uint32(f"{A}.rope.dimension_count", r)
    w.add_uint32(f"{A}.expert_shared_count", s["n_expert_shared"])
    w.add_uint32(f"{A}.leading_dense_block_count", s["n_dense_lead"])
    w.add_float32(f"{A}.expert_weights_scale", s["w_scale"])
    w.add_bool(f"{A}.expert_weights_norm", True)
    w.add_uint32(f"{A}.expert_gating_func", s.get("gating", 2))
    if "n_groups" in s:
        w.add_uint32(f"{A}.expert_group_count", s["n_groups"])
        w.add_uint32(f"{A}.expert_group_used_count", s["n_group_used"])
    y = s["yarn"]
    w.add_string(f"{A}.rope.scaling.type", "yarn")
    w.add_float32(f"{A}.rope.scaling.factor", y["factor"])
    w.add_uint32(f"{A}.rope.scaling.original_context_length", y["orig_ctx"])
    w.add_float32(f"{A}.rope.scaling.yarn_log_multiplier", y["log_mul"])


def _layer_deepseek2(add, b, i, s) -> None:
    n_embd, nh, kv, r = s["n_embd"], s["n_head"], s["kv_lora"], s["n_rot"]
    nope, v = s["n_nope"], s["v_mla"]
    add(b + "attn_norm.weight", [n_embd], "norm")
    add(b + "attn_q_a.weight", [n_embd, s["q_lora"]], "w")
    add(b + "attn_q_a_norm.weight", [s["q_lora"]], "norm")
    add(b + "attn_q_b.weight", [s["q_lora"], nh * (nope + r)], "w")
    add(b + "attn_kv_a_mqa.weight", [n_embd, kv + r], "w")
    add(b + "attn_kv_a_norm.weight", [kv], "norm")
    add(b + "attn_k_b.weight", [nope, kv, nh], "w")
    add(b + "attn_v_b.weight", [kv, v, nh], "w")
    add(b + "attn_output.weight", [nh * v, n_embd], "w")
    add(b + "ffn_norm.weight", [n_embd], "norm")
    if i < s["n_dense_lead"]:
        _dense(add, b, s)
        return
    _experts(add, b, s)
    if s.get("probs_b", True):
        add(b + "exp_probs_b.bias", [s["n_expert"]], "bias")
    _dense(add, b, s, n_ff=s["n_ff_exp"] * s["n_expert_shared"], suffix="_shexp")


def _keys_gemma4(w, A, s) -> None:
    _keys_moe(w, A, s)
    hf = s["head_dim_full"]
    w.add_uint32(f"{A}.attention.key_length", hf)
    w.add_uint32(f"{A}.attention.value_length", hf)
    w.add_uint32(f"{A}.attention.key_length_swa", s["head_dim"])
    w.add_uint32(f"{A}.attention.value_length_swa", s["head_dim"])
    w.add_uint32(f"{A}.rope.dimension_count", hf)
    w.add_uint32(f"{A}.rope.dimension_count_swa", s["head_dim"])
    w.add_float32(f"{A}.rope.freq_base_swa", s["rope_base_swa"])
    w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    w.add_array(f"{A}.attention.sliding_window_pattern", s["swa"])
    w.add_uint32(f"{A}.attention.shared_kv_layers", s["shared_kv"])
    w.add_uint32(f"{A}.embedding_length_per_layer_input", s["n_pl"])
    w.add_float32(f"{A}.final_logit_softcapping", s["final_softcap"])


def _embd_gemma4(add, s) -> None:
    n_pl, nl = s["n_pl"], s["n_layer"]
    if n_pl:
        add("per_layer_token_embd.weight", [n_pl * nl, N_VOCAB], "embd")
        add("per_layer_model_proj.weight", [s["n_embd"], n_pl * nl], "w")
        add("per_layer_proj_norm.weight", [n_pl], "norm")
    # the full layers' proportional rope: 1 on the rotated frequencies, 1e30 on the others
    nr = s["n_rot_full_rotated"]
    add("rope_freqs.weight", [s["head_dim_full"] // 2], ("const", [1.0] * nr + [1e30] * (s["head_dim_full"] // 2 - nr)))


def _layer_gemma4(add, b, i, s) -> None:
    n_embd, swa = s["n_embd"], s["swa"][i]
    hd = s["head_dim"] if swa else s["head_dim_full"]
    n_q, n_kv = s["n_head"] * hd, s["n_head_kv"][i] * hd
    has_kv = i < s["n_layer"] - s["shared_kv"]
    # layer 5 keeps the k/v projections and k norm it does not use (as converted files do)
    kv_tensors = has_kv or i == 5
    add(b + "attn_norm.weight", [n_embd], "norm")
    if i == s.get("fused_qkv_layer", 2):
        add(b + "attn_qkv.weight", [n_embd, n_q + 2 * n_kv], "w")
    else:
        add(b + "attn_q.weight", [n_embd, n_q], "w")
        if kv_tensors:
            add(b + "attn_k.weight", [n_embd, n_kv], "w")
            if i != s.get("k_as_v_layer", 0):
                add(b + "attn_v.weight", [n_embd, n_kv], "w")
    add(b + "attn_output.weight", [n_q, n_embd], "w")
    add(b + "attn_q_norm.weight", [hd], "norm")
    if kv_tensors:
        add(b + "attn_k_norm.weight", [hd], "norm")
    add(b + "post_attention_norm.weight", [n_embd], "norm")
    add(b + "layer_output_scale.weight", [1], "norm")
    add(b + "ffn_norm.weight", [n_embd], "norm")
    _dense(add, b, s, n_ff=s["n_ff"][i])
    add(b + "post_ffw_norm.weight", [n_embd], "norm")
    moe = s["moe_layers"].get(i)
    if moe:
        ne_, fe = s["n_expert"], s["n_ff_exp"]
        add(b + "ffn_gate_inp.weight", [n_embd, ne_], "router", scale="router")
        add(b + "ffn_gate_inp.scale", [n_embd], "norm")
        add(b + "pre_ffw_norm_2.weight", [n_embd], "norm")
        add(b + "post_ffw_norm_1.weight", [n_embd], "norm")
        add(b + "post_ffw_norm_2.weight", [n_embd], "norm")
        if moe == "fused":
            add(b + "ffn_gate_up_exps.weight", [n_embd, 2 * fe, ne_], "w")
        else:
            add(b + "ffn_gate_exps.weight", [n_embd, fe, ne_], "w")
            add(b + "ffn_up_exps.weight", [n_embd, fe, ne_], "w")
        add(b + "ffn_down_exps.weight", [fe, n_embd, ne_], "w")
        add(b + "ffn_down_exps.scale", [ne_], "norm")
    if s["n_pl"]:
        add(b + "inp_gate.weight", [n_embd, s["n_pl"]], "w")
        add(b + "proj.weight", [s["n_pl"], n_embd], "w")
        add(b + "post_norm.weight", [n_embd], "norm")


def _keys_mamba(w, A, s) -> None:
    m = s["mamba"]
    w.add_uint32(f"{A}.ssm.conv_kernel", m["d_conv"])
    w.add_uint32(f"{A}.ssm.inner_size", m["d_inner"])
    w.add_uint32(f"{A}.ssm.state_size", m["d_state"])
    w.add_uint32(f"{A}.ssm.time_step_rank", m["dt_rank"])
    w.add_bool(f"{A}.ssm.dt_b_c_rms", m["dt_b_c_rms"])


def _layer_mamba(add, b, i, s) -> None:
    n_embd, m = s["n_embd"], s["mamba"]
    di, ds, dc, dtr = m["d_inner"], m["d_state"], m["d_conv"], m["dt_rank"]
    add(b + "attn_norm.weight", [n_embd], "norm")
    add(b + "ssm_in.weight", [n_embd, 2 * di], "w")
    add(b + "ssm_conv1d.weight", [dc, di], "conv")
    add(b + "ssm_conv1d.bias", [di], "bias")
    add(b + "ssm_x.weight", [di, dtr + 2 * ds], "w")
    add(b + "ssm_dt.weight", [dtr, di], "wf")
    add(b + "ssm_dt.bias", [di], "bias")
    add(b + "ssm_a", [ds, di], "neg")
    add(b + "ssm_d", [di], "norm")
    add(b + "ssm_out.weight", [di, n_embd], "w")


def _rwkv_norms(add, b, i, ne) -> None:
    if i == 0:
        add("token_embd_norm.weight", [ne], "norm")
        add("token_embd_norm.bias", [ne], "bias")
    add(b + "attn_norm.weight", [ne], "norm")
    add(b + "attn_norm.bias", [ne], "bias")
    add(b + "attn_norm_2.weight", [ne], "norm")
    add(b + "attn_norm_2.bias", [ne], "bias")


def _keys_rwkv6(w, A, s) -> None:
    r = s["rwkv"]
    w.add_uint32(f"{A}.wkv.head_size", r["head_size"])
    w.add_uint32(f"{A}.time_mix_extra_dim", r["mix_extra"])
    w.add_uint32(f"{A}.time_decay_extra_dim", r["decay_extra"])
    if A == "rwkv6":
        w.add_uint32(f"{A}.rescale_every_n_layers", r["rescale"])
    w.add_uint32(f"{A}.token_shift_count", 2 if A == "rwkv6" else 1)


def _time_mix_rwkv6(add, b, i, s, qwen2: bool) -> None:
    """rwkv6's time mix; rwkv6qwen2's QRWKV form (no first / GroupNorm, kv heads, layer 0's biases)."""
    ne, r = s["n_embd"], s["rwkv"]
    e, d, hs = r["mix_extra"], r["decay_extra"], r["head_size"]
    kvw = s["n_head_kv"] * hs if qwen2 else ne
    add(b + "time_mix_w1.weight", [ne, 5 * e], "w")
    add(b + "time_mix_w2.weight", [e, ne, 5], "w")
    add(b + "time_mix_lerp_x.weight", [ne, 1, 1], "lerp")
    add(b + "time_mix_lerp_fused.weight", [ne, 1, 1, 5], "lerp")
    if not qwen2:
        add(b + "time_mix_first.weight", [hs, ne // hs], "bias")
    add(b + "time_mix_decay.weight", [ne], "bias")
    add(b + "time_mix_decay_w1.weight", [ne, d], "w")
    add(b + "time_mix_decay_w2.weight", [d, ne], "w")
    for m in ("key", "value", "receptance", "gate"):
        add(b + f"time_mix_{m}.weight", [ne, kvw if m in ("key", "value") else ne], "w")
    if qwen2 and i == 0:
        add(b + "time_mix_receptance.bias", [ne], "bias")
        add(b + "time_mix_key.bias", [kvw], "bias")
        add(b + "time_mix_value.bias", [kvw], "bias")
    if not qwen2:
        add(b + "time_mix_ln.weight", [ne], "norm")
        add(b + "time_mix_ln.bias", [ne], "bias")
    add(b + "time_mix_output.weight", [ne, ne], "w")


def _layer_rwkv6(add, b, i, s) -> None:
    ne, nf = s["n_embd"], s["n_ff"]
    _rwkv_norms(add, b, i, ne)
    _time_mix_rwkv6(add, b, i, s, qwen2=False)
    add(b + "channel_mix_lerp_k.weight", [ne, 1, 1], "lerp")
    add(b + "channel_mix_lerp_r.weight", [ne, 1, 1], "lerp")
    add(b + "channel_mix_key.weight", [ne, nf], "w")
    add(b + "channel_mix_value.weight", [nf, ne], "w")
    add(b + "channel_mix_receptance.weight", [ne, ne], "w")


def _layer_rwkv6qwen2(add, b, i, s) -> None:
    ne, nf = s["n_embd"], s["n_ff"]
    add(b + "attn_norm.weight", [ne], "norm")
    _time_mix_rwkv6(add, b, i, s, qwen2=True)
    add(b + "ffn_norm.weight", [ne], "norm")
    add(b + "ffn_gate.weight", [ne, nf], "w")
    add(b + "ffn_up.weight", [ne, nf], "w")
    add(b + "ffn_down.weight", [nf, ne], "w")


def _keys_rwkv7(w, A, s) -> None:
    r = s["rwkv"]
    w.add_uint32(f"{A}.wkv.head_size", r["head_size"])
    w.add_uint32(f"{A}.attention.decay_lora_rank", r["decay"])
    w.add_uint32(f"{A}.attention.iclr_lora_rank", r["iclr"])
    w.add_uint32(f"{A}.attention.value_residual_mix_lora_rank", r["value_mix"])
    w.add_uint32(f"{A}.attention.gate_lora_rank", r["gate"])
    w.add_uint32(f"{A}.token_shift_count", 2 if A == "rwkv7" else 1)


def _time_mix_rwkv7(add, b, i, s) -> None:
    ne, r = s["n_embd"], s["rwkv"]
    full = i not in r.get("bare_layers", ())
    rv = r["iclr"] if i == 0 else r["value_mix"]
    for x, rank in (("w", r["decay"]), ("a", r["iclr"]), ("v", rv), ("g", r["gate"])):
        if x != "g":
            add(b + f"time_mix_{x}0.weight", [ne], "bias")
        if x != "g" or full:
            add(b + f"time_mix_{x}1.weight", [ne, rank], "w")
            add(b + f"time_mix_{x}2.weight", [rank, ne], "w")
    add(b + "time_mix_lerp_fused.weight", [ne, 1, 1, 6 if full else 5], "lerp")
    add(b + "time_mix_k_k.weight", [ne], "norm")
    add(b + "time_mix_k_a.weight", [ne], "norm")
    add(b + "time_mix_r_k.weight", [ne], "bias")
    for m in ("key", "value", "receptance"):
        add(b + f"time_mix_{m}.weight", [ne, ne], "w")
    if full:
        add(b + "time_mix_ln.weight", [ne], "norm")
        add(b + "time_mix_ln.bias", [ne], "bias")
    add(b + "time_mix_output.weight", [ne, ne], "w")


def _layer_arwkv7(add, b, i, s) -> None:
    ne, nf = s["n_embd"], s["n_ff"]
    add(b + "attn_norm.weight", [ne], "norm")
    _time_mix_rwkv7(add, b, i, s)
    add(b + "ffn_norm.weight", [ne], "norm")
    add(b + "ffn_gate.weight", [ne, nf], "w")
    add(b + "ffn_up.weight", [ne, nf], "w")
    add(b + "ffn_down.weight", [nf, ne], "w")


def _layer_rwkv7(add, b, i, s) -> None:
    ne, nf = s["n_embd"], s["n_ff"]
    _rwkv_norms(add, b, i, ne)
    _time_mix_rwkv7(add, b, i, s)
    add(b + "channel_mix_lerp_k.weight", [ne, 1, 1], "lerp")
    add(b + "channel_mix_key.weight", [ne, nf], "w")
    add(b + "channel_mix_value.weight", [nf, ne], "w")


def _output_rwkv6(add, s) -> None:
    add("output_norm.bias", [s["n_embd"]], "bias")
# gemma3n's sizes that llama.cpp fixes (src/llama-hparams.h, src/models/models.h)
G3N_ALTUP, G3N_EMBD_ALTUP, G3N_LAUREL_RANK, G3N_KV_LAYERS, G3N_SPARSE_LAYERS = 4, 256, 64, 20, 10


def _keys_gemma3n(w, A, s) -> None:
    # what convert_hf_to_gguf writes (llama.cpp reads only the window, its pattern and rope
    # base; the pattern as the converter writes it, one bool per layer)
    w.add_float32(f"{A}.rope.freq_base_swa", s["rope_base_swa"])
    w.add_uint32(f"{A}.attention.sliding_window", s["sliding_window"])
    w.add_array(f"{A}.attention.sliding_window_pattern", [i % s["swa_pattern"] < s["swa_pattern"] - 1
                                                          for i in range(s["n_layer"])])
    w.add_float32(f"{A}.final_logit_softcapping", 30.0)
    w.add_uint32(f"{A}.altup.active_idx", 0)
    w.add_uint32(f"{A}.altup.num_inputs", G3N_ALTUP)
    w.add_uint32(f"{A}.embedding_length_per_layer_input", G3N_EMBD_ALTUP)
    w.add_uint32(f"{A}.attention.shared_kv_layers", s["n_layer"] - G3N_KV_LAYERS)
    w.add_array(f"{A}.activation_sparsity_scale",
                [1.6448533535003662 if i < G3N_SPARSE_LAYERS else float("-inf") for i in range(s["n_layer"])])


def _layer_gemma3n(add, b, i, s) -> None:
    n_embd, hd = s["n_embd"], s["head_dim"]
    add(b + "attn_norm.weight", [n_embd], "norm")
    _attn(add, b, s)
    add(b + "attn_q_norm.weight", [hd], "norm")
    add(b + "attn_k_norm.weight", [hd], "norm")
    add(b + "post_attention_norm.weight", [n_embd], "norm")
    add(b + "ffn_norm.weight", [n_embd], "norm")
    _dense(add, b, s)
    add(b + "post_ffw_norm.weight", [n_embd], "norm")
    add(b + "inp_gate.weight", [n_embd, G3N_EMBD_ALTUP], "w")
    add(b + "proj.weight", [G3N_EMBD_ALTUP, n_embd], "w")
    add(b + "post_norm.weight", [n_embd], "norm")
    add(b + "altup_correct_coef.weight", [G3N_ALTUP, G3N_ALTUP], "wf")
    add(b + "altup_correct_scale.weight", [n_embd], "norm")
    add(b + "altup_predict_coef.weight", [G3N_ALTUP, G3N_ALTUP * G3N_ALTUP], "wf")
    add(b + "altup_router.weight", [n_embd, G3N_ALTUP], "wf")
    add(b + "altup_router_norm.weight", [n_embd], "norm")
    add(b + "laurel_l.weight", [n_embd, G3N_LAUREL_RANK], "wf")
    add(b + "laurel_r.weight", [G3N_LAUREL_RANK, n_embd], "wf")
    add(b + "laurel_post_norm.weight", [n_embd], "norm")


def _output_gemma3n(add, s) -> None:
    n_embd, n_layer = s["n_embd"], s["n_layer"]
    add("altup_proj.weight", [n_embd, n_embd, G3N_ALTUP - 1], "wf")
    add("altup_unembd_proj.weight", [n_embd, n_embd, G3N_ALTUP - 1], "wf")
    add("per_layer_token_embd.weight", [G3N_EMBD_ALTUP * n_layer, N_VOCAB], "embd")
    add("per_layer_model_proj.weight", [n_embd, G3N_EMBD_ALTUP * n_layer], "wf")
    add("per_layer_proj_norm.weight", [G3N_EMBD_ALTUP], "norm")


_EXTRA = {
    "rwkv6": dict(keys=_keys_rwkv6, layer=_layer_rwkv6, output=_output_rwkv6),
    "rwkv7": dict(keys=_keys_rwkv7, layer=_layer_rwkv7, output=_output_rwkv6),
    "arwkv7": dict(keys=_keys_rwkv7, layer=_layer_arwkv7),
    "rwkv6qwen2": dict(keys=_keys_rwkv6, layer=_layer_rwkv6qwen2, output=_output_rwkv6),
    "mamba": dict(keys=_keys_mamba, layer=_layer_mamba),
    "llama4": dict(keys=_keys_llama4, layer=_layer_llama4),
    "phimoe": dict(keys=_keys_phimoe, layer=_layer_phimoe, output=_output_phimoe),
    "granitemoe": dict(keys=_keys_granitemoe, layer=_layer_granitemoe),
    "glm4moe": dict(keys=_keys_glm4moe, layer=_layer_glm4moe),
    "cohere2": dict(keys=_keys_cohere2, layer=_layer_cohere2),
    "gpt-oss": dict(keys=_keys_gpt_oss, layer=_layer_gpt_oss),
    "deepseek2": dict(keys=_keys_deepseek2, layer=_layer_deepseek2),
    "mistral4": dict(keys=_keys_deepseek2, layer=_layer_deepseek2),
    "gemma4": dict(keys=_keys_gemma4, layer=_layer_gemma4, embd=_embd_gemma4),
    "gemma3n": dict(keys=_keys_gemma3n, layer=_layer_gemma3n, output=_output_gemma3n),
}
