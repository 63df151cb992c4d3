//! Device-resident activations for offloaded decoder layers (models/decoder.rs).
//!
//! A `Run` records the operations of a stretch of layers (matmuls with the weights the
//! `Offload` holds, RMS norms, biases, rope, gated activations, residual adds) over
//! activation buffers that live on the device, and submits them as one command buffer per
//! stretch: the residual stream is uploaded once into the first offloaded layer and read
//! back once after the last. With the context's `offload_kqv` (and a cache type gpu/kv.rs handles) the
//! layers' KV cache lives on the device too and attention runs there (gpu/kv.rs), so a
//! stretch of layers is one submission; otherwise attention and the KV cache stay on the
//! CPU (llama.cpp's `offload_kqv = false` split): each layer sends its q, k and v to the
//! host and gets the attention output back, one round trip per layer.

use super::kv::{GpuKv, LayerAttn, Tables};
use super::{Gpu, Offload, TN_MM};
use crate::backend::DecoderStack;
use crate::context::Step;
use crate::error::{Error, Result};
use crate::hparams::RopeType;
use crate::ggml_type::GgmlType;
use crate::model::TensorView;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Mutex, MutexGuard};
use wgpu::util::DeviceExt;

/// Bytes between two parameter blocks of one submission (wgpu's default
/// min_uniform_buffer_offset_alignment).
const SLOT: u64 = 256;

/// False when the environment variable `PYLLAMA_GPU_RESIDENT=0` asks for the per-matmul
/// offload (every activation crossing per matmul) instead, for comparisons.
pub fn enabled() -> bool {
    std::env::var("PYLLAMA_GPU_RESIDENT").map(|v| v.trim() != "0").unwrap_or(true)
}

/// The activation buffers of a run.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum B {
    X,
    Cur,
    Tmp,
    Q,
    K,
    V,
    Att,
    Gate,
    Up,
    Rope,
    /// u32 per-micro-batch tables of the device attention (key cells, ranges, rows)
    Meta,
    /// the new K and V rows of every offloaded layer, for the host copy of the cache
    KvOut,
    /// every layer's rope table, when one submission runs all the layers (host writes all
    /// land before it runs: each layer copies its own into `Rope` in command order)
    RopeAll,
    /// a matmul's input rounded to its weight type's activation format (`round_act`)
    Act,
}
const N_BUF: usize = 14;

/// Device copies of the small f32 vectors (norm weights, biases) of one forward pass's
/// layers, keyed by the device and the host vector's address and length: the owner (the
/// decoder, through `backend::BackendCache`) keeps those vectors alive and unchanged as
/// long as this cache.
#[derive(Default)]
pub struct VecCache(Mutex<HashMap<(usize, usize, usize), wgpu::Buffer>>);

/// The ops pipelines and the activation buffers, per device.
#[derive(Default)]
pub(super) struct Resident {
    ops: Option<(wgpu::BindGroupLayout, HashMap<&'static str, wgpu::ComputePipeline>)>,
    /// the KV store and attention pipelines (attn.wgsl): layout, store, attn
    pub(super) kv: Option<(wgpu::BindGroupLayout, wgpu::ComputePipeline, wgpu::ComputePipeline)>,
    bufs: [Option<wgpu::Buffer>; N_BUF],
    read: Option<wgpu::Buffer>,
    dummy: Option<wgpu::Buffer>,
}

const OPS: [&str; 9] = ["rms_norm", "add_bias", "add", "scale", "swiglu", "geglu", "rope", "fwht", "round_act"];

enum Cmd {
    Pass {
        pipe: wgpu::ComputePipeline,
        layout: wgpu::BindGroupLayout,
        /// bindings 0.. in order (buffer, bytes bound from offset 0); the parameters follow
        bufs: Vec<(wgpu::Buffer, u64)>,
        slot: u64,
        groups: (u32, u32, u32),
    },
    Copy { src: wgpu::Buffer, src_off: u64, dst: wgpu::Buffer, dst_off: u64, bytes: u64 },
}

/// Operations recorded for one submission over the device's activation buffers (held
/// locked for the run's lifetime).
pub struct Run<'g> {
    pub(super) gpu: &'g Gpu,
    off: &'g Offload,
    vecs: &'g VecCache,
    pub(super) res: MutexGuard<'g, Resident>,
    params: Vec<u8>,
    cmds: Vec<Cmd>,
    /// what `B::Act` holds while only matmuls have been recorded since it was rounded:
    /// (source buffer, activation format, floats), so q/k/v or gate/up round their input once
    act: Option<(B, GgmlType, usize)>,
}

