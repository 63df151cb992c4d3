//! Test support (cargo tests only): a tiny LLaMA model with random F32 weights, written by
//! the test as a GGUF file and loaded like any other, plus a plain f64 reference of its
//! forward pass (llama.cpp's llama graph: RMSNorm, NORM rope, GQA causal attention,
//! SwiGLU, tied output) to hold the real one to.

use crate::context::{BatchRef, Context, ContextParams, Decoded};
use crate::ggml_type::GgmlType;
use crate::gguf::Value;
use crate::model::{LoadParams, Model};
use std::sync::Arc;

/// Deterministic uniform draws in [-1, 1) (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let u = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
        (u as f32 / (1u64 << 23) as f32) - 1.0
    }
    pub fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }
}

/// The shape of a tiny LLaMA and its weights (row-major [rows, cols] as ggml stores a
/// [cols, rows] tensor: one output row after another).
pub struct Tiny {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_ff: usize,
    pub n_layer: usize,
    pub eps: f32,
    pub freq_base: f32,
    /// (name, ggml ne, data)
    pub tensors: Vec<(String, [u64; 4], Vec<f32>)>,
}

impl Tiny {
    /// n_vocab 64, n_embd 32, 4 heads of 8 over 2 KV heads (GQA), n_ff 48, 2 layers.
    pub fn new(seed: u64) -> Tiny {
        let (n_vocab, n_embd, n_head, n_head_kv, n_ff, n_layer) = (64usize, 32usize, 4usize, 2usize, 48usize, 2usize);
        let hd = n_embd / n_head;
        let mut r = Rng::new(seed);
        let mut t = Vec::new();
        let mut add = |name: String, cols: usize, rows: usize, scale: f32, base: f32| {
            let data: Vec<f32> = r.vec(cols * rows, scale).into_iter().map(|x| x + base).collect();
            t.push((name, [cols as u64, rows as u64, 1, 1], data));
        };
        add("token_embd.weight".into(), n_embd, n_vocab, 1.0, 0.0);
        for il in 0..n_layer {
            let b = format!("blk.{il}");
            add(format!("{b}.attn_norm.weight"), n_embd, 1, 0.2, 1.0);
            add(format!("{b}.attn_q.weight"), n_embd, n_head * hd, 0.3, 0.0);
            add(format!("{b}.attn_k.weight"), n_embd, n_head_kv * hd, 0.3, 0.0);
            add(format!("{b}.attn_v.weight"), n_embd, n_head_kv * hd, 0.3, 0.0);
            add(format!("{b}.attn_output.weight"), n_head * hd, n_embd, 0.3, 0.0);
            add(format!("{b}.ffn_norm.weight"), n_embd, 1, 0.2, 1.0);
            add(format!("{b}.ffn_gate.weight"), n_embd, n_ff, 0.3, 0.0);
            add(format!("{b}.ffn_up.weight"), n_embd, n_ff, 0.3, 0.0);
            add(format!("{b}.ffn_down.weight"), n_ff, n_embd, 0.3, 0.0);
        }
        add("output_norm.weight".into(), n_embd, 1, 0.2, 1.0);
        Tiny { n_vocab, n_embd, n_head, n_head_kv, n_ff, n_layer, eps: 1e-5, freq_base: 10000.0, tensors: t }
    }

    fn w(&self, name: &str) -> &[f32] {
        &self.tensors.iter().find(|t| t.0 == name).unwrap_or_else(|| panic!("no tensor {name}")).2
    }

