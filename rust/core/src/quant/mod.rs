//! Quantized block formats (pipeline step 13's inner loop): layout, dequantize, quantize
//! (activations / KV cache), vec_dot.
//!
//! Every SIMD kernel has a scalar `_ref` twin. The kernel set is chosen once per process
//! (`kernel_set()`): AVX-512 (F+BW+VL+VNNI) when the CPU has it, else AVX2+FMA+F16C, NEON on
//! aarch64, else the scalar references; `PYLLAMA_KERNELS=ref|avx2|avx512` forces one (tests
//! run all). The AVX-512 set has kernels for some formats only (`avx512.rs`) and uses the
//! AVX2 ones for the rest; its results are bit-identical to the AVX2 set's, and the NEON
//! kernels follow the same float order, so logits do not depend on the CPU.
//!
//! Data shapes: a "row" is `n` elements stored as `n / block_size` consecutive blocks of
//! `type_size` bytes (ggml's layout: the structs of `blocks.rs`).

/// `Tiled` (see `table.rs`) of a kernel `$f::<NC>` generic over its columns, with every
/// width from 1 to its tile width (8 or 4): the single-column kernel, the tile, and the
/// kernels over the tokens left after the tiles.
macro_rules! tiled {
    ($f:ident, 8) => {
        $crate::quant::table::Tiled {
            width: 8,
            cols: [
                None,
                Some($f::<1> as $crate::quant::DotN),
                Some($f::<2>),
                Some($f::<3>),
                Some($f::<4>),
                Some($f::<5>),
                Some($f::<6>),
                Some($f::<7>),
                Some($f::<8>),
            ],
        }
    };
    ($f:ident, 4) => {
        $crate::quant::table::Tiled {
            width: 4,
            cols: [None, Some($f::<1> as $crate::quant::DotN), Some($f::<2>), Some($f::<3>), Some($f::<4>), None, None, None, None],
        }
    };
}

/// A safe single-row vec_dot `$name` (a `VecDotFn`) over the raw single-column kernel
/// `$k::<1>` of weight type `$wty`: checks the slice lengths, then calls the kernel. The
/// invoking module's kernels must run on any CPU its kernel set is chosen for (the table
/// registers them only for that set).
macro_rules! safe_one {
    ($($name:ident, $k:ident, $wty:ident;)*) => {$(
        fn $name(n: usize, w: &[u8], x: &[u8]) -> f32 {
            let wb = GgmlType::$wty.row_size(n).expect("row length is a multiple of the block size");
            let xb = super::vec_dot_type(GgmlType::$wty).row_size(n).expect("row length is a multiple of the block size");
            assert!(w.len() >= wb && x.len() >= xb, "vec_dot: short row");
            let mut out = 0f32;
            // SAFETY: lengths checked above; the kernel table registers this module's
            // kernels only for a set this CPU runs (and every aarch64 CPU has NEON).
            unsafe { $k::<1>(n, w.as_ptr(), x.as_ptr(), 0, std::ptr::null(), 0, &mut out) };
            out
        }
    )*};
}

/// The registration of a SIMD module of the grid / ternary / MXFP4 kernels (`avx2_iq`,
/// `neon_iq`), over its `dot_iq2_xxs` ... `dot_tq2_0`, `dot_mxfp4`: `register_iq(t, cols)`
/// puts each type's kernels (TILE wide; with the 2..TILE - 1 column widths when `cols`) and
/// a safe single row into table `t`.
macro_rules! iq_dispatch {
    () => {
        iq_dispatch! {
            one_iq2_xxs, dot_iq2_xxs, IQ2_XXS;
            one_iq2_xs, dot_iq2_xs, IQ2_XS;
            one_iq2_s, dot_iq2_s, IQ2_S;
            one_iq3_xxs, dot_iq3_xxs, IQ3_XXS;
            one_iq3_s, dot_iq3_s, IQ3_S;
            one_iq1_s, dot_iq1_s, IQ1_S;
            one_iq1_m, dot_iq1_m, IQ1_M;
            one_tq1_0, dot_tq1_0, TQ1_0;
            one_tq2_0, dot_tq2_0, TQ2_0;
            one_mxfp4, dot_mxfp4, MXFP4;
        }
    };
    ($($one:ident, $k:ident, $wty:ident;)*) => {
        safe_one! { $($one, $k, $wty;)* }

        /// This module's kernels in table `t` (`cols`: also the kernels over 2..TILE - 1
        /// columns).
        pub(crate) fn register_iq(t: &mut super::table::KernelTable, cols: bool) {
            $(
                let mut tl = tiled!($k, 4);
                if !cols {
                    tl = super::table::Tiled::pair(tl.one(), tl.many(), tl.width);
                }
                t.set_tiled(GgmlType::$wty, tl, $one);
            )*
        }
    };
}