/// `round_act`'s mode for an activation format and the floats each thread rounds (None: f32,
/// nothing to round).
pub(super) fn round_mode(vdt: GgmlType) -> Option<(u32, usize)> {
    match vdt {
        GgmlType::F16 => Some((1, 1)),
        GgmlType::BF16 => Some((2, 1)),
        GgmlType::Q8_0 | GgmlType::Q8_1 => Some((3, 32)),
        GgmlType::Q8_K => Some((4, 256)),
        _ => None,
    }
}

fn groups_for(n: usize) -> (u32, u32) {
    let nx = n.clamp(1, 65535);
    (nx as u32, n.div_ceil(nx).max(1) as u32)
}

impl<'g> Run<'g> {
    /// Start a run with each buffer at least `floats[b]` long.
    pub fn begin(off: &'g Offload, vecs: &'g VecCache, floats: &[(B, usize)]) -> Result<Run<'g>> {
        let gpu: &Gpu = &off.gpu;
        let mut res = gpu.res.lock().unwrap_or_else(|e| e.into_inner());
        if res.ops.is_none() {
            res.ops = Some(gpu.ops_pipelines());
        }
        gpu.check_alive()?;
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        for &(b, n) in floats {
            let bytes = (n.max(1) * 4) as u64;
            if bytes > gpu.info.max_storage_binding && !matches!(b, B::KvOut | B::RopeAll) {
                return Err(Error::Invalid(format!(
                    "GPU: the activation buffer {b:?} ({bytes} bytes) exceeds the adapter's storage binding limit"
                )));
            }
            gpu.grow(&mut res.bufs[b as usize], bytes, usage, "activations");
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            // drop what may not have been made, so the next run tries again
            res.bufs = Default::default();
            let mib = floats.iter().map(|&(_, n)| n as f64 * 4.0).sum::<f64>() / 1048576.0;
            return Err(Error::Alloc(format!(
                "GPU '{}': out of device memory for the activations of a micro-batch ({mib:.1} MiB): {e}; \
                 lower n_ubatch or n_gpu_layers",
                gpu.info.name
            )));
        }
        if res.dummy.is_none() {
            res.dummy = Some(gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("dummy"),
                size: 16,
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: false,
            }));
        }
        Ok(Run { gpu, off, vecs, res, params: Vec::new(), cmds: Vec::new(), act: None })
    }

    pub(super) fn buf(&self, b: B) -> wgpu::Buffer {
        self.res.bufs[b as usize].clone().expect("run buffer sized in begin")
    }

    pub(super) fn slot(&mut self, words: &[u32]) -> u64 {
        let at = self.params.len() as u64;
        for w in words {
            self.params.extend_from_slice(&w.to_le_bytes());
        }
        self.params.resize((at + SLOT) as usize, 0);
        at
    }

    /// The device copy of a host vector (uploaded on first use).
    fn vec(&self, v: &[f32]) -> wgpu::Buffer {
        let mut m = self.vecs.0.lock().unwrap_or_else(|e| e.into_inner());
        m.entry((self.gpu as *const Gpu as usize, v.as_ptr() as usize, v.len()))
            .or_insert_with(|| {
                let mut bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                bytes.resize(bytes.len().max(16), 0);
                self.gpu.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("vec"),
                    contents: &bytes,
                    usage: wgpu::BufferUsages::STORAGE,
                })
            })
            .clone()
    }

    /// Write host floats into buffer `b` (before the next submission's commands run).
    pub fn write(&mut self, b: B, data: &[f32]) {
        // SAFETY: f32 has no padding; the bytes are read as they are.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, data.len() * 4) };
        self.gpu.queue.write_buffer(&self.buf(b), 0, bytes);
    }

    /// Write host floats into buffer `b` from float `at` on.
    pub fn write_at(&mut self, b: B, at: usize, data: &[f32]) {
        // SAFETY: f32 has no padding; the bytes are read as they are.
        let bytes = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, data.len() * 4) };
        self.gpu.queue.write_buffer(&self.buf(b), (at * 4) as u64, bytes);
    }

    /// Write host words into buffer `b`.
    pub fn write_u32(&mut self, b: B, data: &[u32]) {
        let bytes: Vec<u8> = data.iter().flat_map(|x| x.to_le_bytes()).collect();
        self.gpu.queue.write_buffer(&self.buf(b), 0, &bytes);
    }

    /// dst[..n floats] = src[..n floats]
    pub fn copy(&mut self, src: B, dst: B, n: usize) {
        self.copy_at(src, 0, dst, 0, n);
    }

    /// dst[dst_at..dst_at + n] = src[src_at..src_at + n] (floats)
    pub fn copy_at(&mut self, src: B, src_at: usize, dst: B, dst_at: usize, n: usize) {
        let (src, dst) = (self.buf(src), self.buf(dst));
        self.act = None;
        self.cmds.push(Cmd::Copy { src, src_off: (src_at * 4) as u64, dst, dst_off: (dst_at * 4) as u64, bytes: (n * 4) as u64 });
    }

    /// Record a compute pass binding `bufs` (then the parameter block `slot`).
    pub(super) fn pass(&mut self, pipe: wgpu::ComputePipeline, layout: wgpu::BindGroupLayout, bufs: Vec<(wgpu::Buffer, u64)>, slot: u64, groups: (u32, u32, u32)) {
        self.act = None;
        self.cmds.push(Cmd::Pass { pipe, layout, bufs, slot, groups });
    }

    /// dst [n, rows.len()] = rows `rows` of w times src [n, w.ne[0]].
    pub fn mm(&mut self, w: &TensorView, src: B, dst: B, n: usize, rows: Range<usize>) -> Result<()> {
        let g = self
            .off
            .weight(w)
            .ok_or_else(|| Error::Invalid(format!("internal: '{}' is not on the GPU", w.name)))?;
        let (n_in, n_rows) = (g.ne[0], rows.len());
        if n == 0 || n_rows == 0 {
            return Ok(());
        }
        let tn = if n == 1 { 1 } else { TN_MM };
        let (pipe, layout) = self.gpu.pipeline(g.ty, tn)?;
        let row_bytes = crate::quant::row_bytes(g.ty, n_in)?;
        let (nx, ny) = groups_for(n_rows.div_ceil(super::shaders::rows_per_group(tn)));
        let nz = n.div_ceil(tn as usize);
        if nz > 65535 || rows.end * row_bytes > u32::MAX as usize {
            return Err(Error::Invalid(format!("GPU matmul '{}': too large for 32-bit indexing", w.name)));
        }
        // the input as the CPU path's dot products see it (its weight type's vec_dot_type)
        let vdt = crate::quant::table::kernels().get(g.ty).vec_dot_type;
        let x = match round_mode(vdt) {
            None => self.buf(src),
            Some((mode, unit)) => {
                // whole blocks: n_in is a multiple of the weight type's block (row_bytes
                // above), which its vec_dot type's block divides
                let floats = n * n_in;
                debug_assert_eq!(floats % unit, 0);
                let key = (src, vdt, floats);
                if self.act != Some(key) {
                    self.round_act(src, mode, unit, floats);
                }
                self.act = Some(key);
                self.buf(B::Act)
            }
        };
        let slot = self.slot(&[n_in as u32, n_rows as u32, rows.start as u32, n as u32, row_bytes as u32, nx, 0, 0]);
        let y = self.buf(dst);
        let bufs = vec![(g.buf.clone(), g.buf.size()), (x, (n * n_in * 4) as u64), (y, (n * n_rows * 4) as u64)];
        let act = self.act;
        self.pass(pipe, layout, bufs, slot, (nx, ny, nz as u32));
        self.act = act;
        Ok(())
    }

    /// B::Act[..floats] = src rounded by `round_act` mode `mode` (`round_mode`), `unit`
    /// floats per thread.
    pub(super) fn round_act(&mut self, src: B, mode: u32, unit: usize, floats: usize) {
        let a = self.buf(src);
        let units = floats / unit;
        self.op("round_act", B::Act, Some(a), units, unit, [mode, 0, 0], 0.0, units.div_ceil(64), floats);
    }

    #[allow(clippy::too_many_arguments)]
    fn op(&mut self, name: &str, d: B, a: Option<wgpu::Buffer>, n: usize, w: usize, ints: [u32; 3], f0: f32, groups: usize, d_floats: usize) {
        if n == 0 {
            return;
        }
        let (layout, pipes) = self.res.ops.as_ref().expect("ops pipelines made in begin");
        let (layout, pipe) = (layout.clone(), pipes[name].clone());
        let (nx, ny) = groups_for(groups);
        let slot = self.slot(&[n as u32, w as u32, nx, ints[0], ints[1], ints[2], f0.to_bits(), 0]);
        let a = a.unwrap_or_else(|| self.res.dummy.clone().expect("dummy made in begin"));
        let asize = a.size();
        let bufs = vec![(self.buf(d), (d_floats * 4) as u64), (a, asize)];
        self.pass(pipe, layout, bufs, slot, (nx, ny, 1));
    }

    /// Rows of width `w` of d [rows * w]: RMS-normalized, times `weight` [w] when given.
    pub fn rms_norm(&mut self, d: B, rows: usize, w: usize, weight: Option<&[f32]>, eps: f32) {
        let a = weight.map(|v| self.vec(v));
        let has = a.is_some() as u32;
        self.op("rms_norm", d, a, rows, w, [has, 0, 0], eps, rows, rows * w);
    }

    /// d [rows, bias.len()] += bias
    pub fn add_bias(&mut self, d: B, rows: usize, bias: Option<&[f32]>) {
        if let Some(b) = bias {
            let a = self.vec(b);
            let n = rows * b.len();
            self.op("add_bias", d, Some(a), n, b.len(), [0; 3], 0.0, n.div_ceil(64), n);
        }
    }

    /// d[..n] += a[..n]
    pub fn add(&mut self, d: B, a: B, n: usize) {
        let a = self.buf(a);
        self.op("add", d, Some(a), n, 1, [0; 3], 0.0, n.div_ceil(64), n);
    }

    /// d[..n] *= f
    pub fn scale(&mut self, d: B, n: usize, f: f32) {
        self.op("scale", d, None, n, 1, [0; 3], f, n.div_ceil(64), n);
    }

    /// d[..n] times the orthonormal Hadamard matrix of size `size`, chunk by chunk
    /// (`kv_cache::fwht`, bit-equal; `size` 0: nothing).
    pub fn fwht(&mut self, d: B, n: usize, size: usize) {
        if size == 0 {
            return;
        }
        let chunks = n / size;
        self.op("fwht", d, None, chunks, size, [0; 3], 1.0 / (size as f32).sqrt(), chunks.div_ceil(64), n);
    }

    /// gate[..n] = act(gate) * up: silu (`gelu` false) or gelu_tanh.
    pub fn glu(&mut self, gate: B, up: B, n: usize, gelu: bool) {
        let a = self.buf(up);
        self.op(if gelu { "geglu" } else { "swiglu" }, gate, Some(a), n, 1, [0; 3], 0.0, n.div_ceil(64), n);
    }

    /// Rotate d [n_tok, n_head * hd] with the table in `Rope` ([n_tok, hd] cos/sin pairs).
    pub fn rope(&mut self, d: B, n_tok: usize, n_head: usize, hd: usize, n_dims: usize, neox: bool) {
        let a = self.buf(B::Rope);
        let n = n_tok * n_head * (n_dims / 2);
        self.op("rope", d, Some(a), n, hd, [n_dims as u32, neox as u32, n_head as u32], 0.0, n.div_ceil(64), n_tok * n_head * hd);
    }

    /// A block's output tmp [n, ne]: [RMS-normed by `post_norm`] [* `scale`], added to x.
    pub fn residual(&mut self, post_norm: Option<&[f32]>, eps: f32, scale: f32, n: usize, ne: usize) {
        if let Some(pn) = post_norm {
            self.rms_norm(B::Tmp, n, ne, Some(pn), eps);
        }
        if scale != 1.0 {
            self.scale(B::Tmp, n * ne, scale);
        }
        self.add(B::X, B::Tmp, n * ne);
    }

    /// Submit what was recorded; with `reads`, copy those buffers' first floats into the
    /// host slices after the work is done.
    pub fn submit(&mut self, reads: &mut [(B, &mut [f32])]) -> Result<()> {
        let dev = &self.gpu.device;
        let params = if self.params.is_empty() {
            None
        } else {
            Some(dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: &self.params,
                usage: wgpu::BufferUsages::UNIFORM,
            }))
        };
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("layers") });
        for c in self.cmds.drain(..) {
            match c {
                Cmd::Copy { src, src_off, dst, dst_off, bytes } => enc.copy_buffer_to_buffer(&src, src_off, &dst, dst_off, bytes),
                Cmd::Pass { pipe, layout, bufs, slot, groups } => {
                    let p = params.as_ref().expect("params recorded with each pass");
                    fn entry(i: u32, b: &wgpu::Buffer, off: u64, size: u64) -> wgpu::BindGroupEntry<'_> {
                        wgpu::BindGroupEntry {
                            binding: i,
                            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: b,
                                offset: off,
                                size: wgpu::BufferSize::new(size.max(4).min(b.size() - off)),
                            }),
                        }
                    }
                    let mut entries: Vec<wgpu::BindGroupEntry> =
                        bufs.iter().enumerate().map(|(i, (b, size))| entry(i as u32, b, 0, *size)).collect();
                    entries.push(entry(bufs.len() as u32, p, slot, 80));
                    let bind = dev.create_bind_group(&wgpu::BindGroupDescriptor { label: None, layout: &layout, entries: &entries });
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: None, timestamp_writes: None });
                    pass.set_pipeline(&pipe);
                    pass.set_bind_group(0, &bind, &[]);
                    pass.dispatch_workgroups(groups.0, groups.1, groups.2);
                }
            }
        }
        self.params.clear();
        let total: u64 = reads.iter().map(|(_, s)| (s.len() * 4) as u64).sum();
        let rbuf = if total > 0 {
            let r = self.gpu.grow(&mut self.res.read, total, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, "read");
            let mut o = 0u64;
            for (b, s) in reads.iter() {
                let bytes = (s.len() * 4) as u64;
                enc.copy_buffer_to_buffer(&self.buf(*b), 0, &r, o, bytes);
                o += bytes;
            }
            Some(r)
        } else {
            None
        };
        self.gpu.queue.submit([enc.finish()]);
        let Some(rbuf) = rbuf else { return self.gpu.check_alive() };
        let slice = rbuf.slice(0..total);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        dev.poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Invalid(format!("GPU device lost or stalled in an offloaded layer: {e}")))?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Invalid(format!("GPU: reading activations back failed: {e}"))),
            Err(_) => return Err(Error::Invalid("GPU: the device dropped the read-back".into())),
        }
        {
            let data = slice.get_mapped_range().map_err(|e| Error::Invalid(format!("GPU: cannot map activations: {e}")))?;
            // SAFETY: the mapped bytes are the f32 values copied above.
            let all = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const f32, (total / 4) as usize) };
            let mut o = 0;
            for (_, s) in reads.iter_mut() {
                let n = s.len();
                s.copy_from_slice(&all[o..o + n]);
                o += n;
            }
        }
        rbuf.unmap();
        self.gpu.check_alive()
    }
}

