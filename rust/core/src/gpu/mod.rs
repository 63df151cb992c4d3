//! GPU offload through wgpu (Vulkan, Metal, DX12), behind the cargo feature `gpu`.
//!
//! What it does today: the matrix products whose weights it holds. `offload` uploads, once
//! at model load, the 2-D and 3-D weights of the layers llama.cpp would put on the GPU
//! (the output projection counts as layer n_layer: `n_gpu_layers = N` is the output layer
//! and the last N - 1 repeating layers; negative = all) from the mapping into device
//! buffers, on one adapter (`split_mode` none: `main_gpu`) or split by layer over several
//! (`split_mode` layer, in proportion to `tensor_split`: `assign_layers`, llama.cpp's
//! formula). `GpuBackend` (one `Offload` per device) is the model's `backend::Backend`, so
//! the forward pass's `mm` hands it those products. The shared decoder (models/decoder.rs)
//! goes further, through the seam's `decoder_first` / `decoder_run`: its offloaded layers
//! keep the activations on their device (`resident`: norms, biases, rope,
//! gated activations and residual adds in `ops.wgsl`); with the context's `offload_kqv`
//! their KV cache and attention are on the device too (`kv`: `attn.wgsl`), else q, k, v
//! and the attention output cross per layer, attention and the KV cache staying on the
//! CPU; x leaves one device and enters the next once per border of a split. Other forward
//! passes run everything but those matmuls on the CPU, crossing once per offloaded matmul.
//!
//! Errors: wgpu reports validation errors, out-of-memory and device loss through a handler
//! (it would panic without one); `Gpu::check_alive` turns them into errors of the call
//! that ran (Alloc for out-of-memory), so a decode fails instead of aborting.
//!
//! Adapters: `adapters()` lists what wgpu finds. A software adapter (Mesa's lavapipe,
//! WARP, SwiftShader: device type Cpu) is refused unless asked for (`allow_software`, or
//! the environment variable `PYLLAMA_GPU=cpu-ok`): it is slower than the CPU kernels and
//! exists for testing.
//!
//! Numerics: a matmul's input is first rounded to the weight type's activation format as
//! the CPU kernels (and llama.cpp's) quantize it (Q8_0 / Q8_1 / Q8_K by the x86
//! quantizers, F16, BF16: ops.wgsl `round_act`, or `round_act_host` on the per-matmul
//! path), then the kernels multiply the dequantized weights with it in f32; attention over
//! an f16 cache keeps the CPU's f16 accumulator, key by key; GELU is the CPU's f16 table.
//! What is left is summation order (and the device's exp / tanh), so results agree with
//! the CPU path closely, not bit for bit: a quant that lands one step the other way after
//! a differently summed layer is the typical difference. Q4_1 / Q5_1 differ a little more:
//! the CPU takes Q8_1's block sum rounded to f16, the kernels the exact sum.

pub mod kv;
pub mod resident;
mod shaders;

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::model::{Model, TensorView};
use crate::backend::{Backend, DecoderStack};
use crate::context::Step;
pub use crate::model::SplitMode;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};
use wgpu::util::DeviceExt;

pub use shaders::supported;

/// What an adapter is, as wgpu reports it.
#[derive(Clone, Debug)]
pub struct AdapterInfo {
    pub name: String,
    /// "discrete", "integrated", "virtual", "cpu" (a software rasterizer) or "other".
    pub device_type: &'static str,
    /// "vulkan", "metal", "dx12", "gl", ...
    pub backend: String,
    pub driver: String,
    pub driver_info: String,
    pub vendor: u32,
    pub device: u32,
    /// The largest buffer, and the largest storage binding, the adapter allows (wgpu
    /// reports no free or total memory; these bound what one weight may be).
    pub max_buffer_size: u64,
    pub max_storage_binding: u64,
    /// The adapter offers subgroup operations (wgpu's Features::SUBGROUP), with subgroups
    /// of `subgroup_sizes` (min, max) threads.
    pub subgroups: bool,
    pub subgroup_sizes: (u32, u32),
}

impl AdapterInfo {
    pub fn is_software(&self) -> bool {
        self.device_type == "cpu"
    }
}