pub mod blocks;
pub mod cpu;
pub mod fp;
pub mod iq_grids;
pub mod iquants;
pub mod kquants;
pub mod legacy;
pub mod lowbit;
pub mod float;
pub mod repack;
pub mod table;
#[cfg(target_arch = "x86_64")]
pub mod avx2;
#[cfg(target_arch = "aarch64")]
pub mod neon;
#[cfg(target_arch = "aarch64")]
pub mod neon_iq;
#[cfg(target_arch = "x86_64")]
pub mod avx512;
#[cfg(target_arch = "x86_64")]
pub mod avx2_iq;
#[cfg(target_arch = "x86_64")]
pub mod avx2_rb;

use crate::error::{Error, Result};
use crate::ggml_type::GgmlType;
use std::sync::OnceLock;

/// `dot(w_row, x_row)` over `n` elements; `x` is already in `vec_dot_type(w type)`.
pub type VecDotFn = fn(n: usize, w: &[u8], x: &[u8]) -> f32;
/// Quantize one activation row of f32 into the vec_dot type.
pub type QuantizeFn = fn(src: &[f32], dst: &mut [u8]);
/// Decode one row into f32 (`dst.len()` elements from exactly their bytes).
pub type DequantFn = fn(src: &[u8], dst: &mut [f32]);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelSet {
    Ref,
    Avx2,
    /// aarch64 NEON (+ dotprod where present); see `neon.rs`.
    Neon,
    /// AVX-512 kernels where `avx512.rs` has them, AVX2 for the other formats.
    Avx512,
    /// The AVX-512 set without VNNI (Skylake-X, Skylake-SP): the zmm attention
    /// and float kernels, the zmm prefill kernels whose `vpdpbusd` operands cannot saturate
    /// `maddubs` (which replaces it), AVX2 for the rest.
    Avx512Bw,
}

impl KernelSet {
    pub fn name(self) -> &'static str {
        match self {
            KernelSet::Ref => "ref",
            KernelSet::Avx2 => "avx2",
            KernelSet::Neon => "neon",
            KernelSet::Avx512 => "avx512",
            KernelSet::Avx512Bw => "avx512bw",
        }
    }

    /// Whether this set runs the zmm kernels (with or without VNNI).
    pub fn is_avx512(self) -> bool {
        matches!(self, KernelSet::Avx512 | KernelSet::Avx512Bw)
    }

    /// Whether this set runs the x86 SIMD kernels (AVX2, or AVX-512 on top of them).
    pub fn is_simd(self) -> bool {
        self != KernelSet::Ref
    }
}

/// Whether the AVX-512 kernels can run on this CPU (AVX-512 F, BW, VL and VNNI, plus AVX2).
pub fn avx512_available() -> bool {
    cfg!(target_arch = "x86_64") && cpu::features().avx512_set()
}

/// Whether the AVX-512 set without VNNI can run on this CPU (AVX-512 F, BW, VL and DQ, plus
/// AVX2).
pub fn avx512bw_available() -> bool {
    cfg!(target_arch = "x86_64") && cpu::features().avx512bw_set()
}

/// Whether the AVX2 kernels can run on this CPU (AVX2, FMA and F16C).
pub fn avx2_available() -> bool {
    cfg!(target_arch = "x86_64") && cpu::features().avx2_set()
}

