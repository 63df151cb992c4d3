//! The kernel table: for one kernel set, every weight type's kernels, built once at start-up
//! (`table(set)`, `kernels()` for the process's set) and read by the matmul, `vec_dot`,
//! `quantize_row_act`, `dequantize_row`, attention, the vector ops (`ops/vec.rs`) and the
//! activations (`ops/act.rs`). Nothing on a hot path asks which CPU it runs on or which
//! type it has: a matmul looks its weight type up once and calls the function pointers it
//! finds for every row and tile.
//!
//! How a table is built (`build`): the scalar references for every type, then the set's
//! SIMD kernels laid over them: AVX2 (+ its AVX-VNNI builds where used) for the AVX2 and
//! AVX-512 sets, then AVX-512's own kernels over AVX2's, then the row-block kernels of
//! `avx2_rb` (Q4_K / Q6_K prefill; the AVX-512 set's two-row packed kernels); NEON
//! (+ dotprod) on aarch64. Then the options: `PYLLAMA_ORDER=llamacpp` lays llama.cpp's batch-dependent kernels over
//! Q4_K, Q6_K and the grid types (a second tile for batches under `SMALL_BATCH` rows),
//! `PYLLAMA_NO_COLS` / `PYLLAMA_NO_ROWS` drop the leftover-column and multi-row kernels,
//! `PYLLAMA_NO_RB` the row-block, column-lane and two-row kernels.
//! `PYLLAMA_KERNELS=ref` gives the reference table: scalar kernels everywhere, the vector
//! ops and activations too.
//!
//! Every kernel a table holds gives the same bits as the set's single-column kernel for each
//! output (quant/tests.rs and ops/matmul.rs hold them to it), so which entry a matmul takes
//! changes its speed only.

use super::{DequantFn, DotN, DotRows, KernelSet, PackedDot, PackedPairDot, PackedQuadDot, QuantizeFn, RbKernel, RepackFn, VecDotFn, MAX_TILE};
use crate::ggml_type::GgmlType;
use std::sync::OnceLock;

/// Batches below this many activation rows take `TypeKernels::tiled_small` (llama.cpp's
/// vec_dot orders under `PYLLAMA_ORDER=llamacpp`; the same as `tiled` otherwise).
pub const SMALL_BATCH: usize = 8;

/// The widest packed group (`avx2::PACK_COLS`).
pub const MAX_PACK: usize = 8;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(super::avx2::PACK_COLS == MAX_PACK);

/// Raw kernels over activation columns: `cols[nc]` computes nc columns at once (the same
/// code at another width); `cols[1]` is the single-column kernel, `cols[width]` the tile.
/// Widths strictly between 1 and `width` may be missing (then the single-column kernel
/// runs per token).
#[derive(Clone, Copy)]
pub struct Tiled {
    pub width: usize,
    pub cols: [Option<DotN>; MAX_TILE + 1],
}

impl Tiled {
    /// A single-column kernel and a `width`-column tile, nothing between.
    pub fn pair(one: DotN, many: DotN, width: usize) -> Tiled {
        let mut cols = [None; MAX_TILE + 1];
        cols[1] = Some(one);
        cols[width] = Some(many);
        Tiled { width, cols }
    }

    /// The single-column kernel.
    pub fn one(&self) -> DotN {
        self.cols[1].expect("a tiled entry has its single-column kernel")
    }

    /// The `width`-column tile.
    pub fn many(&self) -> DotN {
        self.cols[self.width].expect("a tiled entry has its tile")
    }

    /// The kernel over nc columns, 1 < nc < width, if there is one.
    pub fn mid(&self, nc: usize) -> Option<DotN> {
        if nc > 1 && nc < self.width {
            self.cols[nc]
        } else {
            None
        }
    }
}