fn type_name(t: wgpu::DeviceType) -> &'static str {
    match t {
        wgpu::DeviceType::DiscreteGpu => "discrete",
        wgpu::DeviceType::IntegratedGpu => "integrated",
        wgpu::DeviceType::VirtualGpu => "virtual",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

fn info_of(a: &wgpu::Adapter) -> AdapterInfo {
    let i = a.get_info();
    let l = a.limits();
    AdapterInfo {
        name: i.name,
        device_type: type_name(i.device_type),
        backend: format!("{:?}", i.backend).to_lowercase(),
        driver: i.driver,
        driver_info: i.driver_info,
        vendor: i.vendor,
        device: i.device,
        max_buffer_size: l.max_buffer_size,
        max_storage_binding: l.max_storage_buffer_binding_size as u64,
        subgroups: a.features().contains(wgpu::Features::SUBGROUP),
        subgroup_sizes: (i.subgroup_min_size, i.subgroup_max_size),
    }
}

/// False when the environment variable `PYLLAMA_GPU_SUBGROUPS=0` asks for the kernels'
/// workgroup-memory reductions even where the adapter offers subgroup operations.
pub fn subgroups_allowed_by_env() -> bool {
    std::env::var("PYLLAMA_GPU_SUBGROUPS").map(|v| v.trim() != "0").unwrap_or(true)
}

fn instance() -> wgpu::Instance {
    // WGPU_BACKEND and friends are honoured; GL is not built (compute needs Vulkan, Metal or DX12)
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

/// The adapters, enumerated once per process on one instance (Vulkan loaders and drivers
/// may print to stderr each time an instance is made: Mesa's lavapipe without
/// XDG_RUNTIME_DIR does).
fn raw_adapters() -> Vec<wgpu::Adapter> {
    static ALL: OnceLock<(wgpu::Instance, Vec<wgpu::Adapter>)> = OnceLock::new();
    ALL.get_or_init(|| {
        let inst = instance();
        let v = enumerate(&inst);
        (inst, v)
    })
    .1
    .clone()
}

fn enumerate(inst: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    let mut v = pollster::block_on(inst.enumerate_adapters(wgpu::Backends::all()));
    // discrete first, then integrated, virtual, other, software; stable within a kind
    let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    v.sort_by_key(rank);
    v
}

/// Every adapter wgpu finds, hardware first (the order `main_gpu` indexes).
pub fn adapters() -> Vec<AdapterInfo> {
    raw_adapters().iter().map(info_of).collect()
}

/// True when `PYLLAMA_GPU=cpu-ok` asks for software adapters to be used.
pub fn software_allowed_by_env() -> bool {
    std::env::var("PYLLAMA_GPU").map(|v| v.trim().eq_ignore_ascii_case("cpu-ok")).unwrap_or(false)
}

/// PYLLAMA_GPU_REPEAT=N (N >= 1, for tests): every usable adapter is listed N times in a
/// row, each entry opened as a device of its own, so a layer split across devices
/// (`split_mode` layer) runs on a machine with one adapter.
fn repeat() -> Result<usize> {
    match std::env::var("PYLLAMA_GPU_REPEAT") {
        Err(_) => Ok(1),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if (1..=16).contains(&n) => Ok(n),
            _ => Err(Error::Invalid(format!("PYLLAMA_GPU_REPEAT = {v:?}: not a count from 1 to 16"))),
        },
    }
}

/// The adapters offload may use, in `main_gpu` order: hardware ones, and software ones
/// when allowed (each `PYLLAMA_GPU_REPEAT` times).
fn usable_raw(allow_software: bool) -> Result<Vec<wgpu::Adapter>> {
    let allow = allow_software || software_allowed_by_env();
    let n = repeat()?;
    Ok(raw_adapters()
        .into_iter()
        .filter(|a| allow || a.get_info().device_type != wgpu::DeviceType::Cpu)
        .flat_map(|a| std::iter::repeat_n(a, n))
        .collect())
}

/// The adapters offload may use: hardware ones, and software ones when allowed.
pub fn usable_adapters(allow_software: bool) -> Vec<AdapterInfo> {
    usable_raw(allow_software).unwrap_or_default().iter().map(info_of).collect()
}

struct Pipelines {
    layout: wgpu::BindGroupLayout,
    /// (type, tokens per workgroup) -> pipeline, made on first use
    by_kind: HashMap<(GgmlType, u32), wgpu::ComputePipeline>,
}

/// Scratch buffers reused across calls, grown on demand.
struct Scratch {
    x: Option<wgpu::Buffer>,
    y: Option<wgpu::Buffer>,
    read: Option<wgpu::Buffer>,
    params: wgpu::Buffer,
}

/// An opened adapter: device, queue and the compute pipelines.
pub struct Gpu {
    pub info: AdapterInfo,
    /// The device was opened with subgroup operations, and the matrix-vector and attention
    /// kernels reduce with them (`shaders::reduce_source`).
    pub subgroups: bool,
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipes: Mutex<Pipelines>,
    scratch: Mutex<Scratch>,
    /// The offloaded layers' ops pipelines and activation buffers (resident.rs).
    res: Mutex<resident::Resident>,
    /// Errors wgpu reports outside an error scope (it would panic without a handler) and
    /// the device-lost reason: `check_alive` turns them into errors of the call that ran.
    fault: Arc<Mutex<Fault>>,
}

#[derive(Default)]
struct Fault {
    /// The first error since the last check.
    error: Option<String>,
    /// Set once the device is lost; every later call fails.
    lost: Option<String>,
}

/// Tokens per workgroup of the tiled matrix-matrix kernel (mm_tiled.wgsl).
const TN_MM: u32 = 16;

impl Gpu {
    /// Open adapter `index` of `usable_adapters(allow_software)`, with subgroup operations
    /// where it offers them (unless PYLLAMA_GPU_SUBGROUPS=0).
    pub fn open(index: usize, allow_software: bool) -> Result<Gpu> {
        Gpu::open_with(index, allow_software, subgroups_allowed_by_env())
    }

    /// `open`, with subgroup operations only when `subgroups` and the adapter offers them.
    pub fn open_with(index: usize, allow_software: bool, subgroups: bool) -> Result<Gpu> {
        let n_all = raw_adapters().len();
        let usable = usable_raw(allow_software)?;
        if usable.is_empty() {
            return Err(Error::Unsupported(if n_all == 0 {
                "no GPU adapter found (no Vulkan, Metal or DX12 driver)".into()
            } else {
                format!(
                    "only software adapters found ({n_all}); set PYLLAMA_GPU=cpu-ok (or allow_software) to use one"
                )
            }));
        }
        let n_usable = usable.len();
        let adapter = usable.into_iter().nth(index).ok_or_else(|| {
            Error::Invalid(format!("main_gpu = {index}: there are {n_usable} usable GPU adapters"))
        })?;
        let info = info_of(&adapter);
        let limits = adapter.limits();
        let subgroups = subgroups && info.subgroups;
        let features = if subgroups { wgpu::Features::SUBGROUP } else { wgpu::Features::empty() };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("pyllama"),
            required_features: features,
            required_limits: limits,
            ..Default::default()
        }))
        .map_err(|e| Error::Unsupported(format!("GPU adapter '{}': cannot open a device: {e}", info.name)))?;
        let fault = Arc::new(Mutex::new(Fault::default()));
        {
            let f = fault.clone();
            device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
                let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
                f.error.get_or_insert_with(|| e.to_string());
            }));
            let f = fault.clone();
            device.set_device_lost_callback(move |reason, msg| {
                let mut f = f.lock().unwrap_or_else(|e| e.into_inner());
                f.lost.get_or_insert_with(|| format!("{reason:?}: {msg}"));
            });
        }
        let entry = |binding: u32, ty: wgpu::BufferBindingType| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer { ty, has_dynamic_offset: false, min_binding_size: None },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("matmul"),
            entries: &[
                entry(0, wgpu::BufferBindingType::Storage { read_only: true }),
                entry(1, wgpu::BufferBindingType::Storage { read_only: true }),
                entry(2, wgpu::BufferBindingType::Storage { read_only: false }),
                entry(3, wgpu::BufferBindingType::Uniform),
            ],
        });
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: 32,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        Ok(Gpu {
            info,
            subgroups,
            device,
            queue,
            pipes: Mutex::new(Pipelines { layout, by_kind: HashMap::new() }),
            scratch: Mutex::new(Scratch { x: None, y: None, read: None, params }),
            res: Mutex::new(resident::Resident::default()),
            fault,
        })
    }

    /// How the kernels reduce, for the load log: "subgroup reductions" or why not.
    pub fn reductions(&self) -> &'static str {
        if self.subgroups {
            "subgroup reductions"
        } else if self.info.subgroups {
            "workgroup-memory reductions: PYLLAMA_GPU_SUBGROUPS=0"
        } else {
            "workgroup-memory reductions: no subgroup operations"
        }
    }

    /// Err when the device was lost (then always) or wgpu reported an error since the last
    /// check (once): a decode that ran into either fails with it instead of aborting.
    pub fn check_alive(&self) -> Result<()> {
        // runs the callbacks due (the device-lost one among them) without waiting
        let _ = self.device.poll(wgpu::PollType::Poll);
        let mut f = self.fault.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(l) = &f.lost {
            return Err(Error::Invalid(format!("GPU '{}': the device was lost ({l})", self.info.name)));
        }
        match f.error.take() {
            Some(e) if e.to_lowercase().contains("out of memory") => {
                Err(Error::Alloc(format!("GPU '{}': out of device memory: {e}", self.info.name)))
            }
            Some(e) => Err(Error::Invalid(format!("GPU '{}': {e}", self.info.name))),
            None => Ok(()),
        }
    }

    /// Lose the device on purpose (tests: what a driver reset or an unplugged GPU does).
    pub fn destroy_for_test(&self) {
        self.device.destroy();
    }

    fn pipeline(&self, ty: GgmlType, tn: u32) -> Result<(wgpu::ComputePipeline, wgpu::BindGroupLayout)> {
        let mut p = self.pipes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(pl) = p.by_kind.get(&(ty, tn)) {
            return Ok((pl.clone(), p.layout.clone()));
        }
        let src = shaders::matmul_source(ty, tn, self.subgroups).ok_or_else(|| Error::Unsupported(format!("no GPU kernel for {ty}")))?;
        let module = self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("matmul"),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pl_layout = self.device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("matmul"),
            bind_group_layouts: &[Some(&p.layout)],
            immediate_size: 0,
        });
        let pl = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("matmul"),
            layout: Some(&pl_layout),
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        p.by_kind.insert((ty, tn), pl.clone());
        Ok((pl, p.layout.clone()))
    }

    /// A device copy of `w`'s bytes (padded to 4), or None when it is larger than the
    /// adapter allows for one storage binding.
    pub fn upload(&self, w: &TensorView) -> Option<GpuWeight> {
        let n = w.data.len().div_ceil(4) * 4;
        if n as u64 > self.info.max_storage_binding || n as u64 > self.info.max_buffer_size || n == 0 {
            return None;
        }
        let buf = if n == w.data.len() {
            self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(w.name),
                contents: w.data,
                usage: wgpu::BufferUsages::STORAGE,
            })
        } else {
            let mut v = w.data.to_vec();
            v.resize(n, 0);
            self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(w.name),
                contents: &v,
                usage: wgpu::BufferUsages::STORAGE,
            })
        };
        Some(GpuWeight { buf, ty: w.ty, ne: w.ne, bytes: w.data.len() })
    }

    fn grow(&self, slot: &mut Option<wgpu::Buffer>, bytes: u64, usage: wgpu::BufferUsages, label: &str) -> wgpu::Buffer {
        if let Some(b) = slot {
            if b.size() >= bytes {
                return b.clone();
            }
        }
        let size = bytes.max(256).next_power_of_two();
        let b = self.device.create_buffer(&wgpu::BufferDescriptor { label: Some(label), size, usage, mapped_at_creation: false });
        *slot = Some(b.clone());
        b
    }

    /// out[t * ld_out + (r - rows.start)] = dot(row r of w, x[t]) for r in rows.
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        w: &GpuWeight,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        ld_out: usize,
        rows: Range<usize>,
    ) -> Result<()> {
        let n_in = w.ne[0];
        let n_rows = rows.len();
        if n_tokens == 0 || n_rows == 0 {
            return Ok(());
        }
        self.check_alive()?;
        let tn = if n_tokens == 1 { 1 } else { TN_MM };
        let (pipe, layout) = self.pipeline(w.ty, tn)?;
        let row_bytes = crate::quant::row_bytes(w.ty, n_in)?;
        let too_big = |what: &str| Error::Invalid(format!("GPU matmul: {what} exceeds 32-bit indexing"));
        let xb = (x.len() * 4) as u64;
        let yb = (n_tokens * n_rows * 4) as u64;
        if n_tokens * n_in > u32::MAX as usize || n_tokens * n_rows > u32::MAX as usize {
            return Err(too_big("the activations"));
        }
        if rows.end * row_bytes > u32::MAX as usize {
            return Err(too_big("the weight"));
        }
        let mut sc = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let xbuf = self.grow(&mut sc.x, xb, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST, "x");
        let ybuf = self.grow(&mut sc.y, yb, wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC, "y");
        let rbuf = self.grow(&mut sc.read, yb, wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST, "read");
        let n_groups = n_rows.div_ceil(shaders::rows_per_group(tn));
        let nx = n_groups.min(65535);
        let ny = n_groups.div_ceil(nx);
        let nz = n_tokens.div_ceil(tn as usize);
        if nz > 65535 {
            return Err(too_big("the token count"));
        }
        let params: [u32; 8] =
            [n_in as u32, n_rows as u32, rows.start as u32, n_tokens as u32, row_bytes as u32, nx as u32, 0, 0];
        let pbytes: Vec<u8> = params.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.queue.write_buffer(&sc.params, 0, &pbytes);
        // the input as the CPU path's dot products see it (resident.rs's `round_act`, here on the host)
        let xr = round_act_host(w.ty, x, n_in)?;
        let x = xr.as_deref().unwrap_or(x);
        // SAFETY: f32 has no padding; the bytes are read as they are.
        let xbytes = unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, x.len() * 4) };
        self.queue.write_buffer(&xbuf, 0, xbytes);
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("matmul"),
            layout: &layout,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: w.buf.as_entire_binding() },
                wgpu::BindGroupEntry {
                    binding: 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &xbuf,
                        offset: 0,
                        size: wgpu::BufferSize::new(xb),
                    }),
                },
                wgpu::BindGroupEntry {
                    binding: 2,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &ybuf,
                        offset: 0,
                        size: wgpu::BufferSize::new(yb),
                    }),
                },
                wgpu::BindGroupEntry { binding: 3, resource: sc.params.as_entire_binding() },
            ],
        });
        let mut enc = self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("matmul") });
        {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("matmul"), timestamp_writes: None });
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(nx as u32, ny as u32, nz as u32);
        }
        enc.copy_buffer_to_buffer(&ybuf, 0, &rbuf, 0, yb);
        self.queue.submit([enc.finish()]);
        let slice = rbuf.slice(0..yb);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Invalid(format!("GPU device lost or stalled in matmul: {e}")))?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(Error::Invalid(format!("GPU matmul: reading the result back failed: {e}"))),
            Err(_) => return Err(Error::Invalid("GPU matmul: the device dropped the read-back".into())),
        }
        {
            let data = slice
                .get_mapped_range()
                .map_err(|e| Error::Invalid(format!("GPU matmul: cannot map the result: {e}")))?;
            // SAFETY: the mapped bytes are n_tokens * n_rows f32 values written by the kernel.
            let y = unsafe { std::slice::from_raw_parts(data.as_ptr() as *const f32, n_tokens * n_rows) };
            for t in 0..n_tokens {
                out[t * ld_out..t * ld_out + n_rows].copy_from_slice(&y[t * n_rows..(t + 1) * n_rows]);
            }
        }
        rbuf.unmap();
        self.check_alive()
    }
}

