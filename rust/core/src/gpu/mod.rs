//! GPU offload through wgpu (Vulkan, Metal, DX12), behind the cargo feature `gpu`.
//!
//! What it does today: the matrix products whose weights it holds. `offload` uploads, once
//! at model load, the 2-D and 3-D weights of the layers llama.cpp would put on the GPU
//! (the output projection counts as layer n_layer: `n_gpu_layers = N` is the output layer
//! and the last N - 1 repeating layers; negative = all) from the mapping into device
//! buffers; `Offload` implements `ops::matmul::MatmulDevice`, so the forward pass's `mm`
//! hands it those products. The shared decoder (models/decoder.rs) goes further: its
//! offloaded layers keep the activations on the device (`resident`: norms, biases, rope,
//! gated activations and residual adds in `ops.wgsl`); with the context's `offload_kqv`
//! their KV cache and attention are on the device too (`kv`: `attn.wgsl`), else q, k, v
//! and the attention output cross per layer, attention and the KV cache staying on the
//! CPU. Other forward passes run everything but those matmuls on the CPU, crossing once
//! per offloaded matmul.
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
//! Numerics: the kernels multiply the dequantized weights with the f32 activations in f32
//! (the CPU kernels first quantize the activations to Q8_0 / F16 as llama.cpp does), and
//! sum in another order, so results agree with the CPU path to float tolerance, not bit
//! for bit.

pub mod kv;
pub mod resident;
mod shaders;

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use crate::model::{Model, TensorView};
use crate::ops::matmul::MatmulDevice;
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
    }
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

/// The adapters offload may use: hardware ones, and software ones when allowed.
pub fn usable_adapters(allow_software: bool) -> Vec<AdapterInfo> {
    let allow = allow_software || software_allowed_by_env();
    adapters().into_iter().filter(|a| allow || !a.is_software()).collect()
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
    /// Open adapter `index` of `usable_adapters(allow_software)`.
    pub fn open(index: usize, allow_software: bool) -> Result<Gpu> {
        let allow = allow_software || software_allowed_by_env();
        let all = raw_adapters();
        let n_all = all.len();
        let usable: Vec<wgpu::Adapter> =
            all.into_iter().filter(|a| allow || a.get_info().device_type != wgpu::DeviceType::Cpu).collect();
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
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("pyllama"),
            required_features: wgpu::Features::empty(),
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
            device,
            queue,
            pipes: Mutex::new(Pipelines { layout, by_kind: HashMap::new() }),
            scratch: Mutex::new(Scratch { x: None, y: None, read: None, params }),
            res: Mutex::new(resident::Resident::default()),
            fault,
        })
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
        let src = shaders::matmul_source(ty, tn).ok_or_else(|| Error::Unsupported(format!("no GPU kernel for {ty}")))?;
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
    /// Index into `usable_adapters`.
    pub main_gpu: usize,
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

/// PYLLAMA_GPU_MAX_MIB: the most device memory the offloaded weights may take (unset: as
/// much as the device gives).
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
    static OPEN: OnceLock<Mutex<HashMap<(usize, bool), Arc<Gpu>>>> = OnceLock::new();
    let allow = allow_software || software_allowed_by_env();
    let mut open = OPEN.get_or_init(|| Mutex::new(HashMap::new())).lock().unwrap_or_else(|e| e.into_inner());
    if let Some(g) = open.get(&(index, allow)) {
        return Ok(g.clone());
    }
    let g = Arc::new(Gpu::open(index, allow)?);
    open.insert((index, allow), g.clone());
    Ok(g)
}

