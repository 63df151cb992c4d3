//! Kernel benchmark (not a test): `cargo bench -p pyllama-core --bench kernels [-- MODE]`.
//! Modes: (none) full table, `quick` shorter timings, `roof` best-case per-core kernel
//! speed with the weights in cache (AVX2 and AVX-512 kernels side by side), `pool`
//! thread-pool cost per parallel region, `bw` the read probe on PYLLAMA_BENCH_MIB MiB and the
//! pool's region cost in one line each (benchmarks/bandwidth.py), `tg` the single-token bandwidth table: per format,
//! GB/s of weights with 1 and 2 threads for the AVX2 and the AVX-512 kernel sets on a
//! matrix larger than L3 (1 GiB by default; `PYLLAMA_BENCH_MIB` changes it), beside the
//! read bandwidth measured on a buffer of the same size, and their ratio. Add `huge` to put
//! the weights (and the probe's buffer) on transparent huge pages (madvise);
//! `PYLLAMA_BENCH_TYPES=Q4_1,Q4_K` limits the formats, `PYLLAMA_BENCH_NIN=640` sets the
//! `tg` matrix's row length (default 4096). `split`: single-token Q4_1 matmuls of SmolLM2's
//! row length (576) over 256 MiB of weights, as one matrix and as a run of model-sized
//! matrices (1536, 576, 192 rows: its gate/up, q/o, k/v) one after another, and the same
//! matrix sizes run again and again from L2 (the kernel's speed without memory), the rows
//! plain and (where the AVX-512 VNNI kernels run) in the x4 layout, on huge pages with
//! `huge`. `x4`: the
//! AVX-512 single-token kernels of Q5_0, Q4_1 and Q4_K on plain rows against the x4 row-group
//! layout's (`quant::repack`), from memory and from the caches.
//!
//! Prints the machine's memory read bandwidth (1 and 2 threads), then per weight format:
//! single-token matmul throughput in GB/s of weights read (a 64 MiB-ish matrix, far bigger
//! than the caches, as in token generation) with 1 and 2 threads, and matmul GFLOP/s for
//! n_tokens = 1 and 512 on a model-sized matrix (768 x 2048: 768 is the nearest width to the
//! real models' 576/640 that every block size divides).
//! The machine may be shared: `cpu` columns divide by the calling thread's CPU time instead
//! of wall time (1 thread only), which shows what the kernel does when it runs.
//! `PYLLAMA_KERNELS=ref` benchmarks the scalar kernels.