/// Whether the NEON kernels can run: every aarch64 CPU has NEON (Advanced SIMD).
pub fn neon_available() -> bool {
    cfg!(target_arch = "aarch64")
}

/// The CPU features the kernel choice depends on, as (name, detected) in a fixed order:
/// what `pyllama info` and `llama_print_system_info` report.
pub fn cpu_features() -> Vec<(&'static str, bool)> {
    cpu::features().list()
}

/// Whether the AVX2 set also runs its AVX-VNNI builds (false off x86-64).
pub fn avx2_vnni_in_use() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2::vnni_available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The kernel set used by `vec_dot`, `quantize_row_act` and the matmul: decided once.
/// `PYLLAMA_KERNELS=ref` forces the scalar kernels, `avx2` the AVX2 ones (also without
/// AVX-VNNI), `avx2vnni` the AVX2 ones with AVX-VNNI where the CPU has it, `avx512` the
/// AVX-512 ones, `avx512bw` the AVX-512 ones without VNNI; a set the CPU cannot run falls
/// back to the best it can.
pub fn kernel_set() -> KernelSet {
    static SET: OnceLock<KernelSet> = OnceLock::new();
    *SET.get_or_init(|| match cpu::env().kernels {
        cpu::Forced::Ref => KernelSet::Ref,
        // "avx2vnni": the AVX2 set with its AVX-VNNI builds (what an AVX2 + AVX-VNNI CPU
        // without AVX-512 runs); "avx2" also turns those off (see avx2::vnni_available)
        cpu::Forced::Avx2 | cpu::Forced::Avx2Vnni if avx2_available() => KernelSet::Avx2,
        cpu::Forced::Avx512Bw if avx512bw_available() => KernelSet::Avx512Bw,
        _ if avx512_available() => KernelSet::Avx512,
        _ if avx512bw_available() => KernelSet::Avx512Bw,
        _ if avx2_available() => KernelSet::Avx2,
        _ if neon_available() => KernelSet::Neon,
        _ => KernelSet::Ref,
    })
}

fn unsupported(ty: GgmlType, what: &str) -> Error {
    Error::Unsupported(format!("unsupported tensor type {ty} ({what})"))
}

/// Bytes of a row of `n` elements of `ty`, or an error naming the type and length.
pub fn row_bytes(ty: GgmlType, n: usize) -> Result<usize> {
    ty.row_size(n).ok_or_else(|| {
        Error::Invalid(format!("row length {n} is not a multiple of the {ty} block size {}", ty.block_size()))
    })
}

fn check_lengths(ty: GgmlType, n: usize, bytes: usize) -> Result<()> {
    let want = row_bytes(ty, n)?;
    if bytes != want {
        return Err(Error::Invalid(format!("{ty}: {n} elements need {want} bytes, got {bytes}")));
    }
    Ok(())
}

/// Decode one row: `dst.len()` elements from `src` (exactly their bytes). Bit-identical to
/// ggml's dequantize_row_* and gguf-py's `gguf.quants.dequantize`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    let f = table::kernels().get(ty).dequant.ok_or_else(|| unsupported(ty, "no dequantize kernel"))?;
    check_lengths(ty, dst.len(), src.len())?;
    f(src, dst);
    Ok(())
}