/// Packed prefill kernels (x86, 32-element block types; see `avx2::packed_kernel_cols`):
/// `cols[nc]` computes the first nc columns of a packed group.
#[derive(Clone, Copy)]
pub struct Packed {
    pub cols: [Option<PackedDot>; MAX_PACK + 1],
    /// the weight offset the activations are packed for (`avx2::pack_offset`)
    pub offset: i32,
    /// bytes per block of a packed group (`avx2::pack_block_bytes`)
    pub block_bytes: usize,
    /// `pair[nc]`: the two-row kernel over the first nc columns of a packed group (the
    /// AVX-512 set's Q4_0 / Q5_0 / Q8_0 / Q4_1 / Q5_1, not under `PYLLAMA_NO_RB`; see
    /// `avx2_rb`)
    pub pair: [Option<PackedPairDot>; MAX_PACK + 1],
    /// the column-lane kernel (the plain AVX2 build's Q4_0 / Q5_0 / Q4_1 / Q5_1, not under
    /// `PYLLAMA_NO_RB`; see `avx2_rb`'s column-lane section)
    pub lanes: Option<Lanes>,
    /// the two-row kernels over decoded rows (the AVX-512 set's Q4_1 / Q5_1 in prefill, not
    /// under `PYLLAMA_NO_RB`; see `avx2_rb::pair_min_decoded`)
    pub pair_decoded: Option<PairDecoded>,
    /// the kernels over interleaved row pairs (the AVX-512 set's Q4_0 / Q5_0 / Q8_0 / Q4_1 /
    /// Q5_1 in prefill, not under `PYLLAMA_NO_RB`; see `avx2_rb::quad_signed`, `quad_min`):
    /// taken instead of `pair_decoded` where a decoded block holds `min_rows` rows or more
    pub pairs_decoded: Option<PairsDecoded>,
}

/// Two-row packed kernels over weight rows decoded once per matmul (see
/// `avx2_rb::pair_min_decoded`): `cols[nc]` is `pair[nc]` with its rows' blocks already
/// decoded by `decode` (the column-lane layout: nb x 32 quant bytes, then nb f32 scales).
#[derive(Clone, Copy)]
pub struct PairDecoded {
    /// decodes one weight row of nb blocks into `nb * block_bytes` bytes at dst
    pub decode: DecodeRowFn,
    /// decoded bytes per block
    pub block_bytes: usize,
    /// `cols[nc]`: two decoded rows against the first nc columns of a packed group
    pub cols: [Option<PackedPairDot>; MAX_PACK + 1],
}

/// Prefill kernels over weight row pairs decoded interleaved once per matmul (see
/// `avx2_rb::quad_signed`), against groups packed by `pack`.
#[derive(Clone, Copy)]
pub struct PairsDecoded {
    /// decodes rows wa and wb (nb blocks each) into `2 * nb * block_bytes` bytes at dst
    pub decode: DecodePairFn,
    /// decoded bytes per row and block
    pub block_bytes: usize,
    /// packs a group of activation rows in the kernels' layout (`avx2::pack_q8_0_cols`'s
    /// arguments without the weight offset)
    pub pack: PackPairsFn,
    /// bytes per block of a group packed by `pack`
    pub pack_block: usize,
    /// the fewest rows a block of decoded rows (`matmul::lanes_rows`) must hold for the
    /// matmul to take these kernels (each packed group is read from L2 once per block;
    /// fewer rows take `Packed::pair_decoded`)
    pub min_rows: usize,
    /// `two[nc]`: two decoded pairs (4 rows) against the first nc columns of a packed group
    pub two: [Option<PackedQuadDot>; MAX_PACK + 1],
    /// `one[nc]`: one decoded pair
    pub one: [Option<PackedQuadDot>; MAX_PACK + 1],
}

/// Decodes weight rows wa and wb (nb blocks each) into one interleaved pair at dst.
pub type DecodePairFn = unsafe fn(nb: usize, wa: *const u8, wb: *const u8, dst: *mut u8);

/// Packs `ncols` activation rows (`x + c * xs`, their block scales at `xd + c * xds`) of nb
/// blocks into one group at dst.
pub type PackPairsFn = unsafe fn(nb: usize, ncols: usize, x: *const u8, xs: usize, xd: *const f32, xds: usize, dst: *mut u8);

/// Decodes one weight row of nb blocks into `nb * block_bytes` bytes at dst (the column
/// lanes' and the decoded row pairs' layout).
pub type DecodeRowFn = unsafe fn(nb: usize, w: *const u8, dst: *mut u8);

/// Column-lane prefill kernel (see `avx2_rb`'s column-lane section): weight rows decoded
/// once per matmul, groups packed with one column per lane (`pack_q8_0_lanes` /
/// `pack_q8_1_lanes`, the same `block_bytes` as the packed layout).
#[derive(Clone, Copy)]
pub struct Lanes {
    /// decodes one weight row of nb blocks into `nb * block_bytes` bytes at dst
    pub decode: DecodeRowFn,
    /// decoded bytes per block
    pub block_bytes: usize,
    /// all PACK_COLS columns of a lanes-packed group against a decoded row
    pub dot: PackedDot,
}