use pyllama_core::ggml_type::GgmlType;
use pyllama_core::model::TensorView;
use pyllama_core::ops::matmul::{matmul, matmul_with};
use pyllama_core::quant::{self, fp};
use pyllama_core::threadpool::{split_range, ThreadPool};
use std::hint::black_box;
use std::time::{Duration, Instant};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Random blocks with finite, small f16 scales (so no NaN slow paths).
fn random_weights(ty: GgmlType, n_in: usize, n_out: usize) -> Vec<u8> {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let bytes = ty.row_size(n_in).unwrap() * n_out;
    let mut v: Vec<u8> = Vec::with_capacity(bytes + 8);
    while v.len() < bytes {
        v.extend_from_slice(&rng.next().to_le_bytes());
    }
    v.truncate(bytes);
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S | GgmlType::IQ3_XXS | GgmlType::IQ3_S | GgmlType::IQ1_S => &[0],
        GgmlType::TQ1_0 => &[52],
        GgmlType::TQ2_0 => &[64],
        GgmlType::MXFP4 => {
            for blk in v.chunks_exact_mut(17) {
                blk[0] = 120; // E8M0 scale 2^-8
            }
            &[]
        }
        GgmlType::F16 | GgmlType::BF16 | GgmlType::F32 => {
            let x: Vec<f32> = (0..n_in * n_out).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
            let mut out = vec![0u8; bytes];
            for (src, dst) in x.chunks(n_in).zip(out.chunks_mut(ty.row_size(n_in).unwrap())) {
                quant::quantize_row(ty, src, dst).unwrap();
            }
            return out;
        }
        _ => &[],
    };
    for blk in v.chunks_exact_mut(ty.type_size()) {
        for &o in fields {
            let h = fp::f32_to_f16(((rng.next() >> 40) as f32 / (1u64 << 24) as f32) * 0.01);
            blk[o..o + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    v
}

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: plain syscall filling a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Best (wall, calling-thread CPU) seconds per call over a few rounds of >= `min` each.
fn time_both(min: Duration, mut f: impl FnMut()) -> (f64, f64) {
    f();
    let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..3 {
        let start = Instant::now();
        let c0 = thread_cpu_seconds();
        let mut n = 0u32;
        while start.elapsed() < min {
            f();
            n += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / n as f64);
        best_cpu = best_cpu.min((thread_cpu_seconds() - c0) / n as f64);
    }
    (best, best_cpu)
}

fn time_it(min: Duration, f: impl FnMut()) -> f64 {
    time_both(min, f).0
}

/// Read bandwidth: every thread sums its part of a 256 MiB buffer with 256-bit loads.
fn read_bandwidth(pool: &ThreadPool, buf: &[u64], min: Duration) -> f64 {
    let t = time_it(min, || {
        pool.run(&|ith, nth| {
            let r = split_range(buf.len() / 8, ith, nth);
            let mut acc = [0u64; 8];
            for c in buf[r.start * 8..r.end * 8].chunks_exact(8) {
                for k in 0..8 {
                    acc[k] = acc[k].wrapping_add(c[k]);
                }
            }
            black_box(acc);
        })
    });
    (buf.len() * 8) as f64 / t / 1e9
}

/// Best-case kernel speed: 16 weight rows of 4096 (in L1/L2) against one activation row,
/// the minimum over many short repetitions (so a shared, preempted CPU shows its real
/// per-core speed). Returns GB/s of weights for the AVX2 1-column and 4-column kernels, the
/// AVX-512 ones (NaN where the format has none) and the AVX-512 multi-row single-token
/// kernel (all 16 rows in one call). The kernels get precomputed activation scales, as in
/// the matmul.
fn kernel_roof(ty: GgmlType) -> Option<[f64; 5]> {
    #[cfg(target_arch = "x86_64")]
    {
        if !quant::kernel_set().is_simd() {
            return None;
        }
        use quant::{table::table, KernelSet, TILE};
        let pair = |t: &quant::table::Tiled| (t.one(), t.cols[TILE].expect("tiles are at least TILE wide"));
        let avx2k = table(KernelSet::Avx2).get(ty).tiled.as_ref().map(pair)?; // VNNI builds where the CPU has them
        let (avx512k, rowsk) = if quant::avx512_available() {
            let e = table(KernelSet::Avx512).get(ty);
            // AVX-512's own tile (where it has one: the table falls back to AVX2's)
            (e.tiled.as_ref().map(pair).filter(|k| k.0 as usize != avx2k.0 as usize), e.rows)
        } else {
            (None, None)
        };
        let n = 4096;
        let rows = 16;
        let w = random_weights(ty, n, rows);
        let wrow = ty.row_size(n).unwrap();
        let vdt = quant::vec_dot_type(ty);
        let xrow = vdt.row_size(n).unwrap();
        let x: Vec<f32> = (0..n * 4).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
        let mut xq = vec![0u8; xrow * 4];
        for t in 0..4 {
            quant::quantize_row_act(vdt, &x[t * n..(t + 1) * n], &mut xq[t * xrow..(t + 1) * xrow]).unwrap();
        }
        // f32 block scales of the 4 activation rows (Q8_0: d; Q8_1: d, s), as the matmul passes
        let nsc = match vdt {
            GgmlType::Q8_0 => n / 32,
            GgmlType::Q8_1 => n / 16,
            _ => 0,
        };
        let mut xd = vec![0f32; 4 * nsc];
        for t in 0..4 {
            for k in 0..nsc {
                let (blk, f) = if vdt == GgmlType::Q8_1 { (k / 2, k % 2) } else { (k, 0) };
                let o = t * xrow + blk * vdt.type_size() + 2 * f;
                xd[t * nsc + k] = fp::f16_to_f32(u16::from_le_bytes([xq[o], xq[o + 1]]));
            }
        }
        let xdp = if nsc > 0 { xd.as_ptr() } else { std::ptr::null() };
        let mut best = [f64::INFINITY; 5];
        let mut out = [0f32; 16];
        for _ in 0..300 {
            for (k, ks) in [Some(avx2k), avx512k].into_iter().enumerate() {
                let Some((one, many)) = ks else { continue };
                let t0 = Instant::now();
                for r in 0..rows {
                    unsafe { one(n, w.as_ptr().add(r * wrow), xq.as_ptr(), xrow, xdp, nsc, out.as_mut_ptr()) };
                }
                best[2 * k] = best[2 * k].min(t0.elapsed().as_secs_f64());
                let t0 = Instant::now();
                for r in 0..rows {
                    unsafe { many(n, w.as_ptr().add(r * wrow), xq.as_ptr(), xrow, xdp, nsc, out.as_mut_ptr()) };
                }
                best[2 * k + 1] = best[2 * k + 1].min(t0.elapsed().as_secs_f64());
            }
            if let Some(rk) = rowsk {
                let t0 = Instant::now();
                unsafe { rk(n, w.as_ptr(), wrow, rows, xq.as_ptr(), xdp, out.as_mut_ptr()) };
                best[4] = best[4].min(t0.elapsed().as_secs_f64());
            }
            black_box(out);
        }
        // the 4-column kernels do 4x the work per weight byte: report weight-equivalent GB/s
        let g = |t: f64, k: f64| if t.is_finite() { k * w.len() as f64 / t / 1e9 } else { f64::NAN };
        Some([g(best[0], 1.0), g(best[1], 4.0), g(best[2], 1.0), g(best[3], 4.0), g(best[4], 1.0)])
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

/// Anonymous memory for the tg table's big buffers, optionally on transparent huge pages
/// (this machine's THP mode is `madvise`: without the advice the kernel maps 4 KiB pages).
struct Mapped {
    ptr: *mut u8,
    len: usize,
}

impl Mapped {
    fn new(len: usize, huge: bool) -> Mapped {
        // SAFETY: plain anonymous mapping, checked for failure; freed in Drop.
        unsafe {
            let p = libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
            assert!(p != libc::MAP_FAILED, "mmap of {len} bytes failed");
            if huge {
                libc::madvise(p, len, libc::MADV_HUGEPAGE);
            }
            Mapped { ptr: p as *mut u8, len }
        }
    }
    fn from_slice(v: &[u8], huge: bool) -> Mapped {
        let mut m = Mapped::new(v.len(), huge);
        m.as_mut().copy_from_slice(v);
        m
    }
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the mapping is len bytes, readable, alive while self is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what new() mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// Sum of a byte range with 256-bit loads and 4 independent accumulators: what a kernel
/// that only streams its weights could read.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_sum_avx2(p: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_si256(); 4];
    let n = p.len() / 128;
    for i in 0..n {
        let b = p.as_ptr().add(128 * i) as *const __m256i;
        for k in 0..4 {
            acc[k] = _mm256_add_epi64(acc[k], _mm256_loadu_si256(b.add(k)));
        }
    }
    let s = _mm256_add_epi64(_mm256_add_epi64(acc[0], acc[1]), _mm256_add_epi64(acc[2], acc[3]));
    let mut out = [0u64; 4];
    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, s);
    out.iter().fold(0u64, |a, b| a.wrapping_add(*b))
}

fn stream_sum(p: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") {
        // SAFETY: CPU checked.
        return unsafe { stream_sum_avx2(p) };
    }
    p.chunks_exact(8).fold(0u64, |a, c| a.wrapping_add(u64::from_le_bytes(c.try_into().unwrap())))
}

/// Runs `f(ith, nth)` on `pool` `calls` times after a warm-up, each part timing its own
/// thread CPU time. Returns (fastest wall seconds, fewest "max over parts of the part's CPU
/// seconds"): the second is what the call would take with every part on its own idle core,
/// a contention-robust stand-in for the wall time on this shared 2-core machine (it can
/// flatter when one part ran alone on an otherwise idle memory system).
fn per_part_cpu(pool: &ThreadPool, calls: usize, f: &(dyn Fn(usize, usize) + Sync)) -> (f64, f64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let cpu: Vec<AtomicU64> = (0..pool.n_threads()).map(|_| AtomicU64::new(0)).collect();
    let (mut wall, mut best) = (f64::INFINITY, f64::INFINITY);
    for k in 0..=calls {
        let t0 = Instant::now();
        pool.run(&|ith, nth| {
            let c0 = thread_cpu_seconds();
            f(ith, nth);
            cpu[ith].store((thread_cpu_seconds() - c0).to_bits(), Ordering::Relaxed);
        });
        let t = t0.elapsed().as_secs_f64();
        if k > 0 {
            wall = wall.min(t);
            best = best.min(cpu.iter().map(|c| f64::from_bits(c.load(Ordering::Relaxed))).fold(0.0, f64::max));
        }
    }
    (wall, best)
}

/// The read probe: [wall, per-CPU-second] GB/s with each pool, streaming `bytes` (best of
/// `calls` passes).
fn probe_bandwidth(pools: &[ThreadPool], bytes: usize, huge: bool, calls: usize) -> Vec<[f64; 2]> {
    let mut probe = Mapped::new(bytes, huge);
    for (i, b) in probe.as_mut().iter_mut().enumerate() {
        *b = i as u8;
    }
    pools
        .iter()
        .map(|p| {
            let buf = probe.as_ref();
            let (t, tc) = per_part_cpu(p, calls, &|ith, nth| {
                let r = split_range(buf.len() / 4096, ith, nth);
                black_box(stream_sum(&buf[r.start * 4096..r.end * 4096]));
            });
            [bytes as f64 / t / 1e9, bytes as f64 / tc / 1e9]
        })
        .collect()
}

/// The `bw` mode (benchmarks/bandwidth.py reads it): the read probe on PYLLAMA_BENCH_MIB MiB
/// (a model's weight bytes) and the pool's cost per empty parallel region, 1 and 2 threads.
fn bw_line(huge: bool) {
    let mib: usize = std::env::var("PYLLAMA_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let bw = probe_bandwidth(&pools, mib << 20, huge, 12);
    println!("probe {mib} MiB GB/s: 1 thread {:.2} 2 threads {:.2}", bw[0][0], bw[1][0]);
    for (n, pool) in pools.iter().enumerate() {
        println!("pool of {}: {:.3} us per empty region", n + 1, region_cost(pool) * 1e6);
    }
}

/// Median seconds per empty parallel region over 20 rounds of 2000 back-to-back regions.
fn region_cost(pool: &ThreadPool) -> f64 {
    let mut v: Vec<f64> = (0..20)
        .map(|_| {
            let t0 = Instant::now();
            for _ in 0..2000 {
                pool.run(&|ith, _| {
                    black_box(ith);
                });
            }
            t0.elapsed().as_secs_f64() / 2000.0
        })
        .collect();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[10]
}

/// The `tg` mode: single-token matmul bandwidth per format and kernel set vs the read probe.
fn tg_table(huge: bool, calls: usize) {
    let mib: usize = std::env::var("PYLLAMA_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(1024);
    let bytes = mib << 20;
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let bw = probe_bandwidth(&pools, bytes, huge, calls);
    let mut sets = vec![quant::KernelSet::Avx2];
    if quant::avx512_available() {
        sets.push(quant::KernelSet::Avx512);
    }
    println!(
        "single-token matmul, {mib} MiB of weights, {}; best of {calls} calls",
        if huge { "huge pages (MADV_HUGEPAGE)" } else { "4 KiB pages" }
    );
    println!(
        "read bandwidth probe (256-bit loads), GB/s: 1 thread {:.1} ({:.1} cpu), 2 threads {:.1} ({:.1} cpu)",
        bw[0][0], bw[0][1], bw[1][0], bw[1][1]
    );
    println!("GB/s of weights: wall, and `c` per CPU-second of the slowest thread (contention-robust);");
    println!("% = 2-thread GB/s / 2-thread probe GB/s (wall / cpu)");
    print!("{:<7}", "type");
    for set in &sets {
        let n = set.name();
        print!(" | {:>10} {:>6} {:>10} {:>6} {:>5} {:>5}", format!("{n} 1t"), "1t c", format!("{n} 2t"), "2t c", "%", "% c");
    }
    println!();
    let only: Option<String> = std::env::var("PYLLAMA_BENCH_TYPES").ok();
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
        if only.as_ref().is_some_and(|o| !o.split(',').any(|t| t.eq_ignore_ascii_case(ty.name()))) {
            continue;
        }
        // PYLLAMA_BENCH_NIN: the row length (Gemma 3 270M's output projection: 640)
        let n_in: usize = std::env::var("PYLLAMA_BENCH_NIN").ok().and_then(|v| v.parse().ok()).unwrap_or(4096);
        let Some(wrow) = ty.row_size(n_in) else {
            println!("{:<7} (skipped: a row of {n_in} is not whole {}-element blocks)", ty.name(), ty.block_size());
            continue;
        };
        let n_out = (bytes / wrow).max(1);
        let w = Mapped::from_slice(&random_weights(ty, n_in, n_out), huge);
        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: w.as_ref(), layout: pyllama_core::model::Layout::Plain };
        let x: Vec<f32> = (0..n_in).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
        print!("{:<7}", ty.name());
        for &set in &sets {
            // each thread runs its own row range as a 1-thread matmul (the same split and
            // kernels as the 2-thread matmul) so that it can time its own CPU
            let parts: Vec<std::sync::Mutex<(ThreadPool, Vec<f32>, Vec<u8>)>> =
                (0..2).map(|_| std::sync::Mutex::new((ThreadPool::new(1), vec![0f32; n_out], Vec::new()))).collect();
            let mut g = [[0.0; 2]; 2];
            for (k, p) in pools.iter().enumerate() {
                let (t, tc) = per_part_cpu(p, calls, &|ith, nth| {
                    let rows = split_range(n_out, ith, nth);
                    let mut part = parts[ith].lock().unwrap();
                    let (inner, o, sc) = &mut *part;
                    matmul_with(inner, set, &tv, &x, 1, o, n_out, rows, sc).unwrap();
                });
                g[k] = [w.len as f64 / t / 1e9, w.len as f64 / tc / 1e9];
            }
            print!(
                " | {:>10.1} {:>6.1} {:>10.1} {:>6.1} {:>4.0}% {:>4.0}%",
                g[0][0],
                g[0][1],
                g[1][0],
                g[1][1],
                100.0 * g[1][0] / bw[1][0],
                100.0 * g[1][1] / bw[1][1]
            );
        }
        println!();
    }
}

/// `attn`: the attention op alone over a 4096-token F16 cache (llama-bench -d 4096):
/// a 512-token micro-batch (pp512) and one token (tg), SmolLM2's and Gemma 3 270M's shapes,
/// 1 and 2 threads, milliseconds per call (one layer), and a hash of the outputs' bits (to
/// compare builds and kernel sets: they must not change).
fn attn_table() {
    use pyllama_core::kv_cache::KvCache;
    use pyllama_core::ops::attention::{attention, scratch_per_thread, AttnInputs, AttnParams};
    let depth = 4096usize;
    let min = Duration::from_millis(300);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    println!("attention, one layer, F16 K/V, depth {depth}, ms per call: 1 thread, 2 threads");
    // (name, n_head, n_head_kv, hd, n_swa)
    for (name, n_head, n_head_kv, hd, n_swa) in
        [("smollm2", 9usize, 3usize, 64usize, 0usize), ("gemma3", 4, 1, 256, 0), ("gemma3 swa512", 4, 1, 256, 512)]
    {
        for n_tokens in [512usize, 1] {
            let size = depth + n_tokens;
            let kw = n_head_kv * hd;
            let mut kv = KvCache::new(&[kw], &[kw], size, 1, 1, GgmlType::F16, GgmlType::F16).unwrap();
            kv.flash_attn = true;
            let mut rng = Rng(42);
            let mut f16_rand = |buf: &mut [u8]| {
                for c in buf.chunks_exact_mut(2) {
                    let x = (rng.next() % 2001) as f32 / 1000.0 - 1.0;
                    c.copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
                }
            };
            f16_rand(&mut kv.k[0]);
            f16_rand(&mut kv.v[0]);
            let keys: Vec<(i32, u32)> = (0..size).map(|i| (i as i32, i as u32)).collect();
            let pos: Vec<i32> = (depth..depth + n_tokens).map(|x| x as i32).collect();
            let stream = vec![0u32; n_tokens];
            let key_range = vec![(0u32, size as u32); n_tokens];
            let inp = AttnInputs { pos: &pos, stream: &stream, key_range: &key_range, keys: &keys };
            let p = AttnParams { n_swa, ..AttnParams::causal(0, n_head, n_head_kv, hd) };
            let q: Vec<f32> = (0..n_tokens * n_head * hd).map(|i| ((i * 37) % 101) as f32 * 0.02 - 1.0).collect();
            let mut out = vec![0f32; n_tokens * n_head * hd];
            let stride = scratch_per_thread(size, hd, hd);
            let mut scratch = vec![0f32; stride * 2];
            let t: Vec<f64> = pools
                .iter()
                .map(|pool| time_it(min, || attention(pool, &kv, &p, &inp, &q, &mut out, &mut scratch, stride)) * 1e3)
                .collect();
            // the outputs' bits, to compare kernels
            let h = out.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| (h ^ x.to_bits() as u64).wrapping_mul(0x100_0000_01b3));
            println!("{name:<14} n_tokens {n_tokens:>3}: {:>9.3} {:>9.3}   bits {h:016x}", t[0], t[1]);
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "split") {
        split_table(std::env::args().any(|a| a == "huge"));
        return;
    }
    if std::env::args().any(|a| a == "x4") {
        x4_table(std::env::args().any(|a| a == "huge"));
        return;
    }
    if std::env::args().any(|a| a == "attn") {
        attn_table();
        return;
    }
    if std::env::args().any(|a| a == "tg") {
        let quick = std::env::args().any(|a| a == "quick");
        tg_table(std::env::args().any(|a| a == "huge"), if quick { 5 } else { 12 });
        return;
    }
    if std::env::args().any(|a| a == "bw") {
        bw_line(std::env::args().any(|a| a == "huge"));
        return;
    }
    if std::env::args().any(|a| a == "pool") {
        // Per-region overhead of the thread pool: back-to-back empty regions (a decode step
        // makes ~200 of them per token), median of 20 rounds of 2000.
        for n in [1usize, 2] {
            println!("pool of {n}: {:.2} us per empty region (median)", region_cost(&ThreadPool::new(n)) * 1e6);
        }
        return;
    }
    if std::env::args().any(|a| a == "roof") {
        println!("best-case kernel speed (weights in cache), GB/s of weights: 1 column, 4 columns (x4 work),");
        println!("AVX2 (with AVX-VNNI where present) and AVX-512; `rows` = AVX-512 single-token kernel over 16 rows");
        println!("{:<7} {:>8} {:>8} {:>8} {:>8} {:>8}", "type", "avx2 1c", "avx2 4c", "512 1c", "512 4c", "512 rows");
        for ty in [
            GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL,
            GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS,
            GgmlType::F16, GgmlType::BF16, GgmlType::F32, GgmlType::IQ2_XXS, GgmlType::IQ2_XS, GgmlType::IQ2_S,
            GgmlType::IQ3_XXS, GgmlType::IQ3_S, GgmlType::IQ1_S, GgmlType::IQ1_M, GgmlType::TQ1_0, GgmlType::TQ2_0,
            GgmlType::MXFP4,
        ] {
            if let Some(g) = kernel_roof(ty) {
                println!("{:<7} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}", ty.name(), g[0], g[1], g[2], g[3], g[4]);
            }
        }
        return;
    }
    let quick = std::env::args().any(|a| a == "quick");
    let min = Duration::from_millis(if quick { 150 } else { 400 });
    let set = quant::kernel_set();
    println!("pyllama kernel benchmark, kernel set: {}", set.name());
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];

    let buf: Vec<u64> = (0..(256usize << 20) / 8).map(|i| i as u64).collect();
    let bw: Vec<f64> = pools.iter().map(|p| read_bandwidth(p, &buf, min)).collect();
    println!("memory read bandwidth: {:.1} GB/s (1 thread), {:.1} GB/s (2 threads)", bw[0], bw[1]);
    drop(buf);

    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::IQ4_NL,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_XS,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ];
    println!(
        "{:<7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "type", "tg GB/s", "tg GB/s", "tg GB/s", "% of bw", "n=1", "n=1", "n=512", "n=512", "n=512"
    );
    println!(
        "{:<7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "", "1 thr", "1 cpu", "2 thr", "2 thr", "GFLOP/s1", "GFLOP/s2", "GFLOP/s1", "1 cpu", "GFLOP/s2"
    );
    let mut scratch = Vec::new();
    for ty in types {
        // Big matrix (~64 MiB of weights) for the bandwidth-bound single-token case.
        let n_in = 4096;
        let n_out = ((64usize << 20) / ty.row_size(n_in).unwrap()).max(1);
        let w = random_weights(ty, n_in, n_out);
        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: pyllama_core::model::Layout::Plain };
        let x: Vec<f32> = (0..n_in).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
        let mut out = vec![0f32; n_out];
        let mut gbs = [0.0; 2];
        let mut gbs_cpu = 0.0;
        for (k, p) in pools.iter().enumerate() {
            let (t, tc) = time_both(min, || matmul(p, &tv, &x, 1, &mut out, &mut scratch));
            gbs[k] = w.len() as f64 / t / 1e9;
            if k == 0 {
                gbs_cpu = w.len() as f64 / tc / 1e9;
            }
        }
        drop(w);
        // Model-sized matrix for GFLOP/s at n_tokens 1 and 512.
        let (n_in, n_out) = (768, 2048);
        let w = random_weights(ty, n_in, n_out);
        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w, layout: pyllama_core::model::Layout::Plain };
        let mut gf = [[0.0; 2]; 2];
        let mut gf_cpu = 0.0;
        for (j, nt) in [1usize, 512].into_iter().enumerate() {
            let x: Vec<f32> = (0..n_in * nt).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
            let mut out = vec![0f32; n_out * nt];
            for (k, p) in pools.iter().enumerate() {
                let (t, tc) = time_both(min, || matmul(p, &tv, &x, nt, &mut out, &mut scratch));
                gf[j][k] = 2.0 * (n_in * n_out * nt) as f64 / t / 1e9;
                if j == 1 && k == 0 {
                    gf_cpu = 2.0 * (n_in * n_out * nt) as f64 / tc / 1e9;
                }
            }
        }
        println!(
            "{:<7} {:>8.1} {:>8.1} {:>8.1} {:>7.0}% {:>8.1} {:>8.1} {:>9.1} {:>9.1} {:>9.1}",
            ty.name(),
            gbs[0],
            gbs_cpu,
            gbs[1],
            100.0 * gbs[1] / bw[1],
            gf[0][0],
            gf[0][1],
            gf[1][0],
            gf_cpu,
            gf[1][1]
        );
    }
}

