//! The one CPU-feature probe (and cache-size probe) and the one reader of the kernel
//! environment variables.
//!
//! Everything that picks a kernel by what the CPU has (`kernel_set`, the kernel table, the
//! VNNI / dotprod builds, ggml's FMA-contracted scalar code) asks `features()`; everything
//! that honours `PYLLAMA_KERNELS`, `PYLLAMA_ORDER`, `PYLLAMA_NO_COLS`, `PYLLAMA_NO_ROWS` or
//! `PYLLAMA_NO_SGEMM` asks `env()`. Both are read once per process, so a kernel choice never
//! changes while a process runs (the determinism of the matmul rests on it).

use std::sync::OnceLock;

/// What the CPU has, probed once (`features()`). Off x86-64 the x86 fields are false; off
/// aarch64 the aarch64 ones.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuFeatures {
    pub sse3: bool,
    pub ssse3: bool,
    pub avx: bool,
    pub avx2: bool,
    pub fma: bool,
    pub f16c: bool,
    pub avxvnni: bool,
    pub avx512f: bool,
    pub avx512bw: bool,
    pub avx512vl: bool,
    pub avx512dq: bool,
    pub avx512vnni: bool,
    pub avx512bf16: bool,
    pub neon: bool,
    pub dotprod: bool,
    pub fp16: bool,
    /// An AMD (or Hygon) x86 CPU, by CPUID's vendor string: where an instruction's form
    /// measured differently on AMD and Intel, kernels pick the form by it (the f16 store of
    /// the AVX2 attention's V accumulation).
    pub amd: bool,
}

impl CpuFeatures {
    fn probe() -> CpuFeatures {
        #[allow(unused_mut)]
        let mut f = CpuFeatures::default();
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            f.sse3 = has!("sse3");
            f.ssse3 = has!("ssse3");
            f.avx = has!("avx");
            f.avx2 = has!("avx2");
            f.fma = has!("fma");
            f.f16c = has!("f16c");
            f.avxvnni = has!("avxvnni");
            f.avx512f = has!("avx512f");
            f.avx512bw = has!("avx512bw");
            f.avx512vl = has!("avx512vl");
            f.avx512dq = has!("avx512dq");
            f.avx512vnni = has!("avx512vnni");
            f.avx512bf16 = has!("avx512bf16");
            // (unsafe before Rust 1.87, safe since: CPUID leaf 0 exists on every x86-64 CPU)
            #[allow(unused_unsafe)]
            let v = unsafe { std::arch::x86_64::__cpuid(0) };
            let vendor: Vec<u8> = [v.ebx, v.edx, v.ecx].iter().flat_map(|r| r.to_le_bytes()).collect();
            f.amd = vendor == b"AuthenticAMD" || vendor == b"HygonGenuine";
        }
        #[cfg(target_arch = "aarch64")]
        {
            use std::arch::is_aarch64_feature_detected as has;
            f.neon = true;
            f.dotprod = has!("dotprod");
            f.fp16 = has!("fp16");
        }
        f
    }

    /// AVX2 + FMA + F16C: what the AVX2 kernel set needs.
    pub fn avx2_set(&self) -> bool {
        self.avx2 && self.fma && self.f16c
    }

    /// AVX-512 F, BW, VL and VNNI on top of the AVX2 set: what the AVX-512 kernel set needs.
    pub fn avx512_set(&self) -> bool {
        self.avx512bw_set() && self.avx512vnni
    }

    /// AVX-512 F, BW, VL and DQ on top of the AVX2 set, VNNI or not: what the AVX-512 set
    /// without its VNNI kernels needs (`KernelSet::Avx512Bw`: Skylake-X / Skylake-SP).
    pub fn avx512bw_set(&self) -> bool {
        self.avx512f && self.avx512bw && self.avx512vl && self.avx512dq && self.avx2_set()
    }

    /// AVX2 + FMA: ggml's x86 vector expf and the FMA-contracted scalar code it compiles to.
    pub fn avx2_fma(&self) -> bool {
        self.avx2 && self.fma
    }

    /// (name, detected) in a fixed order: what `pyllama info` and `llama_print_system_info`
    /// report.
    pub fn list(&self) -> Vec<(&'static str, bool)> {
        if cfg!(target_arch = "x86_64") {
            vec![
                ("sse3", self.sse3),
                ("ssse3", self.ssse3),
                ("avx", self.avx),
                ("avx2", self.avx2),
                ("fma", self.fma),
                ("f16c", self.f16c),
                ("avxvnni", self.avxvnni),
                ("avx512f", self.avx512f),
                ("avx512bw", self.avx512bw),
                ("avx512vl", self.avx512vl),
                ("avx512dq", self.avx512dq),
                ("avx512vnni", self.avx512vnni),
                ("avx512bf16", self.avx512bf16),
            ]
        } else if cfg!(target_arch = "aarch64") {
            vec![("neon", self.neon), ("dotprod", self.dotprod), ("fp16", self.fp16)]
        } else {
            Vec::new()
        }
    }
}