/// Layers `layers` of a decoder on one device (`Backend::decoder_run` for one stretch of a
/// split): x [n, n_embd] goes up once and comes down after the last layer. With `gkv` (the
/// context's `offload_kqv` and a cache type gpu/kv.rs handles) each layer's K/V rows go into the device
/// copy of its cache and attention runs there (gpu/kv.rs: one submission for the stretch;
/// the new K/V rows come down with x for the host copy); otherwise each layer's q, k and v
/// come down for attention over the CPU's KV cache and its output goes back up. The same
/// operations as the decoder's CPU layer in the same order (the last layer's feed-forward
/// runs on every row; the caller selects the output rows after the last stretch).
pub(super) fn run_stretch(
    st: &mut Step,
    stack: &DecoderStack,
    layers: Range<usize>,
    off: &Offload,
    vecs: &VecCache,
    gkv: Option<&GpuKv>,
) -> Result<()> {
    let hp = st.hp;
    let (n, ne) = (st.n, hp.n_embd);
    let (hd_k, hd_v) = (hp.n_embd_head_k, hp.n_embd_head_v);
    let (mut qw, mut kw, mut vw, mut ow, mut ff, mut kv_rows) = (0, 0, 0, 0, 0, 0);
    for il in layers.clone() {
        qw = qw.max(hd_k * hp.n_head(il));
        kw = kw.max(hp.n_embd_k_gqa(il));
        vw = vw.max(hp.n_embd_v_gqa(il));
        ow = ow.max(hd_v * hp.n_head(il));
        ff = ff.max(stack.layer(il).down.ne[0]);
        kv_rows += n * (hp.n_embd_k_gqa(il) + hp.n_embd_v_gqa(il));
    }
    let tables = gkv.map(|_| {
        let variants: Vec<(usize, bool)> = layers.clone().map(|il| (stack.layer(il).attn.n_swa, stack.layer(il).attn.chunked)).collect();
        let b = &*st.b;
        Tables::new(st.kv, &b.keys, &b.key_range[..n], &b.pos[..n], &b.cells[..n], &variants)
    });
    let sizes = [
        (B::X, n * ne),
        (B::Cur, n * ne),
        (B::Tmp, n * ne),
        (B::Q, n * qw),
        (B::K, n * kw),
        (B::V, n * vw),
        (B::Att, n * ow),
        (B::Gate, n * ff),
        (B::Up, n * ff),
        (B::Rope, n * hd_k),
        (B::Meta, tables.as_ref().map_or(0, |t| t.words.len())),
        (B::KvOut, if gkv.is_some() { kv_rows } else { 0 }),
        (B::RopeAll, if gkv.is_some() { layers.len() * n * hd_k } else { 0 }),
        (B::Act, n * ne.max(ow).max(ff)),
    ];
    let mut run = Run::begin(off, vecs, &sizes)?;
    run.write(B::X, &st.b.x[..n * ne]);
    if let Some(t) = &tables {
        run.write_u32(B::Meta, &t.words);
    }
    let mut out_at = 0;
    let (eps, eps_qk) = (stack.eps, stack.eps_qk);
    let mut table = vec![0f32; n * hd_k];
    for il in layers.clone() {
        let l = stack.layer(il);
        let p = &l.attn;
        let (n_head, n_head_kv) = (p.n_head, p.n_head_kv);
        let (lq, lk, lv) = (n_head * hd_k, n_head_kv * hd_k, n_head_kv * hd_v);
        run.copy(B::X, B::Cur, n * ne);
        run.rms_norm(B::Cur, n, ne, Some(l.attn_norm), eps);
        run.add_bias(B::Cur, n, l.attn_norm_b);
        if l.fused_qkv {
            run.mm(l.wq, B::Cur, B::Q, n, 0..lq)?;
            run.mm(l.wq, B::Cur, B::K, n, lq..lq + lk)?;
            run.mm(l.wq, B::Cur, B::V, n, lq + lk..lq + lk + lv)?;
        } else {
            run.mm(l.wq, B::Cur, B::Q, n, 0..lq)?;
            run.mm(l.wk, B::Cur, B::K, n, 0..lk)?;
            run.mm(l.wv, B::Cur, B::V, n, 0..lv)?;
        }
        run.add_bias(B::Q, n, l.bq);
        run.add_bias(B::K, n, l.bk);
        run.add_bias(B::V, n, l.bv);
        if let Some(qn) = l.q_norm {
            let w = if qn.len() == lq { lq } else { hd_k };
            run.rms_norm(B::Q, n * lq / w, w, Some(qn), eps_qk);
        }
        if let Some(kn) = l.k_norm {
            let w = if kn.len() == lk { lk } else { hd_k };
            run.rms_norm(B::K, n * lk / w, w, Some(kn), eps_qk);
        }
        if let Some(r) = l.rope.filter(|r| r.rope_type != RopeType::None) {
            for t in 0..n {
                r.fill_cache(st.b.pos[t], &mut table[t * hd_k..(t + 1) * hd_k]);
            }
            if gkv.is_some() {
                // one submission: this layer's table goes to its own place, copied in order
                let at = (il - layers.start) * n * hd_k;
                run.write_at(B::RopeAll, at, &table);
                run.copy_at(B::RopeAll, at, B::Rope, 0, n * hd_k);
            } else {
                run.write(B::Rope, &table);
            }
            let neox = r.rope_type == RopeType::Neox;
            run.rope(B::Q, n, n_head, hd_k, r.n_dims, neox);
            run.rope(B::K, n, n_head_kv, hd_k, r.n_dims, neox);
        }
        if stack.q_scale != 1.0 {
            run.scale(B::Q, n * lq, stack.q_scale);
        }
        if l.qk_rms_after_rope {
            run.rms_norm(B::Q, n * n_head, hd_k, None, eps_qk);
            run.rms_norm(B::K, n * n_head_kv, hd_k, None, eps_qk);
        }
        if let (Some(g), Some(t)) = (gkv, tables.as_ref()) {
            // the CPU path's attention form (ops/attention.rs: a quantized V needs flash
            // attention) and llama.cpp's Hadamard rotations for quantized caches
            // (kv_cache::rotation_sizes): q and K, V before they are stored, V's undone on the output
            let kv = &*st.kv;
            let a = LayerAttn::of(p, kv.flash_attn || crate::kv_cache::is_quantized(kv.type_v));
            run.fwht(B::Q, n * lq, kv.rot_k);
            run.fwht(B::K, n * lk, kv.rot_k);
            run.fwht(B::V, n * lv, kv.rot_v);
            run.attend(g, t, n, &a, out_at)?;
            run.fwht(B::Att, n * n_head * hd_v, kv.rot_v);
            out_at += n * (lk + lv);
        } else {
            // q and k come down into the FFN's gate and up memory, as build_attn lends it
            let b = &mut *st.b;
            std::mem::swap(&mut b.q, &mut b.gate);
            std::mem::swap(&mut b.k, &mut b.up);
            let r = run.submit(&mut [(B::Q, &mut b.q[..n * lq]), (B::K, &mut b.k[..n * lk]), (B::V, &mut b.v[..n * lv])]);
            let r = r.and_then(|()| st.attend_cached(p));
            let b = &mut *st.b;
            std::mem::swap(&mut b.q, &mut b.gate);
            std::mem::swap(&mut b.k, &mut b.up);
            r?;
            run.write(B::Att, &st.b.att[..n * n_head * hd_v]);
        }
        run.mm(l.wo, B::Att, B::Tmp, n, 0..ne)?;
        run.add_bias(B::Tmp, n, l.bo);
        run.residual(l.post_attn_norm, eps, stack.residual_scale, n, ne);
        run.copy(B::X, B::Cur, n * ne);
        run.rms_norm(B::Cur, n, ne, Some(l.ffn_norm), eps);
        run.add_bias(B::Cur, n, l.ffn_norm_b);
        let n_ff = l.down.ne[0];
        match l.gate {
            Some(g) => {
                run.mm(g, B::Cur, B::Gate, n, 0..n_ff)?;
                run.mm(l.up, B::Cur, B::Up, n, 0..n_ff)?;
            }
            None => {
                run.mm(l.up, B::Cur, B::Gate, n, 0..n_ff)?;
                run.mm(l.up, B::Cur, B::Up, n, n_ff..2 * n_ff)?;
            }
        }
        run.add_bias(B::Gate, n, l.gate_b);
        run.add_bias(B::Up, n, l.up_b);
        run.glu(B::Gate, B::Up, n * n_ff, stack.gelu);
        run.mm(l.down, B::Gate, B::Tmp, n, 0..ne)?;
        run.add_bias(B::Tmp, n, l.down_b);
        run.residual(l.post_ffw_norm, eps, stack.residual_scale, n, ne);
    }
    if gkv.is_none() {
        return run.submit(&mut [(B::X, &mut st.b.x[..n * ne])]);
    }
    // the new K/V rows into the host copy, converted as the CPU path stores them
    let mut rows = vec![0f32; out_at];
    run.submit(&mut [(B::X, &mut st.b.x[..n * ne]), (B::KvOut, &mut rows)])?;
    drop(run);
    let kv = &mut *st.kv;
    let mut at = 0;
    for il in layers {
        let (lk, lv) = (hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il));
        let (rk, rv) = (kv.row_k[il], kv.row_v[il]);
        for t in 0..n {
            let (s, cell) = st.b.cells[t];
            let o = (s as usize * kv.size + cell as usize) * rk;
            crate::quant::quantize_row_cpu(kv.type_k, &rows[at + t * lk..at + (t + 1) * lk], &mut kv.k[il][o..o + rk])?;
        }
        at += n * lk;
        for t in 0..n {
            let (s, cell) = st.b.cells[t];
            let o = (s as usize * kv.size + cell as usize) * rv;
            crate::quant::quantize_row_cpu(kv.type_v, &rows[at + t * lv..at + (t + 1) * lv], &mut kv.v[il][o..o + rv])?;
        }
        at += n * lv;
    }
    Ok(())
}