/// Rows of `n_in` activations rounded to the format the CPU path multiplies weight type `ty`
/// with (its `vec_dot_type`: Q8_0 / Q8_1 / Q8_K as the CPU's activation quantizers make them,
/// F16, BF16) and widened back to f32; None when that format is f32.
fn round_act_host(ty: GgmlType, x: &[f32], n_in: usize) -> Result<Option<Vec<f32>>> {
    let vdt = crate::quant::table::kernels().get(ty).vec_dot_type;
    if resident::round_mode(vdt).is_none() || n_in == 0 {
        return Ok(None);
    }
    let mut bytes = vec![0u8; crate::quant::row_bytes(vdt, n_in)?];
    let mut out = vec![0f32; x.len()];
    for (src, dst) in x.chunks_exact(n_in).zip(out.chunks_exact_mut(n_in)) {
        crate::quant::quantize_row_act(vdt, src, &mut bytes)?;
        crate::quant::dequantize_row(vdt, &bytes, dst)?;
    }
    Ok(Some(out))
}

/// A weight on the device.
pub struct GpuWeight {
    buf: wgpu::Buffer,
    pub ty: GgmlType,
    pub ne: [usize; 4],
    pub bytes: usize,
}

/// What to offload (llama.cpp's model parameters of the same names).
#[derive(Clone, Debug)]
pub struct OffloadParams {
    /// Layers from the top, the output layer first; negative = all.
    pub n_gpu_layers: i32,
    /// `SplitMode::None`: the one adapter (index into `usable_adapters`) everything offloaded goes to.
    pub main_gpu: usize,
    pub split_mode: SplitMode,
    /// Each usable adapter's share of the offloaded layers under `SplitMode::Layer`; entries
    /// past the adapter count are not read, all zero (or none) = equal shares.
    pub tensor_split: Vec<f32>,
    pub allow_software: bool,
}