/// Row-block prefill kernels (x86 K-quants, see `avx2_rb`): blocks of `rows` weight rows
/// repacked into scratch once per matmul, every token against each block.
#[derive(Clone, Copy)]
pub struct RowBlock {
    /// weight rows per block
    pub rows: usize,
    /// fewest tokens for which a matmul takes this path (below, the repack is not paid back)
    pub min_tokens: usize,
    pub repack: RepackFn,
    /// repacked bytes per super-block of `rows` rows
    pub sb_bytes: usize,
    /// columns per full tile
    pub tile: usize,
    /// `cols[nc]`: the kernel over nc columns, 1 <= nc <= tile
    pub cols: [Option<RbKernel>; MAX_TILE + 1],
}

/// One weight type's kernels in one kernel set.
#[derive(Clone, Copy)]
pub struct TypeKernels {
    pub ty: GgmlType,
    /// the activation format this type is multiplied with (`vec_dot_type`)
    pub vec_dot_type: GgmlType,
    /// one row of this type -> f32 (bit-identical in every set)
    pub dequant: Option<DequantFn>,
    /// ggml's reference quantizer into this type (`quantize_row_*_ref`)
    pub quantize_ref: Option<QuantizeFn>,
    /// the activation quantizer into this type (this type as a `vec_dot_type`: llama.cpp's
    /// x86 one for Q8_0 / Q8_1)
    pub quantize_act: Option<QuantizeFn>,
    /// safe single-row dot with a row of `vec_dot_type` (checks the slice lengths)
    pub vec_dot: Option<VecDotFn>,
    /// raw kernels over 1..=width activation rows (SIMD sets)
    pub tiled: Option<Tiled>,
    /// `tiled` for matmuls of fewer than `SMALL_BATCH` rows
    pub tiled_small: Option<Tiled>,
    /// single-token kernel over several weight rows
    pub rows: Option<DotRows>,
    /// packed prefill kernels
    pub packed: Option<Packed>,
    /// row-block prefill kernels
    pub row_block: Option<RowBlock>,
    /// register-blocked F32 tiles (`ops::sgemm`)
    pub sgemm: Option<crate::ops::sgemm::Kernels>,
}

impl TypeKernels {
    fn new(ty: GgmlType) -> TypeKernels {
        TypeKernels {
            ty,
            vec_dot_type: super::vec_dot_type(ty),
            dequant: None,
            quantize_ref: None,
            quantize_act: None,
            vec_dot: None,
            tiled: None,
            tiled_small: None,
            rows: None,
            packed: None,
            row_block: None,
            sgemm: None,
        }
    }

    /// The tiled kernels for a matmul over `n_tokens` activation rows.
    pub fn tiled_for(&self, n_tokens: usize) -> Option<&Tiled> {
        if n_tokens < SMALL_BATCH {
            self.tiled_small.as_ref()
        } else {
            self.tiled.as_ref()
        }
    }
}

/// One past the largest `GgmlType` id.
const N_TYPES: usize = 43;

/// Every weight type's kernels in one kernel set, plus the set-wide choices of the vector
/// ops and activations.
pub struct KernelTable {
    pub set: KernelSet,
    types: [TypeKernels; N_TYPES],
    /// ggml's x86 AVX2 vector math (its vector expf in softmax / SiLU / SwiGLU, the f16 and
    /// f32 vector kernels of `ops/vec.rs`, the tiled attention kernel): what llama.cpp's
    /// AVX2 build computes. False in the reference set and off x86-64.
    pub avx2_math: bool,
}

/// How a table is built besides its set (tests build tables with other choices).
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// the AVX2 kernels' AVX-VNNI builds (x86)
    pub vnni: bool,
    /// the NEON kernels' dotprod builds (aarch64)
    pub dotprod: bool,
    pub llamacpp_order: bool,
    pub no_cols: bool,
    pub no_rows: bool,
    /// no row-block, column-lane or two-row packed kernels (`PYLLAMA_NO_RB`)
    pub no_rb: bool,
}

impl Options {
    /// What this process runs: the CPU's features and the kernel environment variables.
    pub fn from_env() -> Options {
        let env = super::cpu::env();
        let f = super::cpu::features();
        Options {
            vnni: f.avxvnni && !matches!(env.kernels, super::cpu::Forced::Avx2 | super::cpu::Forced::Avx512Bw),
            dotprod: f.dotprod && env.kernels != super::cpu::Forced::Neon,
            llamacpp_order: env.llamacpp_order,
            no_cols: env.no_cols,
            no_rows: env.no_rows,
            no_rb: env.no_rb,
        }
    }
}