/// The `split` mode (see the header): GB/s of weights, the best of 5 sweeps, 1 and 2 threads,
/// the rows plain and (where this CPU has its kernel) in the x4 layout (`quant::repack`).
fn split_table(huge: bool) {
    use pyllama_core::model::Layout;
    let ty = GgmlType::Q4_1;
    let n_in = 576;
    let wrow = ty.row_size(n_in).unwrap();
    let n_out = (256usize << 20) / wrow / 4 * 4;
    let w = random_weights(ty, n_in, n_out);
    let mut w4 = vec![0u8; w.len()];
    pyllama_core::quant::repack::repack_x4(ty, n_in, &w, &mut w4).unwrap();
    let x4 = pyllama_core::quant::repack::x4_kernel(ty).is_some();
    let (w, w4) = (Mapped::from_slice(&w, huge), Mapped::from_slice(&w4, huge));
    let x: Vec<f32> = (0..n_in).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
    let mut out = vec![0f32; n_out];
    let mut scratch = Vec::new();
    println!("single-token Q4_1 [576 x rows] matmuls over 256 MiB, GB/s of weights: from memory (consecutive matrices), in L2 (one matrix again)");
    for (layout, data) in [(Layout::Plain, w.as_ref()), (Layout::X4, w4.as_ref())] {
        if layout == Layout::X4 && !x4 {
            continue;
        }
        for nth in [1usize, 2] {
            let pool = ThreadPool::new(nth);
            for rows in [n_out, 1536, 576, 192] {
                let mut gbs = [0f64; 2];
                for (hot, g) in gbs.iter_mut().enumerate() {
                    if hot == 1 && rows == n_out {
                        continue;
                    }
                    let mut best = f64::INFINITY;
                    for _ in 0..5 {
                        let t0 = Instant::now();
                        let mut r = 0;
                        while r < n_out {
                            let e = (r + rows).min(n_out);
                            let a = if hot == 1 { 0 } else { r };
                            let tv = TensorView { name: "w", ty, ne: [n_in, e - r, 1, 1], data: &data[a * wrow..(a + e - r) * wrow], layout };
                            matmul(&pool, &tv, &x, 1, &mut out[r..e], &mut scratch);
                            r = e;
                        }
                        best = best.min(t0.elapsed().as_secs_f64());
                    }
                    *g = data.len() as f64 / best / 1e9;
                }
                let label = if rows == n_out { "one matrix".to_string() } else { format!("{rows} rows") };
                let l2 = if rows == n_out { "-".to_string() } else { format!("{:.1}", gbs[1]) };
                println!("{layout:?} threads {nth}, {label:>11}: {:6.1} from memory, {l2:>6} in L2", gbs[0]);
            }
        }
    }
}

