//! The KV cache of the offloaded decoder layers on the device (llama.cpp's `offload_kqv`),
//! and attention over it (attn.wgsl).
//!
//! Per offloaded layer, K and V live in two device buffers in the host cache's layout
//! (rows [n_stream * size][n_embd_{k,v}_gqa] of F32, F16, or the 32-element blocks of
//! Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1, stored by kv_store.wgsl; other cache types keep the
//! cache on the CPU). A resident layer writes its micro-batch's K/V rows there and attends
//! on the device: no q/k/v crossing per layer.
//!
//! The host cache (`KvCache::k` / `v`) stays the reference copy: every run also returns the
//! new K/V rows (in the run's final read-back, next to the residual stream) and the host
//! stores them with the CPU's own row conversion, so the sequence operations, the K-shift,
//! saved states and a CPU fallback read a current host cache as they always did. What
//! changes the host bytes (K-shift, cross-stream seq_cp, clear, state load, a layer run on
//! the CPU) calls `KvCache::host_changed`, and the next run uploads the host copy again
//! before it attends (write through). A failed run marks it the same way, so a lost or
//! failing device leaves the context as the host copy says.
//!
//! Masks are the CPU path's: each token's visible keys are a range of its sequence's key
//! list sorted by position (`KvCache::keys_of`), found on the host (causal, sliding window
//! or chunked), and the kernel reads exactly those cells. Numerics: K/V stored as the
//! cache type, q, scores, softmax and the V accumulator in f32 (the CPU kernel rounds q to
//! f16, or quantizes it to K's vec_dot type, and accumulates V in f16, llama.cpp's way), so
//! results agree with the CPU path to float tolerance. With a quantized K, q goes to K's
//! vec_dot type first (Q8_0 / Q8_1) and q.k is the per-block integer dot times the scales,
//! as on the CPU (and in llama.cpp's CUDA kernels). The device quantizes new K/V rows as the host does
//! (kv_store.wgsl), up to a rare one-step difference where WGSL's division is an ulp off.
//! With a quantized cache and a head size that is a multiple of 64, the resident layer
//! applies llama.cpp's Hadamard rotations as the CPU path does (`kv_cache::rotation_sizes`,
//! ops.wgsl's `fwht`, bit-equal to the CPU's): q and K before K is stored, V before it is
//! stored and again on the attention output; and a quantized V means the flash-attention
//! form (the softcap's order), as on the CPU. Whole models then agree with the CPU path:
//! tests/kernels/test_gpu_kv.py (without the rotation, tiny-llama's logits were off by a
//! mean 0.04 (q8_0) and 0.5 (q4_0): the device's unrotated rows quantize differently).

use super::resident::{Run, B};
use super::{Gpu, Offload};
use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::kv_cache::KvCache;
use std::sync::Arc;

/// The device copy of the cache of layers `first..`.
pub struct GpuKv {
    gpu: Arc<Gpu>,
    pub first: usize,
    k: Vec<wgpu::Buffer>,
    v: Vec<wgpu::Buffer>,
    /// kv_params.wgsl's type codes of the K and V caches
    tk: u32,
    tv: u32,
    /// The host copy changed since the last upload (`KvCache::host_changed`).
    pub dirty: bool,
}

/// kv_params.wgsl's code for a cache type the device handles.
fn type_code(t: GgmlType) -> Option<u32> {
    Some(match t {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q8_0 => 2,
        GgmlType::Q4_0 => 3,
        GgmlType::Q4_1 => 4,
        GgmlType::Q5_0 => 5,
        GgmlType::Q5_1 => 6,
        _ => return None,
    })
}