    /// Write the GGUF file into a fresh temporary directory, load it and delete it.
    pub fn load(&self, tag: &str) -> Arc<Model> {
        let dir = std::env::temp_dir().join(format!("pyllama-test-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny-llama.gguf").to_string_lossy().into_owned();
        let u = |x: usize| Value::U32(x as u32);
        let kv = vec![
            ("general.architecture".to_string(), Value::String(b"llama".to_vec())),
            ("llama.context_length".into(), u(512)),
            ("llama.embedding_length".into(), u(self.n_embd)),
            ("llama.block_count".into(), u(self.n_layer)),
            ("llama.feed_forward_length".into(), u(self.n_ff)),
            ("llama.attention.head_count".into(), u(self.n_head)),
            ("llama.attention.head_count_kv".into(), u(self.n_head_kv)),
            ("llama.attention.layer_norm_rms_epsilon".into(), Value::F32(self.eps)),
            ("llama.rope.freq_base".into(), Value::F32(self.freq_base)),
        ];
        crate::quantize::write_gguf_f32(&path, &kv, &self.tensors).unwrap();
        // read into memory (load_mode none): the file can go at once
        let lp = LoadParams { load_mode: crate::gguf::storage::LoadMode::None, ..LoadParams::default() };
        let m = Model::load(&[path], lp).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        Arc::new(m)
    }

    /// The plain reference: logits [n_vocab] of the last token of `tokens` (positions
    /// 0..n), in f64 from the same f32 weights.
    pub fn reference_logits(&self, tokens: &[i32]) -> Vec<f32> {
        let (ne, nh, nkv, ff) = (self.n_embd, self.n_head, self.n_head_kv, self.n_ff);
        let hd = ne / nh;
        let n = tokens.len();
        let f = |v: &[f32]| v.iter().map(|&x| x as f64).collect::<Vec<f64>>();
        let matvec = |w: &[f32], x: &[f64], rows: usize| -> Vec<f64> {
            let cols = x.len();
            (0..rows).map(|o| (0..cols).map(|i| w[o * cols + i] as f64 * x[i]).sum()).collect()
        };
        let norm = |x: &[f64], w: &[f32]| -> Vec<f64> {
            let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
            let s = 1.0 / (ms + self.eps as f64).sqrt();
            x.iter().zip(w).map(|(v, &g)| v * s * g as f64).collect()
        };
        // NORM rope: adjacent pairs, theta = pos * base^(-2i/hd)
        let rope = |v: &mut [f64], pos: usize| {
            for h in 0..v.len() / hd {
                for i in 0..hd / 2 {
                    let th = pos as f64 * (self.freq_base as f64).powf(-2.0 * i as f64 / hd as f64);
                    let (c, s) = (th.cos(), th.sin());
                    let (a, b) = (v[h * hd + 2 * i], v[h * hd + 2 * i + 1]);
                    v[h * hd + 2 * i] = a * c - b * s;
                    v[h * hd + 2 * i + 1] = a * s + b * c;
                }
            }
        };
        let emb = self.w("token_embd.weight");
        let mut x: Vec<Vec<f64>> = tokens.iter().map(|&t| f(&emb[t as usize * ne..(t as usize + 1) * ne])).collect();
        for il in 0..self.n_layer {
            let b = |s: &str| format!("blk.{il}.{s}.weight");
            let (mut qs, mut ks, mut vs) = (Vec::new(), Vec::new(), Vec::new());
            for (p, xp) in x.iter().enumerate() {
                let c = norm(xp, self.w(&b("attn_norm")));
                let mut q = matvec(self.w(&b("attn_q")), &c, nh * hd);
                let mut k = matvec(self.w(&b("attn_k")), &c, nkv * hd);
                rope(&mut q, p);
                rope(&mut k, p);
                qs.push(q);
                ks.push(k);
                vs.push(matvec(self.w(&b("attn_v")), &c, nkv * hd));
            }
            for p in 0..n {
                let mut att = vec![0f64; nh * hd];
                for h in 0..nh {
                    let g = h / (nh / nkv);
                    let q = &qs[p][h * hd..(h + 1) * hd];
                    let sc: Vec<f64> = (0..=p)
                        .map(|j| q.iter().zip(&ks[j][g * hd..(g + 1) * hd]).map(|(a, b)| a * b).sum::<f64>() / (hd as f64).sqrt())
                        .collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, w) in e.iter().enumerate() {
                        for d in 0..hd {
                            att[h * hd + d] += w / z * vs[j][g * hd + d];
                        }
                    }
                }
                let o = matvec(self.w(&b("attn_output")), &att, ne);
                for (xi, oi) in x[p].iter_mut().zip(o) {
                    *xi += oi;
                }
                let c = norm(&x[p], self.w(&b("ffn_norm")));
                let gate = matvec(self.w(&b("ffn_gate")), &c, ff);
                let up = matvec(self.w(&b("ffn_up")), &c, ff);
                let hmid: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
                let d = matvec(self.w(&b("ffn_down")), &hmid, ne);
                for (xi, di) in x[p].iter_mut().zip(d) {
                    *xi += di;
                }
            }
        }
        let last = norm(&x[n - 1], self.w("output_norm.weight"));
        matvec(emb, &last, self.n_vocab).into_iter().map(|v| v as f32).collect()
    }
}

/// Context parameters for the tiny model: `n_ctx` cells, micro-batches of `n_ubatch`.
pub fn params(n_ctx: usize, n_ubatch: usize, n_seq_max: usize, kv: GgmlType) -> ContextParams {
    ContextParams {
        n_ctx,
        n_seq_max,
        n_rs_seq: 0,
        n_ubatch,
        n_threads: 2,
        n_threads_batch: 2,
        type_k: kv,
        type_v: kv,
        kv_unified: true,
        swa_full: false,
        embeddings: false,
        rope_freq_base: 0.0,
        rope_freq_scale: 0.0,
    }
}

/// One decode of `tokens` at `pos` in `seqs` (one sequence each), logits for the entries
/// where `out` is true, split into micro-batches of `n_ubatch` consecutive entries.
/// Returns the outcome and the logits rows [n_out, n_vocab] in batch order.
pub fn decode(ctx: &mut Context, tokens: &[i32], pos: &[i32], seqs: &[i32], out: &[bool], n_ubatch: usize) -> (Decoded, Vec<f32>) {
    decode_abort(ctx, tokens, pos, seqs, out, n_ubatch, &mut || false)
}

pub fn decode_abort(
    ctx: &mut Context,
    tokens: &[i32],
    pos: &[i32],
    seqs: &[i32],
    out: &[bool],
    n_ubatch: usize,
    abort: &mut dyn FnMut() -> bool,
) -> (Decoded, Vec<f32>) {
    let n = tokens.len();
    let mut out_rows = vec![-1i32; n];
    let mut k = 0;
    for (i, &o) in out.iter().enumerate() {
        if o {
            out_rows[i] = k;
            k += 1;
        }
    }
    let n_vocab = ctx.n_vocab();
    let mut logits = vec![0f32; k as usize * n_vocab];
    let idx: Vec<i32> = (0..n as i32).collect();
    let ubs: Vec<&[i32]> = idx.chunks(n_ubatch).collect();
    let n_seq_id = vec![1i32; n];
    let batch = BatchRef { tokens: Some(tokens), embd: None, pos, n_seq_id: &n_seq_id, seq_id: seqs, seq_cols: 1 };
    let d = ctx.decode(&batch, &ubs, &out_rows, &mut logits, None, abort).unwrap();
    (d, logits)
}