/// `x4`: the AVX-512 single-token kernels of Q5_0, Q4_1 and Q4_K over the plain rows against the
/// same kernels over the x4 row-group layout (`quant::repack`), GB/s of weights, 1 and 2
/// threads: a matrix of PYLLAMA_BENCH_MIB MiB (default 512: from memory) and one of ~1 MiB
/// (from the caches), rows of PYLLAMA_BENCH_NIN (default: each model's width, 896, 576 and 2048).
fn x4_table(huge: bool) {
    use pyllama_core::quant::repack::{repack_x4, x4_kernel, x4_offsets};
    let mib: usize = std::env::var("PYLLAMA_BENCH_MIB").ok().and_then(|v| v.parse().ok()).unwrap_or(512);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let bw = probe_bandwidth(&pools, mib << 20, huge, 12);
    println!("read probe {mib} MiB, GB/s: 1 thread {:.1}, 2 threads {:.1}", bw[0][0], bw[1][0]);
    println!("{:<6} {:>5} {:>9} | {:>8} {:>8} | {:>8} {:>8}", "type", "n_in", "matrix", "plain 1t", "x4 1t", "plain 2t", "x4 2t");
    for (ty, n_def) in [(GgmlType::Q5_0, 896usize), (GgmlType::Q4_1, 576), (GgmlType::Q4_K, 2048)] {
        let Some(k4) = x4_kernel(ty) else {
            println!("{ty}: no x4 kernel on this CPU");
            continue;
        };
        let kp = quant::rows_kernel(ty, quant::KernelSet::Avx512).unwrap();
        let n_in: usize = std::env::var("PYLLAMA_BENCH_NIN").ok().and_then(|v| v.parse().ok()).unwrap_or(n_def);
        let wrow = ty.row_size(n_in).unwrap();
        let vdt = quant::vec_dot_type(ty);
        let x: Vec<f32> = (0..n_in).map(|i| ((i * 37) % 101) as f32 * 0.01 - 0.5).collect();
        let mut xq = vec![0u8; vdt.row_size(n_in).unwrap()];
        quant::quantize_act_fn(vdt, quant::KernelSet::Avx512).unwrap()(&x, &mut xq);
        let mut tn = Vec::new();
        x4_offsets(ty, n_in, xq.as_ptr(), 0, 1, &mut tn);
        let tn_addr = tn.as_ptr() as usize;
        for bytes in [mib << 20, 1 << 20] {
            let n_out = (bytes / wrow / 8 * 8).max(8);
            let plain = random_weights(ty, n_in, n_out);
            let mut packed = vec![0u8; plain.len()];
            repack_x4(ty, n_in, &plain, &mut packed).unwrap();
            let (wp, w4) = (Mapped::from_slice(&plain, huge), Mapped::from_slice(&packed, huge));
            let outs: Vec<std::sync::Mutex<Vec<f32>>> = (0..2).map(|_| std::sync::Mutex::new(vec![0f32; n_out])).collect();
            let mut g = [[0f64; 2]; 2];
            let mut check = [0u64; 2];
            for k in [0usize, 1, 0, 1] {
                let w = if k == 0 { &wp } else { &w4 };
                let wa = w.as_ref().as_ptr() as usize;
                for (t, pool) in pools.iter().enumerate() {
                    // the rows split in whole groups of 4, as a matmul over the x4 layout must
                    let (wall, _) = per_part_cpu(pool, 12, &|ith, nth| {
                        let r = split_range(n_out / 4, ith, nth);
                        let mut o = outs[ith].lock().unwrap();
                        let wr = unsafe { (wa as *const u8).add(4 * r.start * wrow) };
                        if k == 0 {
                            unsafe { kp(n_in, wr, wrow, 4 * r.len(), xq.as_ptr(), std::ptr::null(), o.as_mut_ptr()) };
                        } else {
                            unsafe { k4(n_in, wr, wrow, 4 * r.len(), xq.as_ptr(), 0, std::ptr::null(), 0, tn_addr as *const i32, 1, o.as_mut_ptr(), 0) };
                        }
                    });
                    g[k][t] = (n_out * wrow) as f64 / wall / 1e9;
                }
                check[k] = outs[0].lock().unwrap().iter().fold(0u64, |h, v| h.rotate_left(5) ^ v.to_bits() as u64);
            }
            assert_eq!(check[0], check[1], "{ty}: the x4 kernel's results differ from the plain kernel's");
            println!(
                "{:<6} {:>5} {:>5} MiB | {:>8.1} {:>8.1} | {:>8.1} {:>8.1}",
                ty.name(),
                n_in,
                (n_out * wrow) >> 20,
                g[0][0],
                g[1][0],
                g[0][1],
                g[1][1]
            );
        }
    }
}