/// Why the cache of `kv` cannot live on the device (None: it can).
pub fn unsupported(kv: &KvCache, hd_k: usize, hd_v: usize) -> Option<String> {
    if type_code(kv.type_k).is_none() || type_code(kv.type_v).is_none() {
        return Some(format!(
            "KV cache types {}/{}: GPU attention handles f32, f16, q8_0, q4_0, q4_1, q5_0 and q5_1 caches",
            kv.type_k.name().to_lowercase(),
            kv.type_v.name().to_lowercase()
        ));
    }
    if hd_k > 256 || hd_v > 256 || hd_k % 2 != 0 || hd_v % 2 != 0 {
        return Some(format!("head sizes {hd_k}/{hd_v}: GPU attention handles even head sizes up to 256"));
    }
    if crate::kv_cache::is_quantized(kv.type_k) && hd_k % 32 != 0 {
        return Some(format!("head size {hd_k}: GPU attention over a quantized K needs whole blocks of 32 per head"));
    }
    None
}

impl GpuKv {
    /// Device buffers for layers `layers` of `kv`, filled from the host copy.
    pub fn new(off: &Offload, kv: &KvCache, layers: std::ops::Range<usize>) -> Result<GpuKv> {
        let gpu = off.gpu.clone();
        gpu.check_alive()?;
        let (first, n_layer) = (layers.start, layers.end.min(kv.k.len()));
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let mut total = 0u64;
        let mut mk = |bytes: usize, what: &str| -> Result<wgpu::Buffer> {
            let n = (bytes.div_ceil(4) * 4).max(16) as u64;
            if n > gpu.info.max_storage_binding || n > gpu.info.max_buffer_size {
                return Err(Error::Alloc(format!(
                    "GPU '{}': the KV cache's {what} of one layer ({n} bytes) exceeds the adapter's largest buffer; \
                     lower n_ctx or use offload_kqv = False",
                    gpu.info.name
                )));
            }
            total += n;
            Ok(gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(what),
                size: n,
                // COPY_SRC: tests read the device copy back
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }))
        };
        let mut k = Vec::new();
        let mut v = Vec::new();
        for il in first..n_layer {
            k.push(mk(kv.k[il].len(), "K")?);
            v.push(mk(kv.v[il].len(), "V")?);
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Alloc(format!(
                "GPU '{}': out of device memory for the KV cache of layers {first}..{n_layer} ({:.1} MiB): {e}; \
                 lower n_ctx or n_gpu_layers, or use offload_kqv = False",
                gpu.info.name,
                total as f64 / 1048576.0
            )));
        }
        let code = |t: GgmlType| type_code(t).ok_or_else(|| Error::Unsupported(format!("GPU KV cache of type {t}")));
        let (tk, tv) = (code(kv.type_k)?, code(kv.type_v)?);
        let mut g = GpuKv { gpu, first, k, v, tk, tv, dirty: true };
        g.upload(kv)?;
        Ok(g)
    }

    /// The layers whose cache this holds.
    pub fn layers(&self) -> std::ops::Range<usize> {
        self.first..self.first + self.k.len()
    }

    /// Bytes on the device.
    pub fn bytes(&self) -> u64 {
        self.k.iter().chain(&self.v).map(|b| b.size()).sum()
    }

    /// Copy the host cache of the held layers to the device when it changed.
    pub fn upload(&mut self, kv: &KvCache) -> Result<()> {
        if !self.dirty {
            return Ok(());
        }
        for (j, il) in self.layers().enumerate() {
            for (buf, host) in [(&self.k[j], &kv.k[il]), (&self.v[j], &kv.v[il])] {
                let n = host.len() / 4 * 4;
                self.gpu.queue.write_buffer(buf, 0, &host[..n]);
                if n < host.len() {
                    let mut tail = host[n..].to_vec();
                    tail.resize(4, 0);
                    self.gpu.queue.write_buffer(buf, n as u64, &tail);
                }
            }
        }
        self.gpu.check_alive()?;
        self.dirty = false;
        Ok(())
    }
}