/// The weights of a model on one device; shared by every context of the model.
pub struct Offload {
    pub gpu: Arc<Gpu>,
    /// (data address, byte length) of the host tensor -> its device copy
    weights: HashMap<(usize, usize), GpuWeight>,
    pub n_layers_offloaded: usize,
    pub output_offloaded: bool,
    pub bytes: u64,
    /// Weights of offloaded layers that stayed on the CPU (type without a kernel, too large).
    pub kept_on_cpu: Vec<String>,
}

/// `blk.N.` -> N
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// PYLLAMA_GPU_MAX_MIB: the most device memory the offloaded weights may take on each
/// device (unset: as much as the device gives).
fn budget_bytes() -> Result<Option<u64>> {
    match std::env::var("PYLLAMA_GPU_MAX_MIB") {
        Err(_) => Ok(None),
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(m) if m >= 0.0 && m.is_finite() => Ok(Some((m * 1048576.0) as u64)),
            _ => Err(Error::Invalid(format!("PYLLAMA_GPU_MAX_MIB = {v:?}: not a non-negative number of MiB"))),
        },
    }
}

/// The device of usable adapter `index`, opened once per process and shared by every
/// model offloaded to it (its compiled pipelines and scratch buffers with it).
pub fn shared(index: usize, allow_software: bool) -> Result<Arc<Gpu>> {
    /// (usable index, software allowed, PYLLAMA_GPU_REPEAT, subgroups allowed) -> the opened device
    type Open = HashMap<(usize, bool, usize, bool), Arc<Gpu>>;
    static OPEN: OnceLock<Mutex<Open>> = OnceLock::new();
    let allow = allow_software || software_allowed_by_env();
    let sg = subgroups_allowed_by_env();
    let key = (index, allow, repeat()?, sg);
    let mut open = OPEN.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = open.get(&key) {
        return Ok(g.clone());
    }
    let g = Arc::new(Gpu::open_with(index, allow, sg)?);
    open.insert(key, g.clone());
    Ok(g)
}