/// The scalar dequantizer of `ty` (every type has one).
pub fn dequantize_fn_ref(ty: GgmlType) -> Option<DequantFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => float::dequantize_f32,
        F16 => float::dequantize_f16,
        BF16 => float::dequantize_bf16,
        Q4_0 => legacy::dequantize_q4_0,
        Q4_1 => legacy::dequantize_q4_1,
        Q5_0 => legacy::dequantize_q5_0,
        Q5_1 => legacy::dequantize_q5_1,
        Q8_0 => legacy::dequantize_q8_0,
        Q8_1 => legacy::dequantize_q8_1,
        IQ4_NL => legacy::dequantize_iq4_nl,
        Q2_K => kquants::dequantize_q2_k,
        Q3_K => kquants::dequantize_q3_k,
        Q4_K => kquants::dequantize_q4_k,
        Q5_K => kquants::dequantize_q5_k,
        Q6_K => kquants::dequantize_q6_k,
        Q8_K => kquants::dequantize_q8_k,
        IQ4_XS => kquants::dequantize_iq4_xs,
        IQ2_XXS => iquants::dequantize_iq2_xxs,
        IQ2_XS => iquants::dequantize_iq2_xs,
        IQ2_S => iquants::dequantize_iq2_s,
        IQ3_XXS => iquants::dequantize_iq3_xxs,
        IQ3_S => iquants::dequantize_iq3_s,
        IQ1_S => iquants::dequantize_iq1_s,
        IQ1_M => iquants::dequantize_iq1_m,
        TQ1_0 => iquants::dequantize_tq1_0,
        TQ2_0 => iquants::dequantize_tq2_0,
        MXFP4 => iquants::dequantize_mxfp4,
        NVFP4 => lowbit::dequantize_nvfp4,
        Q1_0 => lowbit::dequantize_q1_0,
        Q2_0 => lowbit::dequantize_q2_0,
        F64 => float::dequantize_f64,
        I8 => float::dequantize_i8,
        I16 => float::dequantize_i16,
        I32 => float::dequantize_i32,
        I64 => float::dequantize_i64,
    })
}

/// ggml's reference quantizer (`quantize_row_*_ref`) for `ty`, if pyllama has one.
pub fn quantize_fn_ref(ty: GgmlType) -> Option<QuantizeFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => float::quantize_f32,
        F16 => float::quantize_f16,
        BF16 => float::quantize_bf16,
        Q4_0 => legacy::quantize_q4_0,
        Q4_1 => legacy::quantize_q4_1,
        Q5_0 => legacy::quantize_q5_0,
        Q5_1 => legacy::quantize_q5_1,
        Q8_0 => legacy::quantize_q8_0,
        Q8_1 => legacy::quantize_q8_1,
        IQ4_NL => legacy::quantize_iq4_nl,
        Q8_K => kquants::quantize_q8_k,
        Q1_0 => lowbit::quantize_q1_0,
        Q2_0 => lowbit::quantize_q2_0,
        NVFP4 => lowbit::quantize_nvfp4,
        _ => return None,
    })
}

/// Quantize one row with ggml's reference quantizer (`quantize_row_*_ref`): bit-identical
/// to it, and to `gguf.quants.quantize` for the types gguf-py implements. For activation
/// and KV-cache types: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, IQ4_NL, Q8_K.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let f = quantize_fn_ref(ty).ok_or_else(|| unsupported(ty, "no quantize kernel"))?;
    check_lengths(ty, src.len(), dst.len())?;
    f(src, dst);
    Ok(())
}

/// ggml-cpu's `from_float` for `ty` (its type_traits_cpu entry): what `ggml_set_rows` and
/// `ggml_cpy` use to write KV cache rows, and what flash attention converts Q with. That is
/// the reference quantizer (`quantize_row_*_ref`) for every type but Q8_0 / Q8_1, whose
/// CPU `quantize_row_q8_0/1` is the x86 one (127/amax, round half to even; see
/// `quantize_act_fn`), and F16 / BF16, whose conversions round to nearest even as the
/// reference ones do.
pub fn quantize_row_cpu(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    match ty {
        GgmlType::Q8_0 | GgmlType::Q8_1 => quantize_row_act(ty, src, dst),
        _ => quantize_row(ty, src, dst),
    }
}

/// The activation quantizer the matmul uses for vec_dot type `ty`: llama.cpp's x86 one
/// (for Q8_0/Q8_1: inverse scale 127/amax, round half to even; others as `quantize_row`).
/// Scalar and SIMD versions give identical bytes.
pub fn quantize_act_fn(ty: GgmlType, set: KernelSet) -> Option<QuantizeFn> {
    table::table(set).get(ty).quantize_act
}