/// Open the adapter and upload the weights `p` asks for. `progress(done, total)` is called
/// per weight uploaded; returning false cancels.
pub fn offload(model: &Model, p: &OffloadParams, progress: &mut dyn FnMut(u64, u64) -> bool) -> Result<Offload> {
    let gpu = shared(p.main_gpu, p.allow_software)?;
    // llama.cpp's layer assignment (llama_model::load_tensors): the output layer counts as
    // layer n_layer, and layers n_layer + 1 - ngl ..= n_layer go to the GPU; negative = all
    let n_layer = model.hparams.n_layer;
    let ngl = if p.n_gpu_layers < 0 { n_layer + 1 } else { p.n_gpu_layers as usize };
    let first = (n_layer + 1).saturating_sub(ngl);
    let output_offloaded = ngl >= 1;
    // the output projection: output.weight, or the tied token embedding
    let out_name = if model.tensor("output.weight").is_some() { "output.weight" } else { "token_embd.weight" };
    let mut want: Vec<TensorView> = Vec::new();
    for f in &model.files {
        for t in &f.tensors {
            let Some(v) = model.tensor(&t.name) else { continue };
            let is_matrix = v.ne[1] > 1;
            let pick = match layer_of(&t.name) {
                Some(il) => il >= first && il < n_layer,
                None => output_offloaded && t.name == out_name,
            };
            if pick && is_matrix {
                want.push(v);
            }
        }
    }
    // top down, as llama.cpp counts them: the output layer, then n_layer - 1, n_layer - 2, ...
    // so the layers uploaded before the device runs out are an n_gpu_layers that fits
    let unit = |v: &TensorView| layer_of(v.name).unwrap_or(n_layer);
    want.sort_by_key(|v| std::cmp::Reverse(unit(v)));
    let total: u64 = want.iter().map(|v| v.data.len() as u64).sum();
    let budget = budget_bytes()?;
    let mut done = 0u64;
    let mut weights = HashMap::new();
    let mut kept_on_cpu = Vec::new();
    let mut i = 0;
    let mut fit = 0usize; // complete layers (the output counting as one) on the device
    while i < want.len() {
        let u = unit(&want[i]);
        let j = i + want[i..].iter().take_while(|v| unit(v) == u).count();
        let unit_bytes: u64 = want[i..j].iter().map(|v| v.data.len() as u64).sum();
        let on_dev: u64 = weights.values().map(|w: &GpuWeight| w.bytes as u64).sum();
        let what = if u == n_layer { "the output layer".to_string() } else { format!("layer {u}") };
        let oom = |why: &str| {
            Error::Alloc(format!(
                "GPU '{}': {why} uploading {what} ({:.1} MiB; {:.1} MiB of the {:.1} MiB asked for are on the device): \
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
                    weights.insert((v.data.as_ptr() as usize, v.data.len()), g);
                }
                None => kept_on_cpu.push(format!("{} ({})", v.name, v.ty)),
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
    let bytes = weights.values().map(|w| w.bytes as u64).sum();
    Ok(Offload { gpu, weights, n_layers_offloaded: n_layer - first.min(n_layer), output_offloaded, bytes, kept_on_cpu })
}

impl Offload {
    /// The device copy of `w`, when this offload holds it.
    pub fn weight(&self, w: &TensorView) -> Option<&GpuWeight> {
        self.weights.get(&(w.data.as_ptr() as usize, w.data.len()))
    }

    /// Index of the first repeating layer on the device (n_layer when none is).
    pub fn first_layer(&self, n_layer: usize) -> usize {
        n_layer - self.n_layers_offloaded.min(n_layer)
    }

    pub fn n_weights(&self) -> usize {
        self.weights.len()
    }

    /// One line for the load log.
    pub fn summary(&self) -> String {
        let mut s = format!(
            "GPU offload: {} of the repeating layers{} on '{}' ({}, {}), {} weights, {:.1} MiB",
            self.n_layers_offloaded,
            if self.output_offloaded { " and the output layer" } else { "" },
            self.gpu.info.name,
            self.gpu.info.backend,
            self.gpu.info.device_type,
            self.weights.len(),
            self.bytes as f64 / (1024.0 * 1024.0)
        );
        if !self.kept_on_cpu.is_empty() {
            s += &format!("; kept on the CPU (no GPU kernel or too large): {}", self.kept_on_cpu.join(", "));
        }
        s
    }
}

impl MatmulDevice for Offload {
    fn matmul_rows(
        &self,
        w: &TensorView,
        x: &[f32],
        n_tokens: usize,
        out: &mut [f32],
        ld_out: usize,
        rows: Range<usize>,
    ) -> Result<bool> {
        let Some(g) = self.weights.get(&(w.data.as_ptr() as usize, w.data.len())) else { return Ok(false) };
        self.gpu.matmul(g, x, n_tokens, out, ld_out, rows)?;
        Ok(true)
    }

    fn describe(&self) -> String {
        self.summary()
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    //! The kernels against the CPU path on whatever adapter is there (lavapipe in CI,
    //! allowed explicitly). Each GPU element is held to an f64 dot product of the
    //! dequantized weights with the f32 activations (what the kernel computes, in another
    //! order: |err| <= 1e-5 of sum |w x|; measured <= 1e-7 on lavapipe), and to the CPU
    //! matmul, which quantizes the activations first, llama.cpp's way: |err| <= 5e-3 of
    //! sum |w x| for the quantized types (measured <= 1.9e-3), 5e-4 for F16 (F16
    //! activations; measured <= 1.3e-4), 1e-6 for F32 (measured <= 1e-7).
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
        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w };
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
        let Some(g) = gpu() else { return };
        eprintln!("adapter: {:?}", g.info);
        let mut rng = Rng(7);
        use GgmlType::*;
        for ty in [F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS] {
            let bs = if ty.block_size() == 1 { 32 } else { ty.block_size() };
            let cpu_tol = match ty {
                F32 => 1e-6,
                F16 => 5e-4,
                _ => 5e-3,
            };
            for (n_in, n_out, n_tok, rows) in [
                (bs * 3, 37, 1, 0..37),
                (bs * 3, 37, 11, 5..30),
                (bs * 2, 16, 8, 0..16),
                (bs * 5, 9, 17, 2..9),
            ] {
                let (r, c) = check(&g, ty, n_in, n_out, n_tok, rows, &mut rng);
                eprintln!("{ty} n_in={n_in} n_tok={n_tok}: vs exact {r:.2e}, vs cpu {c:.2e}");
                assert!(r <= 1e-5, "{ty} n_in={n_in} n_tok={n_tok}: GPU vs exact dot {r:e}");
                assert!(c <= cpu_tol, "{ty} n_in={n_in} n_tok={n_tok}: GPU vs CPU {c:e}");
            }
        }
        // float rows that are not a multiple of 32 long
        for ty in [F32, F16, BF16] {
            let (r, _) = check(&g, ty, 45, 6, 3, 0..6, &mut rng);
            assert!(r <= 1e-5, "{ty} n_in=45: {r:e}");
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