/// llama.cpp's layer assignment (llama_model::load_tensors): with `ngl` (negative = all)
/// layers offloaded, the output layer counting as layer n_layer, layers
/// `n_layer + 1 - ngl ..= n_layer` go to the devices, layer `il` to the first device whose
/// cumulative share of `splits` (normalized) exceeds `(il - first) / ngl`. `splits` all zero:
/// equal shares (llama.cpp's default is the devices' free memory, which wgpu does not
/// report; llama.cpp then uses the host's, the same for every device). Entry `il` (0..=n_layer)
/// is the device of layer il, None for the CPU.
pub fn assign_layers(n_layer: usize, ngl: i32, splits: &[f32]) -> Vec<Option<usize>> {
    let n_dev = splits.len();
    if n_dev == 0 {
        return vec![None; n_layer + 1];
    }
    let ngl = if ngl < 0 { n_layer + 1 } else { (ngl as usize).min(n_layer + 1) };
    let first = n_layer + 1 - ngl;
    let all_zero = splits.iter().all(|&x| x == 0.0);
    let mut cum: Vec<f32> = Vec::with_capacity(n_dev);
    let mut sum = 0f32;
    for &x in splits {
        sum += if all_zero { 1.0 } else { x };
        cum.push(sum);
    }
    for c in cum.iter_mut() {
        *c /= sum;
    }
    (0..=n_layer)
        .map(|il| {
            if il < first {
                return None;
            }
            let f = (il - first) as f32 / ngl as f32;
            Some(cum.partition_point(|&c| c <= f).min(n_dev - 1))
        })
        .collect()
}

/// The usable adapters (indices into `usable_adapters`) `p` offloads to, in split order,
/// after llama.cpp's checks of split_mode, main_gpu and tensor_split.
fn devices_of(p: &OffloadParams) -> Result<Vec<usize>> {
    let n = usable_raw(p.allow_software)?.len();
    if n == 0 {
        // Gpu::open says why (no adapter, or only software ones)
        Gpu::open(0, p.allow_software)?;
    }
    if p.main_gpu >= n {
        return Err(Error::Invalid(format!("main_gpu = {}: there are {n} usable GPU adapters", p.main_gpu)));
    }
    match p.split_mode {
        SplitMode::None => Ok(vec![p.main_gpu]),
        SplitMode::Layer if p.main_gpu != 0 => Err(Error::Invalid(format!(
            "main_gpu = {}: main_gpu picks the adapter of split_mode 'none'; split_mode 'layer' spreads the \
             offloaded layers over all {n} usable adapters by tensor_split (llama.cpp reads main_gpu only with 'none')",
            p.main_gpu
        ))),
        SplitMode::Layer => Ok((0..n).collect()),
        // ggml-vulkan has no split buffer type either: llama.cpp fails the load the same way
        SplitMode::Row | SplitMode::Tensor => Err(Error::Invalid(format!(
            "split_mode '{}': the GPU backend (wgpu) cannot split a tensor across adapters (llama.cpp's Vulkan \
             backend neither: 'does not support split buffers'); use 'layer' or 'none'",
            p.split_mode.name()
        ))),
    }
}

/// Open the adapters and upload the weights `p` asks for. `progress(done, total)` is called
/// per weight uploaded; returning false cancels.
pub fn offload(model: &Model, p: &OffloadParams, progress: &mut dyn FnMut(u64, u64) -> bool) -> Result<GpuBackend> {
    let devs = devices_of(p)?;
    let n_layer = model.hparams.n_layer;
    let splits: Vec<f32> = (0..devs.len()).map(|i| p.tensor_split.get(i).copied().unwrap_or(0.0)).collect();
    let place = assign_layers(n_layer, p.n_gpu_layers, &splits);
    // the devices that get a layer, each opened once, in layer order
    let mut parts: Vec<(usize, Part)> = Vec::new();
    for (il, d) in place.iter().enumerate() {
        let Some(d) = *d else { continue };
        if parts.last().is_none_or(|(pd, _)| *pd != d) {
            let gpu = shared(devs[d], p.allow_software)?;
            let off = Offload {
                gpu,
                weights: HashMap::new(),
                n_layers_offloaded: 0,
                output_offloaded: false,
                bytes: 0,
                kept_on_cpu: Vec::new(),
            };
            parts.push((d, Part { off, layers: il.min(n_layer)..il.min(n_layer), adapter: devs[d] }));
        }
        let part = &mut parts.last_mut().expect("pushed above").1;
        if il < n_layer {
            part.layers.end = il + 1;
            part.off.n_layers_offloaded += 1;
        } else {
            part.off.output_offloaded = true;
        }
    }
    // layer (0..=n_layer) -> index into parts
    let part_of: Vec<Option<usize>> =
        place.iter().map(|d| d.and_then(|d| parts.iter().position(|(pd, _)| *pd == d))).collect();
    // the output projection: output.weight, or the tied token embedding
    let out_name = if model.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
    let mut want: Vec<TensorView> = Vec::new();
    for f in &model.files {
        for t in &f.tensors {
            let Some(v) = model.tensor(&t.name) else { continue };
            let is_matrix = v.ne[1] > 1;
            let unit = match layer_of(&t.name) {
                Some(il) if il < n_layer => Some(il),
                Some(_) => None,
                None => (t.name == out_name).then_some(n_layer),
            };
            if is_matrix && unit.is_some_and(|u| place[u].is_some()) {
                want.push(v);
            }
        }
    }
    // top down, as llama.cpp counts them: the output layer, then n_layer - 1, n_layer - 2, ...
    // so the layers uploaded before a device runs out are an n_gpu_layers that fits
    let unit = |v: &TensorView| layer_of(v.name).unwrap_or(n_layer);
    want.sort_by_key(|v| std::cmp::Reverse(unit(v)));
    let total: u64 = want.iter().map(|v| v.data.len() as u64).sum();
    let budget = budget_bytes()?;
    let mut done = 0u64;
    let mut i = 0;
    let mut fit = 0usize; // complete layers (the output counting as one) on the devices
    while i < want.len() {
        let u = unit(&want[i]);
        let j = i + want[i..].iter().take_while(|v| unit(v) == u).count();
        let unit_bytes: u64 = want[i..j].iter().map(|v| v.data.len() as u64).sum();
        let part = &mut parts[part_of[u].expect("a layer with weights to upload has a device")].1;
        let gpu = part.off.gpu.clone();
        let on_dev: u64 = part.off.weights.values().map(|w: &GpuWeight| w.bytes as u64).sum();
        let what = if u == n_layer { "the output layer".to_string() } else { format!("layer {u}") };
        let oom = |why: &str| {
            Error::Alloc(format!(
                "GPU '{}': {why} uploading {what} ({:.1} MiB; {:.1} MiB of the {:.1} MiB asked for are on this device): \
                 n_gpu_layers = {fit} would fit",
                gpu.info.name,
                unit_bytes as f64 / 1048576.0,
                on_dev as f64 / 1048576.0,
                total as f64 / 1048576.0
            ))
        };
        if budget.is_some_and(|b| on_dev + unit_bytes > b) {
            return Err(oom("over PYLLAMA_GPU_MAX_MIB"));
        }
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        for v in &want[i..j] {
            let up = if shaders::supported(v.ty) { gpu.upload(v) } else { None };
            match up {
                Some(g) => {
                    part.off.weights.insert((v.data.as_ptr() as usize, v.data.len()), g);
                }
                None => part.off.kept_on_cpu.push(format!("{} ({})", v.name, v.ty)),
            }
        }
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(oom(&format!("out of device memory ({e})")));
        }
        fit += 1;
        done += unit_bytes;
        if !progress(done, total) {
            return Err(Error::Cancelled);
        }
        i = j;
    }
    let mut parts: Vec<Part> = parts.into_iter().map(|(_, p)| p).collect();
    for p in parts.iter_mut() {
        p.off.bytes = p.off.weights.values().map(|w| w.bytes as u64).sum();
    }
    Ok(GpuBackend { parts, n_layer })
}