impl Gpu {
    fn ops_pipelines(&self) -> (wgpu::BindGroupLayout, HashMap<&'static str, wgpu::ComputePipeline>) {
        let entry = |binding: u32, ty: wgpu::BufferBindingType| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None },
            count: None,
        };
        let layout = self.device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("ops"),
            entries: &[
                entry(0, wgpu::BufferBindingType::Storage { read_only: false }),
                entry(1, wgpu::BufferBindingType::Storage { read_only: true }),
                entry(2, wgpu::BufferBindingType::Uniform),
            ],
        });
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("ops"),
            source: wgpu::ShaderSource::Wgsl(format!("{}\n{}", include_str!("f16.wgsl"), include_str!("ops.wgsl")).into()),
        });
        let pl = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("ops"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        let mut map = HashMap::new();
        for name in OPS {
            let p = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: Some(&pl),
                module: &module,
                entry_point: Some(name),
                compilation_options: Default::default(),
                cache: None,
            });
            map.insert(name, p);
        }
        (layout, map)
    }
}

#[cfg(test)]
mod tests {
    //! Each op against the CPU op it replaces, on whatever adapter is there (lavapipe in CI,
    //! allowed explicitly): |GPU - CPU| <= 1e-5 (relative to the values' scale) for the norm,
    //! rope, bias and SwiGLU (another summation order and exp; measured <= 5e-7 on
    //! lavapipe); 2e-3 for GeGLU, whose CPU version reads ggml's f16 GELU table (measured
    //! 1.8e-3 at values up to 4).
    use super::*;
    use crate::gpu::{Gpu, Offload};
    use crate::hparams::RopeType;
    use crate::ops::{act, norm::rms_norm_row, rope::RopeParams};
    use std::sync::Arc;