// (the x86 sets register more kinds of kernels than NEON does)
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl KernelTable {
    /// The kernels of weight type `ty`.
    #[inline]
    pub fn get(&self, ty: GgmlType) -> &TypeKernels {
        &self.types[ty as usize]
    }

    fn entry(&mut self, ty: GgmlType) -> &mut TypeKernels {
        &mut self.types[ty as usize]
    }

    /// Registration: `ty`'s raw kernels over activation columns and its safe single row.
    pub(crate) fn set_tiled(&mut self, ty: GgmlType, tiled: Tiled, vec_dot: VecDotFn) {
        let e = self.entry(ty);
        e.tiled = Some(tiled);
        e.vec_dot = Some(vec_dot);
    }

    /// Registration: `ty`'s tiles for batches of `SMALL_BATCH` rows or more (`large`) and
    /// below (`small`), where they differ (`PYLLAMA_ORDER=llamacpp`).
    pub(crate) fn set_tiled_by_batch(&mut self, ty: GgmlType, small: Tiled, large: Tiled) {
        let e = self.entry(ty);
        e.tiled_small = Some(small);
        e.tiled = Some(large);
    }

    /// Registration: `ty`'s safe single row only.
    pub(crate) fn set_vec_dot(&mut self, ty: GgmlType, vec_dot: VecDotFn) {
        self.entry(ty).vec_dot = Some(vec_dot);
    }

    /// Registration: `ty`'s single-token multi-row kernel.
    pub(crate) fn set_rows(&mut self, ty: GgmlType, rows: DotRows) {
        self.entry(ty).rows = Some(rows);
    }

    /// Registration: `ty` has no single-token multi-row kernel (another order's tiles).
    pub(crate) fn clear_rows(&mut self, ty: GgmlType) {
        self.entry(ty).rows = None;
    }

    /// Registration: `ty`'s packed kernels.
    pub(crate) fn set_packed(&mut self, ty: GgmlType, packed: Packed) {
        self.entry(ty).packed = Some(packed);
    }

    /// Registration: `ty`'s two-row packed kernels (over its packed entry).
    pub(crate) fn set_packed_pair(&mut self, ty: GgmlType, pair: [Option<PackedPairDot>; MAX_PACK + 1]) {
        self.entry(ty).packed.as_mut().expect("two-row kernels over a packed entry").pair = pair;
    }

    /// Registration: `ty`'s two-row kernels over decoded rows (over its packed entry).
    pub(crate) fn set_packed_pair_decoded(&mut self, ty: GgmlType, pd: PairDecoded) {
        self.entry(ty).packed.as_mut().expect("decoded two-row kernels over a packed entry").pair_decoded = Some(pd);
    }

    /// Registration: `ty`'s kernels over interleaved row pairs (over its packed entry).
    pub(crate) fn set_packed_pairs_decoded(&mut self, ty: GgmlType, pd: PairsDecoded) {
        self.entry(ty).packed.as_mut().expect("interleaved pair kernels over a packed entry").pairs_decoded = Some(pd);
    }

    /// Registration: `ty`'s column-lane kernel (over its packed entry).
    pub(crate) fn set_packed_lanes(&mut self, ty: GgmlType, lanes: Lanes) {
        self.entry(ty).packed.as_mut().expect("column-lane kernels over a packed entry").lanes = Some(lanes);
    }

    /// Registration: `ty`'s row-block kernels.
    pub(crate) fn set_row_block(&mut self, ty: GgmlType, rb: RowBlock) {
        self.entry(ty).row_block = Some(rb);
    }

    /// Registration: the activation quantizer into `ty` and / or its dequantizer.
    pub(crate) fn set_convert(&mut self, ty: GgmlType, quantize_act: Option<QuantizeFn>, dequant: Option<DequantFn>) {
        let e = self.entry(ty);
        e.quantize_act = quantize_act.or(e.quantize_act);
        e.dequant = dequant.or(e.dequant);
    }

    /// Every type's entry (tests, `pyllama info`).
    pub fn entries(&self) -> impl Iterator<Item = &TypeKernels> {
        all_types().map(move |ty| self.get(ty))
    }
}

/// All ggml type ids pyllama knows.
fn all_types() -> impl Iterator<Item = GgmlType> {
    (0..N_TYPES as u32).filter_map(GgmlType::from_u32)
}

