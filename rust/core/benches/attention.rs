//! Attention at depth (not a test): `cargo bench -p pyllama-core --bench attention`.
//!
//! One layer's flash attention over an F16 cache for a micro-batch of 512 tokens whose
//! cache already holds `depth` tokens (llama-bench's pp512 at -d 4096), and for one decode
//! token at depth 4096 (one thread's share of a 2-thread step), in the head shapes of SmolLM2
//! 135M (9 heads, 3 KV, dim 64) and Gemma 3 270M (4 heads, 1 KV, dim 256), on ONE thread:
//! the best CPU time of several repetitions, in ms per layer and in G query-key pairs per
//! second; then a whole decode step's attention at depth 4096 (every layer's own cache, so
//! the K and V rows stream from memory as in a real step), wall time on 1 and 2 threads,
//! with an F16 and a Q8_0 cache. `PYLLAMA_KERNELS=avx2|ref` picks the kernel set; `-- NAME`
//! runs only the shapes whose name contains NAME (`-- "smollm2 d4096"`), without the decode
//! steps, or with "step" in NAME only the decode steps whose line contains it (`-- "smollm2
//! q8_0 step"`).

use pyllama_core::ggml_type::GgmlType;
use pyllama_core::kv_cache::KvCache;
use pyllama_core::ops::attention::{attention, scratch_per_thread, AttnInputs, AttnParams};
use pyllama_core::threadpool::ThreadPool;

fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: plain syscall filling a local struct.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn main() {
    // (name, heads, KV heads, head dim, depth, tokens); the decode rows are one thread's
    // share of a 2-thread decode step (SmolLM2: a group of 3 heads; Gemma 3: 2 of its 4)
    let shapes: [(&str, usize, usize, usize, usize, usize); 10] = [
        ("smollm2 d0", 9, 3, 64, 0, 512),
        ("smollm2 d4096", 9, 3, 64, 4096, 512),
        ("gemma3 d0", 4, 1, 256, 0, 512),
        ("gemma3 d4096", 4, 1, 256, 4096, 512),
        ("smollm2 decode d4096", 3, 1, 64, 4096, 1),
        ("gemma3 decode d4096", 2, 1, 256, 4096, 1),
        // a short context (tg128 from an empty cache: 64 keys on average), one thread's
        // whole step: every head
        ("smollm2 decode d64", 9, 3, 64, 64, 1),
        ("gemma3 decode d64", 4, 1, 256, 64, 1),
        ("smollm2 decode d8", 9, 3, 64, 8, 1),
        ("gemma3 decode d8", 4, 1, 256, 8, 1),
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        ((seed >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    println!("kernel set: {}", pyllama_core::quant::kernel_set().name());
    // `-- NAME`: only the shapes whose name contains NAME (and no decode steps), for perf
    let only = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let steps_only = only.as_ref().is_some_and(|o| o.contains("step"));
    for (name, n_head, n_head_kv, hd, depth, n_tokens) in shapes {
        if steps_only || only.as_ref().is_some_and(|o| !name.contains(o.as_str())) {
            continue;
        }
        let size = (depth + n_tokens).div_ceil(256) * 256;
        let kw = n_head_kv * hd;
        let mut kv = KvCache::new(&[kw], &[kw], size, 1, 1, GgmlType::F16, GgmlType::F16).unwrap();
        kv.flash_attn = true;
        for buf in [&mut kv.k[0], &mut kv.v[0]] {
            for c in buf.chunks_exact_mut(2) {
                c.copy_from_slice(&half::f16::from_f32(rnd()).to_le_bytes());
            }
        }
        let n_keys = depth + n_tokens;
        let keys: Vec<(i32, u32)> = (0..n_keys).map(|p| (p as i32, p as u32)).collect();
        let pos: Vec<i32> = (depth..n_keys).map(|p| p as i32).collect();
        let stream = vec![0u32; n_tokens];
        let key_range = vec![(0u32, n_keys as u32); n_tokens];
        let inp = AttnInputs {
            pos: &pos,
            stream: &stream,
            key_range: &key_range,
            keys: &keys,
        };
        let p = AttnParams::causal(0, n_head, n_head_kv, hd);
        let q: Vec<f32> = (0..n_tokens * n_head * hd).map(|_| rnd() * 3.0).collect();
        let mut out = vec![0f32; n_tokens * n_head * hd];
        let pool = ThreadPool::new(1);
        let stride = scratch_per_thread(size, hd, hd);
        let mut scratch = vec![0f32; stride];
        let mut best = f64::INFINITY;
        // a decode step is short: the best of 5 means of 20 calls
        let calls = if n_tokens == 1 { 20 } else { 1 };
        for _ in 0..5 {
            let t0 = thread_cpu_seconds();
            for _ in 0..calls {
                attention(&pool, &kv, &p, &inp, &q, &mut out, &mut scratch, stride);
            }
            best = best.min((thread_cpu_seconds() - t0) / calls as f64);
        }
        std::hint::black_box(&out);
        let pairs = (depth * n_tokens + n_tokens * (n_tokens + 1) / 2) * n_head;
        println!(
            "{name:>20}: {:8.3} ms/layer  {:6.3} G q.k pairs/s",
            best * 1e3,
            pairs as f64 / best * 1e-9
        );
    }
    if only.is_none() || steps_only {
        decode_steps(&mut rnd, only.as_deref());
    }
}

/// A whole decode step's attention over a cache too big for any cache level: every layer
/// of the model (SmolLM2: 30 layers of 9 heads / 3 KV of dim 64; Gemma 3: 18 of 4 / 1 of
/// 256) at depth 4096, an F16 and a Q8_0 cache, and an F16 cache with flash attention off
/// (llama.cpp's mul_mat / soft_max / mul_mat), 1 and 2 threads, wall time per step (the best
/// mean of 5 x 10 steps). `only`: just the lines that contain it.
fn decode_steps(rnd: &mut impl FnMut() -> f32, only: Option<&str>) {
    let models = [("smollm2", 30usize, 9usize, 3usize, 64usize), ("gemma3", 18, 4, 1, 256)];
    for ((name, n_layer, n_head, n_head_kv, hd), ty, fa) in models.into_iter().flat_map(|m| [(m, GgmlType::F16, true), (m, GgmlType::Q8_0, true), (m, GgmlType::F16, false)]) {
        let label = format!("{name} {} cache{} decode step d4096", ty.name().to_lowercase(), if fa { "" } else { " -fa off" });
        if only.is_some_and(|o| !label.contains(o)) {
            continue;
        }
        let depth = 4096usize;
        let size = (depth + 1).div_ceil(256) * 256;
        let kw = n_head_kv * hd;
        let mut kv = KvCache::new(&vec![kw; n_layer], &vec![kw; n_layer], size, 1, 1, ty, ty).unwrap();
        kv.flash_attn = fa;
        let mut row = vec![0f32; kw];
        for il in 0..n_layer {
            let (rk, rv) = (kv.row_k[il], kv.row_v[il]);
            for (buf, rb) in [(&mut kv.k[il], rk), (&mut kv.v[il], rv)] {
                for r in buf.chunks_exact_mut(rb) {
                    row.iter_mut().for_each(|x| *x = rnd());
                    pyllama_core::quant::quantize_row(ty, &row, r).unwrap();
                }
            }
        }
        let keys: Vec<(i32, u32)> = (0..=depth).map(|p| (p as i32, p as u32)).collect();
        let (pos, stream, key_range) = ([depth as i32], [0u32], [(0u32, depth as u32 + 1)]);
        let inp = AttnInputs {
            pos: &pos,
            stream: &stream,
            key_range: &key_range,
            keys: &keys,
        };
        let q: Vec<f32> = (0..n_head * hd).map(|_| rnd() * 3.0).collect();
        let mut out = vec![0f32; n_head * hd];
        for threads in [1, 2] {
            let pool = ThreadPool::new(threads);
            let stride = scratch_per_thread(size, hd, hd);
            let mut scratch = vec![0f32; stride * threads];
            let mut best = f64::INFINITY;
            for _ in 0..5 {
                let t0 = std::time::Instant::now();
                for _ in 0..10 {
                    for il in 0..n_layer {
                        let p = AttnParams::causal(il, n_head, n_head_kv, hd);
                        attention(&pool, &kv, &p, &inp, &q, &mut out, &mut scratch, stride);
                    }
                }
                best = best.min(t0.elapsed().as_secs_f64() / 10.0);
            }
            std::hint::black_box(&out);
            println!("{label}, {n_layer} layers, {threads} thread(s): {:7.3} ms", best * 1e3);
        }
    }
}