/// The per-micro-batch tables of the device attention (the u32 `Meta` buffer): the key
/// cells, each mask variant's per-token visible range, the tokens' first rows and cells.
pub struct Tables {
    pub words: Vec<u32>,
    /// (n_swa, chunked) -> offset of its (lo, hi) pairs
    variants: Vec<((usize, bool), usize)>,
    /// offset of the tokens' stream rows (stream * size)
    pub stream_rows: usize,
    /// offset of the tokens' cell rows (stream * size + cell)
    pub cell_rows: usize,
}

impl Tables {
    /// `keys` / `key_range` / `pos` / `cells` as the context filled them for this micro-batch;
    /// `variants`: the (n_swa, chunked) masks of the layers that will attend.
    pub fn new(
        kv: &KvCache,
        keys: &[(i32, u32)],
        key_range: &[(u32, u32)],
        pos: &[i32],
        cells: &[(u32, u32)],
        variants: &[(usize, bool)],
    ) -> Tables {
        let n = pos.len();
        let mut words: Vec<u32> = keys.iter().map(|k| k.1).collect();
        let mut vs = Vec::new();
        for &(n_swa, chunked) in variants {
            if vs.iter().any(|(v, _)| *v == (n_swa, chunked)) {
                continue;
            }
            vs.push(((n_swa, chunked), words.len()));
            for t in 0..n {
                // the CPU path's `visible` (ops/attention.rs), as absolute indices into keys
                let (r0, r1) = key_range[t];
                let ks = &keys[r0 as usize..r1 as usize];
                let p = pos[t];
                let hi = ks.partition_point(|k| k.0 <= p);
                let lo = if n_swa > 0 && chunked {
                    let start = (p as i64 / n_swa as i64) * n_swa as i64;
                    ks[..hi].partition_point(|k| (k.0 as i64) < start)
                } else if n_swa > 0 {
                    ks[..hi].partition_point(|k| p as i64 - k.0 as i64 >= n_swa as i64)
                } else {
                    0
                };
                words.push(r0 + lo as u32);
                words.push(r0 + hi as u32);
            }
        }
        let stream_rows = words.len();
        words.extend(cells.iter().map(|&(s, _)| s * kv.size as u32));
        let cell_rows = words.len();
        words.extend(cells.iter().map(|&(s, c)| s * kv.size as u32 + c));
        Tables { words, variants: vs, stream_rows, cell_rows }
    }

    fn ranges(&self, n_swa: usize, chunked: bool) -> usize {
        self.variants.iter().find(|(v, _)| *v == (n_swa, chunked)).map(|(_, o)| *o).expect("variant listed in Tables::new")
    }
}

/// One layer's attention on the device.
pub struct LayerAttn {
    pub il: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub hd_k: usize,
    pub hd_v: usize,
    pub scale: f32,
    pub softcap: f32,
    pub n_swa: usize,
    pub chunked: bool,
    /// llama.cpp's flash attention (`KvCache::flash_attn`): the softcap applies to the
    /// scaled scores; off, to the raw ones, the scale after (build_attn_mha's two graphs).
    pub flash: bool,
}

impl LayerAttn {
    /// The device kernel's description of the attention `p` describes for the CPU (the
    /// device path has no sinks: layers with them stay on the CPU).
    pub fn of(p: &crate::ops::attention::AttnParams, flash: bool) -> LayerAttn {
        debug_assert!(p.sinks.is_none());
        LayerAttn {
            il: p.il,
            n_head: p.n_head,
            n_head_kv: p.n_head_kv,
            hd_k: p.hd_k,
            hd_v: p.hd_v,
            scale: p.scale,
            softcap: p.softcap,
            n_swa: p.n_swa,
            chunked: p.chunked,
            flash,
        }
    }
}