    fn rand(n: usize, seed: &mut u64) -> Vec<f32> {
        (0..n)
            .map(|_| {
                *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((*seed >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
    }

    #[test]
    fn ops_agree_with_cpu() {
        let g = match Gpu::open(0, true) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("SKIP: no GPU adapter: {e}");
                return;
            }
        };
        let off = Offload {
            gpu: Arc::new(g),
            weights: HashMap::new(),
            n_layers_offloaded: 0,
            output_offloaded: false,
            bytes: 0,
            kept_on_cpu: Vec::new(),
        };
        let vecs = VecCache::default();
        let mut seed = 3u64;
        let (n, w) = (5usize, 96usize);
        let sizes = [(B::Cur, n * w), (B::Q, n * w), (B::Gate, n * w), (B::Up, n * w), (B::Rope, n * 32)];
        let mut run = Run::begin(&off, &vecs, &sizes).unwrap();
        let mut got = vec![0f32; n * w];

        // rms_norm with a weight, then a bias
        let x = rand(n * w, &mut seed);
        let wt = rand(w, &mut seed);
        let bias = rand(w, &mut seed);
        let mut want = x.clone();
        for r in want.chunks_exact_mut(w) {
            rms_norm_row(r, Some(&wt), 1e-6);
            act::add_assign(r, &bias);
        }
        run.write(B::Cur, &x);
        run.rms_norm(B::Cur, n, w, Some(&wt), 1e-6);
        run.add_bias(B::Cur, n, Some(&bias));
        run.submit(&mut [(B::Cur, &mut got)]).unwrap();
        let d = max_diff(&got, &want);
        eprintln!("rms_norm + bias: {d:e}");
        assert!(d <= 1e-5 * 4.0, "rms_norm: {d}");

        // rope over 3 heads of 32, normal and neox, all and half of the dimensions rotated
        for (ty, n_dims) in [(RopeType::Norm, 32), (RopeType::Neox, 32), (RopeType::Neox, 16), (RopeType::Norm, 16)] {
            let r = RopeParams::simple(ty, n_dims, 10000.0, 1.0);
            let x = rand(n * w, &mut seed);
            let mut want = x.clone();
            let mut table = vec![0f32; n * 32];
            for t in 0..n {
                let pos = 3 + 7 * t as i32;
                r.fill_cache(pos, &mut table[t * 32..(t + 1) * 32]);
                let mut cache = vec![0f32; 32];
                r.apply_heads(&mut want[t * w..(t + 1) * w], 32, pos, &mut cache);
            }
            run.write(B::Q, &x);
            run.write(B::Rope, &table);
            run.rope(B::Q, n, 3, 32, n_dims, ty == RopeType::Neox);
            run.submit(&mut [(B::Q, &mut got)]).unwrap();
            let d = max_diff(&got, &want);
            eprintln!("rope {ty:?} n_dims={n_dims}: {d:e}");
            assert!(d <= 1e-5 * 2.0, "rope {ty:?} {n_dims}: {d}");
        }

        // gated activations
        for gelu in [false, true] {
            let (gt, up) = (rand(n * w, &mut seed), rand(n * w, &mut seed));
            let mut want = gt.clone();
            if gelu {
                act::geglu(&mut want, &up);
            } else {
                act::swiglu(&mut want, &up);
            }
            run.write(B::Gate, &gt);
            run.write(B::Up, &up);
            run.glu(B::Gate, B::Up, n * w, gelu);
            run.submit(&mut [(B::Gate, &mut got)]).unwrap();
            let d = max_diff(&got, &want);
            eprintln!("{}: {d:e}", if gelu { "geglu" } else { "swiglu" });
            assert!(d <= if gelu { 2e-3 * 4.0 } else { 1e-5 * 4.0 }, "glu gelu={gelu}: {d}");
        }

        // the Hadamard rotation of quantized caches: bit-equal to kv_cache::fwht
        for size in [64, 32] {
            let x = rand(n * w, &mut seed);
            let mut want = x.clone();
            crate::kv_cache::fwht(&mut want, size);
            run.write(B::Q, &x);
            run.fwht(B::Q, n * w, size);
            run.submit(&mut [(B::Q, &mut got)]).unwrap();
            assert_eq!(got, want, "fwht {size}");
        }

        // residual add and scale
        let (a, b) = (rand(n * w, &mut seed), rand(n * w, &mut seed));
        let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| (x + y) * 0.5).collect();
        run.write(B::Cur, &a);
        run.write(B::Q, &b);
        run.add(B::Cur, B::Q, n * w);
        run.scale(B::Cur, n * w, 0.5);
        run.submit(&mut [(B::Cur, &mut got)]).unwrap();
        assert_eq!(got, want);
    }
}