/// The scalar activation quantizer into `ty` (`quantize_act_fn` of the reference set).
pub fn quantize_act_fn_ref(ty: GgmlType) -> Option<QuantizeFn> {
    use GgmlType::*;
    Some(match ty {
        Q8_0 => legacy::quantize_q8_0_x86,
        Q8_1 => legacy::quantize_q8_1_x86,
        _ => return quantize_fn_ref(ty),
    })
}

/// Quantize an activation row the way the matmul does (see `quantize_act_fn`).
pub fn quantize_row_act(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    let f = quantize_act_fn(ty, kernel_set()).ok_or_else(|| unsupported(ty, "no activation quantizer"))?;
    check_lengths(ty, src.len(), dst.len())?;
    f(src, dst);
    Ok(())
}

/// The activation format a weight type is multiplied with (as ggml pairs them).
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 | NVFP4 | Q1_0 | Q2_0 => Q8_0,
        Q4_1 | Q5_1 | Q8_1 => Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ4_XS => Q8_K,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M | TQ1_0 | TQ2_0 => Q8_K,
        F16 => F16,
        BF16 => BF16,
        _ => F32,
    }
}

/// The scalar reference vec_dot of weight type `ty`.
pub fn vec_dot_fn_ref(ty: GgmlType) -> Option<VecDotFn> {
    use GgmlType::*;
    Some(match ty {
        F32 => float::vec_dot_f32_ref,
        F16 => float::vec_dot_f16_ref,
        BF16 => float::vec_dot_bf16_ref,
        Q4_0 => legacy::vec_dot_q4_0_q8_0_ref,
        Q4_1 => legacy::vec_dot_q4_1_q8_1_ref,
        Q5_0 => legacy::vec_dot_q5_0_q8_0_ref,
        Q5_1 => legacy::vec_dot_q5_1_q8_1_ref,
        Q8_0 => legacy::vec_dot_q8_0_q8_0_ref,
        Q8_1 => legacy::vec_dot_q8_1_q8_1_ref,
        IQ4_NL => legacy::vec_dot_iq4_nl_q8_0_ref,
        Q2_K => kquants::vec_dot_q2_k_q8_k_ref,
        Q3_K => kquants::vec_dot_q3_k_q8_k_ref,
        Q4_K => kquants::vec_dot_q4_k_q8_k_ref,
        Q5_K => kquants::vec_dot_q5_k_q8_k_ref,
        Q6_K => kquants::vec_dot_q6_k_q8_k_ref,
        Q8_K => kquants::vec_dot_q8_k_q8_k_ref,
        IQ4_XS => kquants::vec_dot_iq4_xs_q8_k_ref,
        IQ2_XXS => iquants::vec_dot_iq2_xxs_q8_k_ref,
        IQ2_XS => iquants::vec_dot_iq2_xs_q8_k_ref,
        IQ2_S => iquants::vec_dot_iq2_s_q8_k_ref,
        IQ3_XXS => iquants::vec_dot_iq3_xxs_q8_k_ref,
        IQ3_S => iquants::vec_dot_iq3_s_q8_k_ref,
        IQ1_S => iquants::vec_dot_iq1_s_q8_k_ref,
        IQ1_M => iquants::vec_dot_iq1_m_q8_k_ref,
        TQ1_0 => iquants::vec_dot_tq1_0_q8_k_ref,
        TQ2_0 => iquants::vec_dot_tq2_0_q8_k_ref,
        MXFP4 => iquants::vec_dot_mxfp4_q8_0_ref,
        NVFP4 => lowbit::vec_dot_nvfp4_q8_0_ref,
        Q1_0 => lowbit::vec_dot_q1_0_q8_0_ref,
        Q2_0 => lowbit::vec_dot_q2_0_q8_0_ref,
        _ => return None,
    })
}