/// Build the table of `set` with `opt` (uncached; `table` caches the process's).
/// `set` must be one this CPU runs (`kernel_set` only picks those).
pub fn build(set: KernelSet, opt: Options) -> KernelTable {
    let mut t = KernelTable {
        set,
        types: std::array::from_fn(|i| TypeKernels::new(GgmlType::from_u32(i as u32).unwrap_or(GgmlType::I8))),
        avx2_math: cfg!(target_arch = "x86_64") && set.is_simd(),
    };
    // scalar references for every type
    for ty in all_types() {
        let e = t.entry(ty);
        e.dequant = super::dequantize_fn_ref(ty);
        e.quantize_ref = super::quantize_fn_ref(ty);
        e.quantize_act = super::quantize_act_fn_ref(ty);
        e.vec_dot = super::vec_dot_fn_ref(ty);
    }
    if set.is_simd() {
        // Q1_0, Q2_0, NVFP4 where the set has no kernel for them (NEON; Q2_0 everywhere, as
        // ggml has none on x86): the scalar twin of llama.cpp's x86 order (`lowbit::*_x86`),
        // so their logits are the x86 build's
        for ty in [GgmlType::Q1_0, GgmlType::Q2_0, GgmlType::NVFP4] {
            t.entry(ty).vec_dot = super::vec_dot_fn_x86_order(ty);
        }
    }
    match set {
        #[cfg(target_arch = "x86_64")]
        KernelSet::Avx2 | KernelSet::Avx512 | KernelSet::Avx512Bw => x86(&mut t, set, opt),
        #[cfg(target_arch = "aarch64")]
        KernelSet::Neon => super::neon::register(&mut t, opt.dotprod),
        _ => {}
    }
    for ty in all_types() {
        let e = t.entry(ty);
        if e.tiled_small.is_none() {
            e.tiled_small = e.tiled;
        }
        if opt.no_cols {
            for tl in [&mut e.tiled, &mut e.tiled_small].into_iter().flatten() {
                let (one, many) = (tl.one(), tl.many());
                *tl = Tiled::pair(one, many, tl.width);
            }
            if let Some(p) = e.packed.as_mut() {
                for c in p.cols[..MAX_PACK].iter_mut() {
                    *c = None;
                }
            }
        }
        if opt.no_rows {
            e.rows = None;
        }
        e.sgemm = crate::ops::sgemm::kernels(set, ty);
    }
    t
}

/// The x86 SIMD sets: AVX2 (+ AVX-VNNI builds), then AVX-512 over it (`avx512.rs`'s VNNI
/// kernels in the Avx512 set only; `avx2_rb`'s zmm builds in both), then llama.cpp's orders.
#[cfg(target_arch = "x86_64")]
fn x86(t: &mut KernelTable, set: KernelSet, opt: Options) {
    use super::{avx2, avx512};
    let pack = match set {
        KernelSet::Avx512 => avx2::PackBuild::Evex,
        KernelSet::Avx512Bw => avx2::PackBuild::Bw,
        _ if opt.vnni => avx2::PackBuild::Vnni,
        _ => avx2::PackBuild::Plain,
    };
    avx2::register(t, opt.vnni, pack);
    if set == KernelSet::Avx512 {
        // AVX-512's own kernels over AVX2's (bit-identical results, see avx512.rs)
        avx512::register(t);
    }
    if !opt.no_rb {
        // the row-block kernels follow pyllama's batch-independent orders only
        super::avx2_rb::register(t, pack, !opt.llamacpp_order);
    }
    if opt.llamacpp_order {
        avx2::register_llamacpp_order(t);
    }
}

/// The table of kernel set `set` for this process (`Options::from_env`), built on first use.
pub fn table(set: KernelSet) -> &'static KernelTable {
    static T: [OnceLock<KernelTable>; 5] = [OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = match set {
        KernelSet::Ref => 0,
        KernelSet::Avx2 => 1,
        KernelSet::Neon => 2,
        KernelSet::Avx512 => 3,
        KernelSet::Avx512Bw => 4,
    };
    T[i].get_or_init(|| build(set, Options::from_env()))
}

/// The table of the process's kernel set (`kernel_set()`).
#[inline]
pub fn kernels() -> &'static KernelTable {
    static T: OnceLock<&'static KernelTable> = OnceLock::new();
    T.get_or_init(|| table(super::kernel_set()))
}