impl Gpu {
    pub(super) fn kv_pipelines(&self) -> (wgpu::BindGroupLayout, wgpu::ComputePipeline, wgpu::ComputePipeline) {
        let entry = |binding: u32, ty: wgpu::BufferBindingType| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None },
            count: None,
        };
        let ro = wgpu::BufferBindingType::Storage { read_only: true };
        let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("attn"),
            entries: &[
                entry(0, ro),
                entry(1, ro),
                entry(2, ro),
                entry(3, ro),
                entry(4, wgpu::BufferBindingType::Storage { read_only: false }),
                entry(5, wgpu::BufferBindingType::Uniform),
            ],
        });
        let module = |name: &str, src: &str, reduce: &str| {
            self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(
                    format!("{}\n{}\n{reduce}\n{src}", include_str!("f16.wgsl"), include_str!("kv_params.wgsl")).into(),
                ),
            })
        };
        let m_store = module("store", include_str!("kv_store.wgsl"), "");
        let m_attn = module("attn", include_str!("attn.wgsl"), super::shaders::reduce_source(self.subgroups));
        let pl = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("attn"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let mk = |name: &str, module: &wgpu::ShaderModule| {
            self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: Some(&pl),
                module,
                entry_point: Some(name),
                compilation_options: Default::default(),
                cache: None,
            })
        };
        let (store, attn) = (mk("store", &m_store), mk("attn", &m_attn));
        (layout, store, attn)
    }
}

