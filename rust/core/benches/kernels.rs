//! Kernel benchmark (not a test): `cargo bench -p pyllama-core --bench kernels [-- MODE]`.
//! Modes: (none) full table, `quick` shorter timings, `roof` best-case per-core kernel
//! speed with the weights in cache, `pool` thread-pool cost per parallel region.
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
use pyllama_core::ops::matmul::matmul;
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
    let mut v: Vec<u8> = (0..bytes).map(|_| (rng.next() >> 32) as u8).collect();
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
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
/// per-core speed). Returns GB/s of weights for the 1-column and 4-column kernels.
fn kernel_roof(ty: GgmlType) -> Option<(f64, f64)> {
    #[cfg(target_arch = "x86_64")]
    {
        if quant::kernel_set() != quant::KernelSet::Avx2 {
            return None;
        }
        let (one, many) = quant::avx2::dot_kernels(ty)?; // VNNI builds where the CPU has them
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
        let mut best = [f64::INFINITY; 2];
        let mut out = [0f32; 4];
        for _ in 0..300 {
            let t0 = Instant::now();
            for r in 0..rows {
                unsafe { one(n, w.as_ptr().add(r * wrow), xq.as_ptr(), xrow, std::ptr::null(), 0, out.as_mut_ptr()) };
            }
            best[0] = best[0].min(t0.elapsed().as_secs_f64());
            let t0 = Instant::now();
            for r in 0..rows {
                unsafe { many(n, w.as_ptr().add(r * wrow), xq.as_ptr(), xrow, std::ptr::null(), 0, out.as_mut_ptr()) };
            }
            best[1] = best[1].min(t0.elapsed().as_secs_f64());
            black_box(out);
        }
        // the 4-column kernel does 4x the work per weight byte: report weight-equivalent GB/s
        Some((w.len() as f64 / best[0] / 1e9, 4.0 * w.len() as f64 / best[1] / 1e9))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = ty;
        None
    }
}

fn main() {
    if std::env::args().any(|a| a == "pool") {
        // Per-region overhead of the thread pool: back-to-back empty regions (a decode step
        // makes ~200 of them per token), median of 20 rounds of 2000.
        for n in [1usize, 2] {
            let pool = ThreadPool::new(n);
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
            println!("pool of {n}: {:.2} us per empty region (median), {:.2} us (best)", v[10] * 1e6, v[0] * 1e6);
        }
        return;
    }
    if std::env::args().any(|a| a == "roof") {
        println!("best-case kernel speed (weights in cache), GB/s of weights: 1 column, 4 columns (x4 work)");
        for ty in [
            GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::IQ4_NL,
            GgmlType::Q2_K, GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::IQ4_XS,
            GgmlType::F16, GgmlType::BF16, GgmlType::F32,
        ] {
            if let Some((a, b)) = kernel_roof(ty) {
                println!("{:<7} {:>8.1} {:>8.1}", ty.name(), a, b);
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
        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w };
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
        let tv = TensorView { name: "w", ty, ne: [n_in, n_out, 1, 1], data: &w };
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