impl Offload {
    /// The device copy of `w`, when this offload holds it.
    pub fn weight(&self, w: &TensorView) -> Option<&GpuWeight> {
        self.weights.get(&(w.data.as_ptr() as usize, w.data.len()))
    }

    pub fn n_weights(&self) -> usize {
        self.weights.len()
    }

    /// One line for the load log.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "{} of the repeating layers{} on '{}' ({}, {}, {}), {} weights, {:.1} MiB",
            self.n_layers_offloaded,
            if self.output_offloaded { " and the output layer" } else { "" },
            self.gpu.info.name,
            self.gpu.info.backend,
            self.gpu.info.device_type,
            self.gpu.reductions(),
            self.weights.len(),
            self.bytes as f64 / (1024.0 * 1024.0)
        );
        if !self.kept_on_cpu.is_empty() {
            s += &format!("; kept on the CPU (no GPU kernel or too large): {}", self.kept_on_cpu.join(", "));
        }
        s
    }
}

/// One device of a `GpuBackend` and the repeating layers it holds.
pub struct Part {
    pub off: Offload,
    /// Consecutive repeating layers (empty when it holds the output layer only).
    pub layers: Range<usize>,
    /// Its index in `usable_adapters`.
    pub adapter: usize,
}

/// The model's offloaded weights on one device or, split by layer, on several, bottom
/// layers first: the backend (`crate::backend::Backend`) the forward pass hands their work.
pub struct GpuBackend {
    pub parts: Vec<Part>,
    pub n_layer: usize,
}

impl GpuBackend {
    /// The first repeating layer on a device (n_layer when none is).
    pub fn first_layer(&self) -> usize {
        self.parts.iter().filter(|p| !p.layers.is_empty()).map(|p| p.layers.start).min().unwrap_or(self.n_layer)
    }

    /// The device that holds layer `il`'s weights.
    fn part(&self, il: usize) -> Option<&Part> {
        self.parts.iter().find(|p| p.layers.contains(&il))
    }

    pub fn n_weights(&self) -> usize {
        self.parts.iter().map(|p| p.off.n_weights()).sum()
    }
}