/// The CPU's features, probed on first use.
pub fn features() -> &'static CpuFeatures {
    static F: OnceLock<CpuFeatures> = OnceLock::new();
    F.get_or_init(CpuFeatures::probe)
}

/// The size of cpu0's level-2 data (or unified) cache, from Linux's sysfs, read on first use
/// (None where sysfs does not say).
pub fn l2_bytes() -> Option<usize> {
    static L2: OnceLock<Option<usize>> = OnceLock::new();
    *L2.get_or_init(probe_l2_bytes)
}

fn probe_l2_bytes() -> Option<usize> {
    for k in 0..8 {
        let dir = format!("/sys/devices/system/cpu/cpu0/cache/index{k}");
        let read = |f: &str| std::fs::read_to_string(format!("{dir}/{f}")).ok().map(|s| s.trim().to_string());
        let Some(level) = read("level") else { break };
        if level != "2" || read("type").is_some_and(|t| t == "Instruction") {
            continue;
        }
        let size = read("size")?;
        let (num, mult) = match size.strip_suffix('K') {
            Some(n) => (n, 1 << 10),
            None => match size.strip_suffix('M') {
                Some(n) => (n, 1 << 20),
                None => (size.as_str(), 1),
            },
        };
        return num.parse::<usize>().ok().map(|n| n * mult).filter(|&b| b > 0);
    }
    None
}

/// `PYLLAMA_KERNELS`: which kernel set was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forced {
    /// Unset or empty: the best set the CPU runs.
    Auto,
    Ref,
    /// `avx2`: the AVX2 set without its AVX-VNNI builds.
    Avx2,
    /// `avx2vnni`: the AVX2 set with its AVX-VNNI builds where the CPU has AVX-VNNI.
    Avx2Vnni,
    Avx512,
    /// `avx512bw`: the AVX-512 set without its VNNI kernels (what Skylake-X runs).
    Avx512Bw,
    /// `neon`: the NEON set without its dotprod builds.
    Neon,
    /// A name pyllama has no set of: the best set the CPU runs (`pyllama info` says so).
    Unknown(String),
}

/// The kernel environment variables, read once (`env()`).
#[derive(Clone, Debug)]
pub struct KernelEnv {
    /// `PYLLAMA_KERNELS` (case-insensitive, surrounding blanks ignored).
    pub kernels: Forced,
    /// `PYLLAMA_ORDER=llamacpp`: llama.cpp's batch-dependent float orders (see
    /// `avx2::llamacpp_order`).
    pub llamacpp_order: bool,
    /// `PYLLAMA_NO_COLS=1`: no kernels over the 2..7 tokens left after the tiles.
    pub no_cols: bool,
    /// `PYLLAMA_NO_ROWS=1`: single-token matmuls without the multi-row kernels.
    pub no_rows: bool,
    /// `PYLLAMA_NO_SGEMM=1`: F32/F16 weights without the tinyBLAS-order tiles.
    pub no_sgemm: bool,
    /// `PYLLAMA_NO_RB=1`: K-quant prefill without the row-block kernels, the AVX-512
    /// prefill without the two-row packed kernels, and the plain AVX2 prefill of Q4_0 /
    /// Q5_0 / Q4_1 / Q5_1 without the column-lane kernels (`avx2_rb`; the same bits either
    /// way, for comparisons).
    pub no_rb: bool,
    /// `PYLLAMA_NO_REPACK=1`: no x4 row-group layout at load (`quant::repack`; the same
    /// bits either way, for comparisons).
    pub no_repack: bool,
}