/// The scalar vec_dot of weight type `ty` in pyllama's x86 SIMD float order
/// (`iquants::*_x86`: llama.cpp's tiled order for the grid types, its AVX2 vec_dot order for
/// TQ1_0 / TQ2_0 / MXFP4) for the types of `iquants.rs`: what the AVX2 kernels compute bit
/// for bit, and what aarch64 runs for them (so its logits equal x86's).
pub fn vec_dot_fn_x86_order(ty: GgmlType) -> Option<VecDotFn> {
    use GgmlType::*;
    Some(match ty {
        IQ2_XXS => iquants::vec_dot_iq2_xxs_q8_k_x86,
        IQ2_XS => iquants::vec_dot_iq2_xs_q8_k_x86,
        IQ2_S => iquants::vec_dot_iq2_s_q8_k_x86,
        IQ3_XXS => iquants::vec_dot_iq3_xxs_q8_k_x86,
        IQ3_S => iquants::vec_dot_iq3_s_q8_k_x86,
        IQ1_S => iquants::vec_dot_iq1_s_q8_k_x86,
        IQ1_M => iquants::vec_dot_iq1_m_q8_k_x86,
        TQ1_0 => iquants::vec_dot_tq1_0_q8_k_x86,
        TQ2_0 => iquants::vec_dot_tq2_0_q8_k_x86,
        MXFP4 => iquants::vec_dot_mxfp4_q8_0_x86,
        NVFP4 => lowbit::vec_dot_nvfp4_q8_0_x86,
        Q1_0 => lowbit::vec_dot_q1_0_q8_0_x86,
        Q2_0 => lowbit::vec_dot_q2_0_q8_0_x86,
        _ => return None,
    })
}

/// The vec_dot of weight type `ty` in kernel set `set` (falls back to `_ref` where no SIMD
/// version exists): its kernel table's entry.
pub fn vec_dot_fn(ty: GgmlType, set: KernelSet) -> Option<VecDotFn> {
    table::table(set).get(ty).vec_dot
}

/// Raw kernel over activation rows: out[c] = dot(w, x + c * xs) for c in 0..NC; w and every
/// x row hold `n` elements. `xd`: null, or precomputed f32 activation block scales for the
/// Q8_0/Q8_1 activations (Q8_0: d per block; Q8_1: (d, s) per block), column c's at
/// `xd + c * xds`. The matmul converts them once per token instead of once per (weight row,
/// block): same values (the f16 -> f32 conversion is exact), so the results are
/// bit-identical either way.
pub type DotN = unsafe fn(n: usize, w: *const u8, x: *const u8, xs: usize, xd: *const f32, xds: usize, out: *mut f32);

/// One activation row (token) against `nrows` consecutive weight rows `ws` bytes apart:
/// out[r] = dot(w + r * ws, x) for r in 0..nrows. `xd`: null, or the f32 activation block
/// scales as in `DotN`.
pub type DotRows = unsafe fn(n: usize, w: *const u8, ws: usize, nrows: usize, x: *const u8, xd: *const f32, out: *mut f32);

/// A packed tile kernel: out[c] = dot(w, column c) for the columns of one packed group
/// `xp` (nb blocks), `nb` 32-element blocks (see `avx2::pack_q8_0_cols`).
pub type PackedDot = unsafe fn(nb: usize, w: *const u8, xp: *const u8, out: *mut f32);

/// A packed-group kernel over two weight rows (the AVX-512 set, `avx2_rb`): `PackedDot` for
/// rows `wa` and `wb` at once, column c's values to `outa[c * ld]` and `outb[c * ld]` (a
/// matmul's output rows: straight into its token-major output).
pub type PackedPairDot = unsafe fn(nb: usize, wa: *const u8, wb: *const u8, xp: *const u8, outa: *mut f32, outb: *mut f32, ld: usize);

/// The AVX-512 set's prefill kernel over P = 2 (or 1) weight row pairs decoded interleaved
/// (`avx2_rb::quad_signed`): the pairs' decoded bytes at `w0` and `w1` (unused for P = 1),
/// a packed group `xp`; column c's values of rows 0..2P to `out[c * ld + 0..2P]`.
pub type PackedQuadDot = unsafe fn(nb: usize, w0: *const u8, w1: *const u8, xp: *const u8, out: *mut f32, ld: usize);