impl Backend for GpuBackend {
    fn matmul_rows(
        &self,
        w: &TensorView,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        ld_out: usize,
        rows: Range<usize>,
    ) -> Result<bool> {
        for p in &self.parts {
            if let Some(g) = p.off.weight(w) {
                p.off.gpu.matmul(g, x, n_tokens, out, ld_out, rows)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn describe(&self) -> String {
        match &self.parts[..] {
            [] => "GPU offload: nothing offloaded".into(),
            [p] => format!("GPU offload: {}", p.off.summary()),
            ps => {
                let each: Vec<String> = ps
                    .iter()
                    .map(|p| {
                        let what = match (p.layers.len(), p.off.output_offloaded) {
                            (0, _) => "the output layer".to_string(),
                            (1, out) => format!("layer {}{}", p.layers.start, if out { " and the output layer" } else { "" }),
                            (_, out) => format!(
                                "layers {}-{}{}",
                                p.layers.start,
                                p.layers.end - 1,
                                if out { " and the output layer" } else { "" }
                            ),
                        };
                        format!(
                            "adapter {} '{}': {what}, {} weights, {:.1} MiB{}",
                            p.adapter,
                            p.off.gpu.info.name,
                            p.off.n_weights(),
                            p.off.bytes as f64 / 1048576.0,
                            if p.off.kept_on_cpu.is_empty() {
                                String::new()
                            } else {
                                format!(" (kept on the CPU: {})", p.off.kept_on_cpu.join(", "))
                            }
                        )
                    })
                    .collect();
                format!("GPU offload split by layer over {} devices: {}", ps.len(), each.join("; "))
            }
        }
    }

    fn decoder_first(&self, stack: &DecoderStack) -> usize {
        let n_layer = stack.n_layer;
        let first = self.first_layer().min(n_layer);
        if !resident::enabled() || first < n_layer - stack.layers.len() || n_layer != self.n_layer {
            return n_layer;
        }
        for il in first..n_layer {
            let l = stack.layer(il);
            let Some(p) = self.part(il) else { return n_layer };
            let mats = [Some(l.wq), Some(l.wk), Some(l.wv), Some(l.wo), l.gate, Some(l.up), Some(l.down)];
            if mats.iter().flatten().any(|w| p.off.weight(w).is_none()) {
                return n_layer;
            }
        }
        first
    }

    /// The layers `first..` device by device: x comes down from one device and goes up to
    /// the next once per border (wgpu has no copy between devices).
    fn decoder_run(&self, st: &mut Step, stack: &DecoderStack, first: usize) -> Result<bool> {
        let vecs = stack
            .cache
            .get_or_init(resident::VecCache::default)
            .ok_or_else(|| Error::Invalid("internal: the decoder's backend cache holds another backend's data".into()))?;
        let stretches: Vec<(&Offload, Range<usize>)> = self
            .parts
            .iter()
            .map(|p| (&p.off, p.layers.start.max(first)..p.layers.end))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        let (hd_k, hd_v) = (st.hp.n_embd_head_k, st.hp.n_embd_head_v);
        let on_device = st.kv.offload_kqv
            && match kv::unsupported(st.kv, hd_k, hd_v) {
                Some(why) => {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(|| crate::log::warn(&format!("{why}; the KV cache of the offloaded layers stays on the CPU")));
                    false
                }
                None => true,
            };
        // the device copies are out of the cache while the layers run; back in whatever happens
        let mut kvs = std::mem::take(&mut st.kv.gpu);
        if on_device && (kvs.len() != stretches.len() || kvs.iter().zip(&stretches).any(|(g, (_, r))| g.layers() != *r)) {
            kvs.clear(); // free the old copies before making new ones
            for (off, r) in &stretches {
                kvs.push(kv::GpuKv::new(off, &*st.kv, r.clone())?);
            }
        }
        let mut r = Ok(());
        for (i, (off, layers)) in stretches.iter().enumerate() {
            let g = match kvs.get_mut(i).filter(|_| on_device) {
                Some(g) => match g.upload(&*st.kv) {
                    Ok(()) => Some(&*g),
                    Err(e) => {
                        r = Err(e);
                        break;
                    }
                },
                None => None,
            };
            r = resident::run_stretch(st, stack, layers.clone(), off, vecs, g);
            if r.is_err() {
                break;
            }
        }
        if r.is_err() {
            for g in kvs.iter_mut() {
                g.dirty = true; // a device copy may be partly written: the host's is the reference
            }
        }
        st.kv.gpu = kvs;
        r?;
        Ok(st.select_outputs())
    }
}

#[cfg(test)]
mod tests {
    //! The kernels against the CPU path on whatever adapter is there (lavapipe in CI,
    //! allowed explicitly). Each GPU element is held to an f64 dot product of the
    //! dequantized weights with the activations rounded to the weight type's vec_dot type
    //! (what the kernel computes, in another order: |err| <= 1e-5 of sum |w x|), and to the
    //! CPU matmul, which multiplies those same rounded activations in llama.cpp's order:
    //! |err| <= 1e-5 of sum |w x| (Q4_1 / Q5_1: 5e-4, measured 1.0e-4: the CPU takes Q8_1's
    //! block sum rounded to f16). With f32 activations the quantized types were 1.9e-3 off.
    use super::*;
    use crate::ops::matmul::try_matmul_rows;
    use crate::quant;
    use crate::threadpool::ThreadPool;

    struct Rng(u64);
    impl Rng {
        fn f(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn gpu() -> Option<Gpu> {
        match Gpu::open(0, true) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("SKIP: no GPU adapter: {e}");
                None
            }
        }
    }

    fn check(g: &Gpu, ty: GgmlType, n_in: usize, n_out: usize, n_tok: usize, rows: Range<usize>, rng: &mut Rng) -> (f64, f64) {
        let wf: Vec<f32> = (0..n_in * n_out).map(|_| rng.f()).collect();
        let wrow = quant::row_bytes(ty, n_in).unwrap();
        let mut w = vec![0u8; wrow * n_out];
        // no quantizer for these in the core: random blocks, with finite f16 scales at these offsets
        let kblock: Option<(usize, &[usize])> = match ty {
            GgmlType::Q4_K => Some((144, &[0, 2])),
            GgmlType::Q6_K => Some((210, &[208])),
            GgmlType::Q2_K => Some((84, &[80, 82])),
            GgmlType::Q3_K => Some((110, &[108])),
            GgmlType::Q5_K => Some((176, &[0, 2])),
            GgmlType::IQ4_XS => Some((136, &[0])),
            _ => None,
        };
        if let Some((bb, scales)) = kblock {
            for (i, b) in w.iter_mut().enumerate() {
                *b = (rng.f().to_bits() >> (8 * (i % 3))) as u8;
            }
            for blk in w.chunks_exact_mut(bb) {
                for &o in scales {
                    let d = half::f16::from_f32(0.01 + 0.01 * rng.f());
                    blk[o..o + 2].copy_from_slice(&d.to_le_bytes());
                }
            }
        } else {
            for r in 0..n_out {
                quant::quantize_row(ty, &wf[r * n_in..(r + 1) * n_in], &mut w[r * wrow..(r + 1) * wrow]).unwrap();
            }
        }
        let x: Vec<f32> = (0..n_in * n_tok).map(|_| rng.f()).collect();
        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: crate::model::Layout::Plain };
        let gw = g.upload(&tv).unwrap();
        let width = rows.len();
        let ld = width + 3; // a wider output buffer: the stride is honoured
        let mut out_g = vec![f32::NAN; ld * n_tok];
        g.matmul(&gw, &x, n_tok, &mut out_g, ld, rows.clone()).unwrap();
        let mut out_c = vec![0f32; ld * n_tok];
        let pool = ThreadPool::new(1);
        try_matmul_rows(&pool, &tv, &x, n_tok, &mut out_c, ld, rows.clone(), &mut Vec::new()).unwrap();
        let (mut worst_ref, mut worst_cpu) = (0f64, 0f64);
        let mut deq = vec![0f32; n_in];
        let x = round_act_host(ty, &x, n_in).unwrap().unwrap_or(x);
        for (j, r) in rows.enumerate() {
            quant::dequantize_row(ty, &w[r * wrow..(r + 1) * wrow], &mut deq).unwrap();
            for t in 0..n_tok {
                let xs = &x[t * n_in..(t + 1) * n_in];
                let exact: f64 = deq.iter().zip(xs).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = deq.iter().zip(xs).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum::<f64>().max(1e-30);
                let (gv, cv) = (out_g[t * ld + j] as f64, out_c[t * ld + j] as f64);
                worst_ref = worst_ref.max((gv - exact).abs() / mag);
                worst_cpu = worst_cpu.max((gv - cv).abs() / mag);
            }
        }
        for t in 0..n_tok {
            assert!(out_g[t * ld + width..(t + 1) * ld].iter().all(|v| v.is_nan()), "{ty}: wrote past the row range");
        }
        (worst_ref, worst_cpu)
    }

    #[test]
    fn kernels_agree_with_cpu() {
        // with subgroup reductions where the adapter has them, and without
        for sg in [true, false] {
            let g = match Gpu::open_with(0, true, sg) {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("SKIP: no GPU adapter: {e}");
                    return;
                }
            };
            eprintln!("adapter: {:?}; subgroups: {}", g.info, g.subgroups);
            kernel_cases(&g);
            if !g.info.subgroups {
                break;
            }
        }
    }

    fn kernel_cases(g: &Gpu) {
        let mut rng = Rng(7);
        use GgmlType::*;
        for ty in [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS] {
            let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
            let cpu_tol = match ty {
                Q4_1 | Q5_1 => 5e-4,
                _ => 1e-5,
            };
            for (n_in, n_out, n_tok, rows) in [
                (bs * 3, 37, 1, 0..37),
                (bs * 3, 37, 11, 5..30),
                (bs * 2, 16, 8, 0..16),
                (bs * 5, 9, 17, 2..9),
            ] {
                let (r, c) = check(g, ty, n_in, n_out, n_tok, rows, &mut rng);
                eprintln!("{ty} n_in={n_in} n_tok={n_tok}: vs exact {r:.2e}, vs cpu {c:.2e}");
                assert!(r <= 1e-5, "{ty} n_in={n_in} n_tok={n_tok}: GPU vs exact dot {r:e}");
                assert!(c <= cpu_tol, "{ty} n_in={n_in} n_tok={n_tok}: GPU vs CPU {c:e}");
            }
        }
        // float rows that are not a multiple of 32 long
        for ty in [F32, F16, BF16] {
            let (r, _) = check(g, ty, 45, 6, 3, 0..6, &mut rng);
            assert!(r <= 1e-5, "{ty} n_in=45: {r:e}");
        }
    }

    #[test]
    fn layer_assignment_is_llama_cpps() {
        // llama_model::load_tensors: unit u of the ngl offloaded ones (the output layer is unit
        // n_layer) goes to the first device whose cumulative normalized share exceeds u / ngl
        let a = |n_layer, ngl, s: &[f32]| assign_layers(n_layer, ngl, s);
        let d = |v: &[i32]| v.iter().map(|&x| (x >= 0).then_some(x as usize)).collect::<Vec<_>>();
        // 4 layers, all, equal over 2: cum [.5, 1]; u/5 = 0, .2, .4 | .6, .8
        assert_eq!(a(4, -1, &[0.0, 0.0]), d(&[0, 0, 0, 1, 1]));
        // ngl 3: layers 2, 3 and the output; u/3 = 0, .33 | .67
        assert_eq!(a(4, 3, &[1.0, 1.0]), d(&[-1, -1, 0, 0, 1]));
        // a zero share takes nothing: [0, 1] puts every unit on device 1
        assert_eq!(a(4, 99, &[0.0, 1.0]), d(&[1, 1, 1, 1, 1]));
        // 3:1 -> cum [.75, 1]; u/5 = 0 .. .6 | .8
        assert_eq!(a(4, 5, &[3.0, 1.0]), d(&[0, 0, 0, 0, 1]));
        // three devices 1:2:1 over 7 units: cum [.25, .75, 1]
        assert_eq!(a(6, -1, &[1.0, 2.0, 1.0]), d(&[0, 0, 1, 1, 1, 1, 2]));
        // ngl 1: the output layer only; ngl 0: nothing; one device: everything offloaded on it
        assert_eq!(a(4, 1, &[1.0, 1.0]), d(&[-1, -1, -1, -1, 0]));
        assert_eq!(a(4, 0, &[1.0]), d(&[-1; 5]));
        assert_eq!(a(2, 99, &[5.0]), d(&[0, 0, 0]));
        assert_eq!(a(2, 99, &[]), d(&[-1, -1, -1]));
    }

    #[test]
    fn one_adapter_opens_as_two_devices() {
        // what PYLLAMA_GPU_REPEAT relies on: wgpu gives a second device on the same adapter,
        // and each runs its own work
        let (Some(a), Some(b)) = (gpu(), gpu()) else { return };
        let mut rng = Rng(11);
        for g in [&a, &b] {
            let (r, _) = check(g, GgmlType::F32, 64, 8, 3, 0..8, &mut rng);
            assert!(r <= 1e-5, "{r:e}");
        }
    }

    #[test]
    fn software_adapter_refused_unless_allowed() {
        // Without the opt-in, a software adapter is never picked.
        if software_allowed_by_env() {
            eprintln!("SKIP: PYLLAMA_GPU=cpu-ok is set");
            return;
        }
        let all = adapters();
        let hw = all.iter().filter(|a| !a.is_software()).count();
        assert_eq!(usable_adapters(false).len(), hw);
        if hw == 0 {
            let e = Gpu::open(0, false).err().expect("a software adapter was opened without the opt-in");
            assert!(e.to_string().contains("adapter"), "{e}");
        }
    }
}