impl KernelEnv {
    /// Parse the variables from `get` (the process environment in `env()`; tests pass
    /// their own).
    pub fn parse(get: impl Fn(&str) -> Option<String>) -> KernelEnv {
        let flag = |k: &str| get(k).is_some_and(|v| v != "0");
        let kernels = match get("PYLLAMA_KERNELS").unwrap_or_default().trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Forced::Auto,
            "ref" => Forced::Ref,
            "avx2" => Forced::Avx2,
            "avx2vnni" => Forced::Avx2Vnni,
            "avx512" => Forced::Avx512,
            "avx512bw" => Forced::Avx512Bw,
            "neon" => Forced::Neon,
            other => Forced::Unknown(other.to_string()),
        };
        KernelEnv {
            kernels,
            llamacpp_order: get("PYLLAMA_ORDER").is_some_and(|v| v.trim().eq_ignore_ascii_case("llamacpp")),
            no_cols: flag("PYLLAMA_NO_COLS"),
            no_rows: flag("PYLLAMA_NO_ROWS"),
            no_sgemm: flag("PYLLAMA_NO_SGEMM"),
            no_rb: flag("PYLLAMA_NO_RB"),
            no_repack: flag("PYLLAMA_NO_REPACK"),
        }
    }
}

/// The kernel environment variables of this process, read on first use.
pub fn env() -> &'static KernelEnv {
    static E: OnceLock<KernelEnv> = OnceLock::new();
    E.get_or_init(|| KernelEnv::parse(|k| std::env::var(k).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(vars: &[(&str, &str)]) -> KernelEnv {
        KernelEnv::parse(|k| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string()))
    }

    #[test]
    fn kernel_env_is_parsed_case_insensitively_with_flags_off_at_zero() {
        assert_eq!(parse(&[]).kernels, Forced::Auto);
        assert_eq!(parse(&[("PYLLAMA_KERNELS", " REF ")]).kernels, Forced::Ref);
        assert_eq!(parse(&[("PYLLAMA_KERNELS", "Avx2")]).kernels, Forced::Avx2);
        assert_eq!(parse(&[("PYLLAMA_KERNELS", "avx2vnni")]).kernels, Forced::Avx2Vnni);
        assert_eq!(parse(&[("PYLLAMA_KERNELS", "AVX512BW")]).kernels, Forced::Avx512Bw);
        assert_eq!(parse(&[("PYLLAMA_KERNELS", "sse9")]).kernels, Forced::Unknown("sse9".into()));
        assert!(parse(&[("PYLLAMA_ORDER", "LlamaCpp")]).llamacpp_order);
        assert!(!parse(&[("PYLLAMA_ORDER", "pyllama")]).llamacpp_order);
        let e = parse(&[("PYLLAMA_NO_COLS", "1"), ("PYLLAMA_NO_ROWS", "0"), ("PYLLAMA_NO_SGEMM", "yes")]);
        assert!(e.no_cols && !e.no_rows && e.no_sgemm && !e.no_rb);
        assert!(parse(&[("PYLLAMA_NO_RB", "1")]).no_rb);
    }

    #[test]
    fn sets_need_their_features() {
        let f = features();
        assert!(!f.avx512_set() || f.avx512bw_set());
        assert!(!f.avx512bw_set() || f.avx2_set());
        assert!(!f.avx2_set() || f.avx2_fma());
        assert_eq!(f.list().iter().filter(|(_, v)| *v).count() > 0, f.avx2 || f.neon || f.sse3);
    }
}