/// A row-block kernel (`avx2_rb`): for the NC activation rows (Q8_K, `x + c * xs`) and the
/// `table::RowBlock::rows` weight rows repacked at `wp` (`nsb` super-blocks),
/// out[c * ldo + r] = dot(row r, column c).
pub type RbKernel = unsafe fn(nsb: usize, wp: *const u8, x: *const u8, xs: usize, out: *mut f32, ldo: usize);
/// Repacks a row block's weight rows (`w`, `wrow` bytes apart, `nsb` super-blocks each)
/// into `dst`.
pub type RepackFn = unsafe fn(nsb: usize, w: *const u8, wrow: usize, dst: *mut u8);

/// The prefill tile width of every SIMD kernel set: activation rows per pass over a weight row.
pub const TILE: usize = 4;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(avx2::TILE == TILE);

/// (single-column, tile, tile width) raw kernels of weight type `ty` in kernel set `set` for
/// a matmul over `n_tokens` activation rows, if that set has a SIMD version (the matmul's
/// tiled path; `None`: use the safe per-element `vec_dot_fn`): see `table::TypeKernels`.
pub fn tiled_kernels(set: KernelSet, ty: GgmlType, n_tokens: usize) -> Option<(DotN, DotN, usize)> {
    table::table(set).get(ty).tiled_for(n_tokens).map(|t| (t.one(), t.many(), t.width))
}

/// The kernel over `nc` activation rows at once (1 < nc < the tile width of
/// `tiled_kernels(set, ty, n_tokens)`) of weight type `ty` in kernel set `set`, if there is
/// one: the same set's tile code at width nc, so every column equals the single-column
/// kernel bit for bit. The matmul runs it on the tokens left over after the tiles (the
/// whole batch when several sequences decode one token each), decoding each weight block
/// once for all of them. NEON has none (the single-column kernel per token).
pub fn cols_kernel(set: KernelSet, ty: GgmlType, n_tokens: usize, nc: usize) -> Option<DotN> {
    table::table(set).get(ty).tiled_for(n_tokens).and_then(|t| t.mid(nc))
}

/// The packed kernel (see `avx2::packed_kernel_cols`) of weight type `ty` for the first
/// `nc` columns of a packed group, in the build kernel set `set` runs: the AVX-512 set the
/// AVX-512 VNNI (EVEX) build, the AVX2 set its AVX-VNNI build where `avx2::vnni_available`,
/// else the plain one. All builds give the same bits. None: no packed kernel (also under
/// `PYLLAMA_NO_COLS` for nc < PACK_COLS, which then leaves the packed path to full groups).
pub fn packed_kernel(set: KernelSet, ty: GgmlType, nc: usize) -> Option<PackedDot> {
    table::table(set).get(ty).packed.and_then(|p| p.cols.get(nc).copied().flatten())
}

/// The widest tile any set uses (the matmul's per-tile output buffer).
pub const MAX_TILE: usize = 8;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(avx2::WIDE_TILE <= MAX_TILE);

/// The single-token kernel over several weight rows (see `DotRows`) of weight type `ty` in
/// kernel set `set`, if there is one (not under `PYLLAMA_NO_ROWS`); the matmul uses it when
/// n_tokens == 1.
pub fn rows_kernel(ty: GgmlType, set: KernelSet) -> Option<DotRows> {
    table::table(set).get(ty).rows
}

/// `dot(w, x)` over `n` elements, `w` a row of `ty`, `x` a row of `vec_dot_type(ty)`.
/// Panics (never reads out of bounds) when a slice is shorter than `n` elements need;
/// unsupported types return NaN (loading rejects them long before).
pub fn vec_dot(ty: GgmlType, n: usize, w: &[u8], x: &[u8]) -> f32 {
    let (Some(wb), Some(xb)) = (ty.row_size(n), vec_dot_type(ty).row_size(n)) else {
        panic!("vec_dot: {n} is not a multiple of the {ty} block size");
    };
    assert!(w.len() >= wb && x.len() >= xb, "vec_dot: short row for {ty} x {n}");
    match vec_dot_fn(ty, kernel_set()) {
        Some(f) => f(n, &w[..wb], &x[..xb]),
        None => f32::NAN,
    }
}

#[cfg(test)]
mod tests;