impl Run<'_> {
    fn kv_pipes(&mut self) -> (wgpu::BindGroupLayout, wgpu::ComputePipeline, wgpu::ComputePipeline) {
        if self.res.kv.is_none() {
            self.res.kv = Some(self.gpu.kv_pipelines());
        }
        self.res.kv.clone().expect("made above")
    }

    #[allow(clippy::too_many_arguments)]
    fn kv_params(&mut self, n: usize, a: &LayerAttn, ty: (u32, u32), ek: usize, ev: usize, rng: usize, row: usize, nx: u32) -> u64 {
        let (kscale, post) = match (a.softcap != 0.0, a.flash) {
            (false, _) => (a.scale, 1.0f32),
            (true, true) => (a.scale / a.softcap, 1.0),
            (true, false) => (1.0 / a.softcap, a.scale),
        };
        let words = [
            n as u32,
            a.n_head as u32,
            (a.n_head / a.n_head_kv) as u32,
            a.hd_k as u32,
            a.hd_v as u32,
            ek as u32,
            ev as u32,
            ty.0,
            ty.1,
            rng as u32,
            row as u32,
            (a.n_head * a.hd_k) as u32,
            (a.n_head * a.hd_v) as u32,
            nx,
            kscale.to_bits(),
            a.softcap.to_bits(),
            post.to_bits(),
            a.flash as u32, // an F32 cache is read as f16 (llama.cpp casts it for flash attention)
            0,
            0,
        ];
        self.slot(&words)
    }

    /// Store the micro-batch's K (in `B::K`) and V (`B::V`) rows into layer `a.il`'s device
    /// cache at the tokens' cells, copy them to `B::KvOut` at `out_at` (K then V, for the
    /// host copy), and attend with q (`B::Q`) over the cache into `B::Att`.
    pub fn attend(&mut self, g: &GpuKv, t: &Tables, n: usize, a: &LayerAttn, out_at: usize) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if n > 65535 || a.n_head > 65535 {
            return Err(Error::Invalid(format!("GPU attention: {n} tokens x {} heads exceed one dispatch", a.n_head)));
        }
        let (layout, store, attn) = self.kv_pipes();
        let j = a.il - g.first;
        let (ek, ev) = (a.n_head_kv * a.hd_k, a.n_head_kv * a.hd_v);
        let meta = (self.buf(B::Meta), (t.words.len().max(1) * 4) as u64);
        // the stores: K with (ek, tk), V with the same kernel given (ev, tv) in K's place;
        // a thread per element (F32), element pair (F16) or block (the quantized types)
        for (src, cache, e, ty) in [(B::K, &g.k[j], ek, g.tk), (B::V, &g.v[j], ev, g.tv)] {
            let per = match ty {
                0 => e,
                1 => e / 2,
                _ => e / 32,
            };
            let items = (n * per).div_ceil(64);
            let nx = items.clamp(1, 65535);
            let ny = items.div_ceil(nx).max(1);
            let slot = self.kv_params(n, a, (ty, ty), e, e, 0, t.cell_rows, nx as u32);
            let dummy = (self.buf(B::Rope), 4);
            let bufs = vec![(self.buf(src), (n * e * 4) as u64), dummy.clone(), dummy, meta.clone(), (cache.clone(), cache.size())];
            self.pass(store.clone(), layout.clone(), bufs, slot, (nx as u32, ny as u32, 1));
        }
        self.copy_at(B::K, 0, B::KvOut, out_at, n * ek);
        self.copy_at(B::V, 0, B::KvOut, out_at + n * ek, n * ev);
        let rng = t.ranges(a.n_swa, a.chunked);
        let slot = self.kv_params(n, a, (g.tk, g.tv), ek, ev, rng, t.stream_rows, 0);
        let bufs = vec![
            (self.buf(B::Q), (n * a.n_head * a.hd_k * 4) as u64),
            (g.k[j].clone(), g.k[j].size()),
            (g.v[j].clone(), g.v[j].size()),
            meta,
            (self.buf(B::Att), (n * a.n_head * a.hd_v * 4) as u64),
        ];
        self.pass(attn, layout, bufs, slot, (a.n_head as u32, n as u32, 1));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    //! The device attention against the CPU attention (ops/attention.rs) over the same
    //! cache, on whatever adapter is there (lavapipe in CI, allowed explicitly): two
    //! sequences sharing their first cells, GQA, causal and sliding-window masks, a logit
    //! softcap, head sizes 64 and 256, more keys than one chunk. F32 cache without flash
    //! attention (the CPU's f32 path): |diff| <= 2e-6 (measured <= 4e-7 on lavapipe); F16
    //! cache, or F32 with flash attention (the CPU rounds q and K/V to f16 and accumulates
    //! V in f16, llama.cpp's way, and so does the device, key by key): <= 1e-3 (measured <= 3.3e-4,
    //! at head size 256: scores summed in another order; 9e-4 with f32 on the device). The rows the run returns for
    //! the host copy are bit-equal to the f32 rows given.
    use super::*;
    use crate::kv_cache::{SeqSet, Slot};
    use crate::ops::attention::{attention, scratch_per_thread, AttnInputs, AttnParams};
    use crate::threadpool::ThreadPool;
    use std::collections::HashMap;

    fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    fn case(off: &Offload, ty: GgmlType, fa: bool, hd: usize, n_swa: usize, softcap: f32, amp: f32, seed: &mut u64) -> f32 {
        // K/V values in [-amp, amp]
        let rand_kv = |n: usize, seed: &mut u64| rand(n, seed).into_iter().map(|x| x * amp).collect::<Vec<f32>>();
        let (n_head, n_head_kv) = (4, 2);
        let (ek, size) = (n_head_kv * hd, 100);
        let mut kv = KvCache::new(&[ek], &[ek], size, 1, 4, ty, ty).unwrap();
        kv.flash_attn = fa;
        // history: seq 0 at 0..75 (more than one chunk of 64 keys), seq 1 shares 0..4 and
        // has its own 4..7
        let put = |kv: &mut KvCache, pos: &[i32], seqs: SeqSet, seed: &mut u64| -> Vec<(u32, u32)> {
            let mut slot = Slot::default();
            let seq0 = vec![0usize; pos.len()];
            assert!(kv.find_slot(&seq0, &mut slot, &mut Vec::new()));
            kv.apply_slot(&slot, pos, &|_| seqs);
            for &(s, c) in &slot.cells {
                let o = (s as usize * size + c as usize) * kv.row_k[0];
                let (k, v) = (rand_kv(ek, seed), rand_kv(ek, seed));
                crate::quant::quantize_row_cpu(ty, &k, &mut kv.k[0][o..o + kv.row_k[0]]).unwrap();
                crate::quant::quantize_row_cpu(ty, &v, &mut kv.v[0][o..o + kv.row_v[0]]).unwrap();
            }
            slot.cells
        };
        let mut both = SeqSet::only(0);
        both.add(1);
        put(&mut kv, &[0, 1, 2, 3], both, seed);
        put(&mut kv, &(4..75).collect::<Vec<i32>>(), SeqSet::only(0), seed);
        put(&mut kv, &[4, 5, 6], SeqSet::only(1), seed);
        let mut g = GpuKv::new(off, &kv, 0..kv.k.len()).unwrap();
        // the micro-batch: seq 0 at 75, 76, 77 and seq 1 at 7, 8; cells taken, rows not yet stored
        let pos = [75, 76, 77, 7, 8];
        let seq0 = [0usize, 0, 0, 1, 1];
        let mut slot = Slot::default();
        assert!(kv.find_slot(&seq0, &mut slot, &mut Vec::new()));
        kv.apply_slot(&slot, &pos, &|t| SeqSet::only(seq0[t]));
        let n = pos.len();
        let (k, v, q) = (rand_kv(n * ek, seed), rand_kv(n * ek, seed), rand(n * n_head * hd, seed));
        let mut keys = Vec::new();
        let mut key_range = vec![(0u32, 0u32); n];
        let mut lists: HashMap<usize, (u32, u32)> = HashMap::new();
        for t in 0..n {
            let r = *lists.entry(seq0[t]).or_insert_with(|| {
                let mut l = Vec::new();
                kv.keys_of(seq0[t], &mut l);
                let r0 = keys.len() as u32;
                keys.extend_from_slice(&l);
                (r0, keys.len() as u32)
            });
            key_range[t] = r;
        }
        let stream = vec![0u32; n];
        // GPU: store the rows and attend
        let t = Tables::new(&kv, &keys, &key_range, &pos, &slot.cells, &[(n_swa, false)]);
        let vecs = super::super::resident::VecCache::default();
        let sizes = [
            (B::Q, n * n_head * hd),
            (B::K, n * ek),
            (B::V, n * ek),
            (B::Att, n * n_head * hd),
            (B::Rope, 4),
            (B::Meta, t.words.len()),
            (B::KvOut, 2 * n * ek),
        ];
        g.upload(&kv).unwrap();
        let mut run = Run::begin(off, &vecs, &sizes).unwrap();
        run.write(B::Q, &q);
        run.write(B::K, &k);
        run.write(B::V, &v);
        run.write_u32(B::Meta, &t.words);
        let a = LayerAttn { il: 0, n_head, n_head_kv, hd_k: hd, hd_v: hd, scale: 0.125, softcap, n_swa, chunked: false, flash: fa };
        run.attend(&g, &t, n, &a, 0).unwrap();
        let mut got = vec![0f32; n * n_head * hd];
        let mut rows = vec![0f32; 2 * n * ek];
        run.submit(&mut [(B::Att, &mut got), (B::KvOut, &mut rows)]).unwrap();
        drop(run);
        assert_eq!(&rows[..n * ek], &k[..]);
        assert_eq!(&rows[n * ek..], &v[..]);
        // CPU: store the rows as attend_kv does and attend
        for (tk, &(s, c)) in slot.cells.iter().enumerate() {
            let o = (s as usize * size + c as usize) * kv.row_k[0];
            let rk = kv.row_k[0];
            crate::quant::quantize_row_cpu(ty, &k[tk * ek..(tk + 1) * ek], &mut kv.k[0][o..o + rk]).unwrap();
            crate::quant::quantize_row_cpu(ty, &v[tk * ek..(tk + 1) * ek], &mut kv.v[0][o..o + rk]).unwrap();
        }
        // the device quantized the new rows as the host did (kv_store.wgsl)
        for (buf, host) in [(&g.k[0], &kv.k[0]), (&g.v[0], &kv.v[0])] {
            let dev = read_back(off, buf);
            let n_diff = host.iter().zip(&dev).filter(|(a, b)| a != b).count();
            assert_eq!(n_diff, 0, "{ty}: {n_diff} bytes of the device cache differ from the host's");
        }
        let p = AttnParams { il: 0, n_head, n_head_kv, hd_k: hd, hd_v: hd, scale: 0.125, softcap, n_swa, chunked: false, sinks: None };
        let inp = AttnInputs { pos: &pos, stream: &stream, key_range: &key_range, keys: &keys };
        let pool = ThreadPool::new(1);
        let stride = scratch_per_thread(size, hd, hd);
        let mut scratch = vec![0f32; stride];
        let mut want = vec![0f32; n * n_head * hd];
        attention(&pool, &kv, &p, &inp, &q, &mut want, &mut scratch, stride);
        got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
    }

    /// The bytes of a device buffer.
    fn read_back(off: &Offload, buf: &wgpu::Buffer) -> Vec<u8> {
        let dev = &off.gpu.device;
        let r = dev.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: buf.size(),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = dev.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, 0, &r, 0, buf.size());
        off.gpu.queue.submit([enc.finish()]);
        r.slice(..).map_async(wgpu::MapMode::Read, |res| res.unwrap());
        dev.poll(wgpu::PollType::wait_indefinitely()).unwrap();
        let v = r.slice(..).get_mapped_range().unwrap().to_vec();
        off.gpu.check_alive().unwrap();
        v
    }

    /// An offload without weights on adapter 0 (software allowed), or None (skip).
    fn offload() -> Option<Offload> {
        offload_with(crate::gpu::subgroups_allowed_by_env())
    }

    /// `offload`, with subgroup reductions only when `subgroups` (and offered).
    fn offload_with(subgroups: bool) -> Option<Offload> {
        match Gpu::open_with(0, true, subgroups) {
            Ok(g) => Some(Offload {
                gpu: Arc::new(g),
                weights: Default::default(),
                n_layers_offloaded: 0,
                output_offloaded: false,
                bytes: 0,
                kept_on_cpu: Vec::new(),
            }),
            Err(e) => {
                eprintln!("SKIP: no GPU adapter: {e}");
                None
            }
        }
    }

    /// Quantized K/V (flash attention, which a quantized V needs): both sides quantize q to
    /// K's vec_dot type and accumulate V in f32; they differ in the order of float sums
    /// (measured <= 3e-7 on lavapipe).
    const QTOL: f32 = 2e-6;

    #[test]
    fn attention_agrees_with_cpu() {
        // with subgroup reductions where the adapter has them, and without
        for sg in [true, false] {
            let Some(off) = offload_with(sg) else { return };
            eprintln!("subgroups: {}", off.gpu.subgroups);
            attention_cases(&off);
            if !off.gpu.info.subgroups {
                break;
            }
        }
    }

    fn attention_cases(off: &Offload) {
        let mut seed = 11u64;
        let quant = [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1].map(|t| (t, true, QTOL));
        for (ty, fa, tol) in [(GgmlType::F32, false, 2e-6f32), (GgmlType::F32, true, 1e-3), (GgmlType::F16, true, 1e-3)].into_iter().chain(quant) {
            for hd in [64, 256] {
                for (n_swa, softcap) in [(0, 0.0), (4, 0.0), (0, 0.5), (3, 0.5), (70, 0.0)] {
                    let d = case(off, ty, fa, hd, n_swa, softcap, 1.0, &mut seed);
                    eprintln!("{ty} hd={hd} n_swa={n_swa} softcap={softcap}: max |diff| {d:e}");
                    assert!(d <= tol, "{ty} hd={hd} n_swa={n_swa} softcap={softcap}: {d}");
                }
            }
        }
        // small K/V (|x| <= 1e-4): subnormal f16 values and block scales, which the device
        // must not flush to zero (that would be off by up to 1e-4). The outputs are as
        // small: the tolerances above times 1e-4, F16's wider (the CPU accumulates V in f16,
        // whose subnormal steps are 6e-8)
        for (ty, tol) in [(GgmlType::F16, 5e-7f32), (GgmlType::Q8_0, 1e-9), (GgmlType::Q4_1, 1e-9)] {
            let d = case(off, ty, true, 64, 0, 0.0, 1e-4, &mut seed);
            eprintln!("{ty} |x| <= 1e-4: max |diff| {d:e}");
            assert!(d <= tol, "{ty} small values: {d}");
        }
    }

    #[test]
    fn round_act_is_the_cpu_quantizer() {
        // ops.wgsl round_act (what a resident matmul multiplies) against the CPU's activation
        // quantizer into each vec_dot type and back, value for value: values of several
        // magnitudes, ties (x * 127 / amax on .5), zeros, a zero block, subnormal scales
        let Some(off) = offload() else { return };
        let vecs = super::super::resident::VecCache::default();
        let mut seed = 11u64;
        let n = 256 * 12;
        let mut x = rand(n, &mut seed);
        for (i, v) in x.iter_mut().enumerate() {
            *v *= [1.0, 1e-3, 40.0, 1e-30, 3e4][(i / 256) % 5];
        }
        x[256..512].fill(0.0);
        for (i, v) in x[512..544].iter_mut().enumerate() {
            *v = i as f32 - 15.5; // with amax 127 (below) x * 127 / amax is x: every quant a tie
        }
        x[543] = 127.0;
        x[600] = 0.0;
        for vdt in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K, GgmlType::F16, GgmlType::BF16] {
            let (mode, unit) = super::super::resident::round_mode(vdt).unwrap();
            let mut run = Run::begin(&off, &vecs, &[(B::X, n), (B::Act, n)]).unwrap();
            run.write(B::X, &x);
            run.round_act(B::X, mode, unit, n);
            let mut got = vec![0f32; n];
            run.submit(&mut [(B::Act, &mut got)]).unwrap();
            drop(run);
            let mut bytes = vec![0u8; crate::quant::row_bytes(vdt, n).unwrap()];
            let mut want = vec![0f32; n];
            crate::quant::quantize_row_act(vdt, &x, &mut bytes).unwrap();
            crate::quant::dequantize_row(vdt, &bytes, &mut want).unwrap();
            // equal as values (a tie rounded to a zero quant may be -0 on the device: the same product)
            let bad: Vec<usize> = (0..n).filter(|&i| got[i] != want[i]).collect();
            assert!(bad.is_empty(), "{vdt}: {} of {n} differ, first at {}: {} vs {}", bad.len(), bad[0], got[bad[0]], want[bad[0]]);
        }
    }

    #[test]
    fn lost_device_is_an_error() {
        // a destroyed device (what a driver reset does): every later call errs, none panics
        let Some(off) = offload() else { return };
        let kv = KvCache::new(&[64], &[64], 8, 1, 1, GgmlType::F16, GgmlType::F16).unwrap();
        let vecs = super::super::resident::VecCache::default();
        {
            let mut run = Run::begin(&off, &vecs, &[(B::X, 64)]).unwrap();
            let mut x = vec![0f32; 64];
            run.write(B::X, &vec![1.0; 64]);
            run.scale(B::X, 64, 2.0);
            run.submit(&mut [(B::X, &mut x)]).unwrap();
            assert_eq!(x, vec![2.0; 64]);
        }
        off.gpu.destroy_for_test();
        let e = GpuKv::new(&off, &kv, 0..kv.k.len()).err().expect("a KV cache on a lost device");
        assert!(e.to_string().contains("lost"), "{e}");
        let e = Run::begin(&off, &vecs, &[(B::X, 64)]).err().expect("a run on a lost device");
        assert!(e.to_string().contains("lost"), "{e}");
    }
}
