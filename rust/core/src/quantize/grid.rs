//! What the IQ1_*, IQ2_* and IQ3_* quantizers share (ggml-quants.c `iq2xs_init_impl` /
//! `iq3xs_init_impl`, `iq2_find_best_neighbour` / `iq3_find_best_neighbour` /
//! `iq1_find_best_neighbour2`, and the scale search of `quantize_row_iq{2,3}_*_impl`):
//! a grid of N-value points of odd levels, the map from every level pattern to its grid
//! index or to the list of its nearest grid points, and the search of a block's scale.

use super::kernels::nearest_int;
pub(super) use super::kernels::{cmax_of, sum_sq};

/// A grid of `N`-value points; levels are stored as the odd values 2 * level + 1.
pub(super) struct Grid<const N: usize> {
    pub(super) grid: Vec<[i8; N]>,
    /// Grid index of a level pattern, or -(offset + 1) into `neighbours`.
    pub(super) map: Vec<i32>,
    /// Per off-grid pattern: the count, then the grid indices of its nearest points.
    neighbours: Vec<u16>,
    /// Bits per level in a pattern (and in the `kgrid` entries): 2 (IQ1 / IQ2) or 3 (IQ3).
    bits: u32,
}

impl<const N: usize> Grid<N> {
    /// The grid of `kgrid` (levels packed `bits` apiece), the map over `kmap_size` patterns,
    /// and for each off-grid pattern the grid points at its `nwant` smallest distances.
    pub(super) fn build(kgrid: &[u16], bits: u32, kmap_size: usize, nwant: usize) -> Self {
        let mask = (1u16 << bits) - 1;
        let grid: Vec<[i8; N]> = kgrid
            .iter()
            .map(|&g| {
                let mut p = [0i8; N];
                for (i, v) in p.iter_mut().enumerate() {
                    *v = (2 * ((g >> (bits as usize * i)) & mask) + 1) as i8;
                }
                p
            })
            .collect();
        let mut map = vec![-1i32; kmap_size];
        for (i, p) in grid.iter().enumerate() {
            let mut index = 0usize;
            for (k, &v) in p.iter().enumerate() {
                index |= (((v - 1) / 2) as usize) << (bits as usize * k);
            }
            map[index] = i as i32;
        }
        let mut neighbours: Vec<u16> = Vec::new();
        let mut dist2: Vec<(i32, i32)> = Vec::with_capacity(grid.len());
        for i in 0..kmap_size {
            if map[i] >= 0 {
                continue;
            }
            let mut pos = [0i32; N];
            for (k, p) in pos.iter_mut().enumerate() {
                *p = 2 * ((i >> (bits as usize * k)) & mask as usize) as i32 + 1;
            }
            dist2.clear();
            for (j, pg) in grid.iter().enumerate() {
                let mut d2 = 0i32;
                for k in 0..N {
                    let d = pg[k] as i32 - pos[k];
                    d2 += d * d;
                }
                dist2.push((d2, j as i32));
            }
            dist2.sort_unstable();
            map[i] = -(neighbours.len() as i32 + 1);
            let start = neighbours.len();
            neighbours.push(0);
            let mut d2 = dist2[0].0;
            let mut nhave = 1;
            let mut n = 0u16;
            for &(d, j) in &dist2 {
                if d > d2 {
                    if nhave == nwant {
                        break;
                    }
                    d2 = d;
                    nhave += 1;
                }
                neighbours.push(j as u16);
                n += 1;
            }
            neighbours[start] = n;
        }
        Grid { grid, map, neighbours, bits }
    }

    /// The pattern of the levels `l[..N]`.
    #[inline(always)]
    pub(super) fn pattern(&self, l: &[i8]) -> usize {
        let mut u = 0usize;
        for i in 0..N {
            u |= (l[i] as usize) << (self.bits as usize * i);
        }
        u
    }

    /// Levels of `xval[..N]` at inverse scale `id` (ggml's
    /// `MAX(0, MIN(kmaxq - 1, nearest_int(0.5f * (id * x - 1))))`) into `l`; their pattern.
    #[inline(always)]
    pub(super) fn snap(&self, id: f32, xval: &[f32], kmaxq: i32, l: &mut [i8]) -> usize {
        for i in 0..N {
            l[i] = nearest_int(0.5 * (id * xval[i] - 1.0)).min(kmaxq - 1).max(0) as i8;
        }
        self.pattern(l)
    }

    /// The neighbour of off-grid pattern `u` nearest to `xval` in `weight`ed distance, a
    /// grid value v standing for `scale * q(v)`; its levels go to `l`, its index is returned.
    #[inline(always)]
    pub(super) fn best_neighbour_by(&self, u: usize, xval: &[f32], weight: &[f32], scale: f32, q: impl Fn(i8) -> f32,
                                    l: &mut [i8]) -> usize {
        let start = (-self.map[u] - 1) as usize;
        let n = self.neighbours[start] as usize;
        let mut best_d2 = f32::MAX;
        let mut gi = usize::MAX;
        for &j in &self.neighbours[start + 1..start + 1 + n] {
            let pg = &self.grid[j as usize];
            let mut d2 = 0f32;
            for i in 0..N {
                let diff = scale * q(pg[i]) - xval[i];
                d2 += weight[i] * diff * diff;
            }
            if d2 < best_d2 {
                best_d2 = d2;
                gi = j as usize;
            }
        }
        assert!(gi != usize::MAX, "IQ quantizer: no grid point found (non-finite values?)");
        self.levels(gi, l);
        gi
    }

    /// `iq2_find_best_neighbour` / `iq3_find_best_neighbour`: grid values scaled as they are.
    #[inline(always)]
    pub(super) fn best_neighbour(&self, u: usize, xval: &[f32], weight: &[f32], scale: f32, l: &mut [i8]) -> usize {
        self.best_neighbour_by(u, xval, weight, scale, |v| v as f32, l)
    }

    /// The levels of grid point `gi` into `l[..N]`.
    #[inline(always)]
    pub(super) fn levels(&self, gi: usize, l: &mut [i8]) {
        let pg = &self.grid[gi];
        for i in 0..N {
            l[i] = (pg[i] - 1) / 2;
        }
    }

    /// The scale search of one block of M values (M / N groups, at most 8) of the IQ2 / IQ3
    /// quantizers: 2 * nis + 1 trial scales around `(2 kmaxq - 1) / max`, off-grid groups
    /// moved to their best neighbour, the best least-squares fit kept; then groups re-snapped
    /// at the chosen scale (`refit`) and the scale fitted again. `scale` and `l` come in as
    /// the fallback (IQ2_XXS: make_qp_quants' levels) and go out as the result.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn search<const M: usize>(&self, p: &Search, xval: &[f32; M], weight: &[f32; M], waux: &[f32; M],
                                         max: f32, mut scale: f32, l: &mut [i8; M]) -> f32 {
        let groups = M / N;
        let mut best = 0f32;
        let mut is_on_grid = [p.on_grid_init; 8];
        let mut is_on_grid_aux = [true; 8];
        let mut laux = [0i8; M];
        for is in -p.nis..=p.nis {
            let id = ((2 * p.kmaxq - 1) as f32 + is as f32 * p.step) / max;
            let this_scale = 1.0 / id;
            for k in 0..groups {
                let r = N * k..N * k + N;
                let u = self.snap(id, &xval[r.clone()], p.kmaxq, &mut laux[r.clone()]);
                is_on_grid_aux[k] = true;
                if self.map[u] < 0 {
                    is_on_grid_aux[k] = false;
                    self.best_neighbour(u, &xval[r.clone()], &waux[r.clone()], this_scale, &mut laux[r]);
                }
            }
            let (sumqx, sumq2) = sums(weight, xval, &laux);
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                scale = sumqx / sumq2;
                best = scale * sumqx;
                *l = laux;
                is_on_grid = is_on_grid_aux;
            }
        }
        let any_off = is_on_grid[..groups].iter().any(|&b| !b);
        if (p.refit == Refit::Always || any_off) && scale > 0.0 {
            let id = 1.0 / scale;
            for k in 0..groups {
                if p.refit == Refit::OffGrid && is_on_grid[k] {
                    continue;
                }
                let r = N * k..N * k + N;
                let mut tmp = [0i8; N];
                let u = self.snap(id, &xval[r.clone()], p.kmaxq, &mut tmp);
                if self.map[u] >= 0 {
                    self.levels(self.map[u] as usize, &mut l[r]);
                } else {
                    self.best_neighbour(u, &xval[r.clone()], &waux[r.clone()], scale, &mut l[r]);
                }
            }
            let (sumqx, sumq2) = sums(weight, xval, l);
            if sumq2 > 0.0 {
                scale = sumqx / sumq2;
            }
        }
        scale
    }
}

/// Which groups `Grid::search` re-snaps at the chosen scale.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Refit {
    /// the off-grid ones, when there are any (IQ2_XS, IQ2_S, IQ3_XXS)
    OffGrid,
    /// all of them, when any is off the grid (IQ3_S)
    AllIfOffGrid,
    /// all of them, always (IQ2_XXS)
    Always,
}

/// The parameters of `Grid::search`.
pub(super) struct Search {
    /// levels 0..kmaxq (odd values 1..2 kmaxq - 1)
    pub(super) kmaxq: i32,
    /// trial scales each side of the first
    pub(super) nis: i32,
    /// step of the trial inverse scales
    pub(super) step: f32,
    /// whether a group counts as on the grid before any trial fits (IQ3_S: no)
    pub(super) on_grid_init: bool,
    pub(super) refit: Refit,
}

/// (sum w x q, sum w q^2) of the odd values q = 2 l + 1.
#[inline(always)]
pub(super) fn sums(weight: &[f32], xval: &[f32], l: &[i8]) -> (f32, f32) {
    let mut sumqx = 0f32;
    let mut sumq2 = 0f32;
    for i in 0..weight.len() {
        let w = weight[i];
        let q = (2 * l[i] as i32 + 1) as f32;
        sumqx += w * xval[i] * q;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// Magnitudes of 8 values into `xval` and their sign bits; with `even`, an odd count of
/// negatives is made even by flipping the value of least weight * x^2 (the signs then fit
/// in 7 bits, as IQ2_XXS / IQ2_XS / IQ3_XXS store them).
#[inline(always)]
pub(super) fn signs8(xb: &[f32], weight: &[f32], xval: &mut [f32], even: bool) -> u8 {
    let mut nflip = 0;
    let mut s = 0u8;
    for i in 0..8 {
        if xb[i] >= 0.0 {
            xval[i] = xb[i];
        } else {
            xval[i] = -xb[i];
            nflip += 1;
            s |= 1 << i;
        }
    }
    if even {
        if nflip % 2 != 0 {
            let mut imin = 0;
            let mut min = weight[0] * xb[0] * xb[0];
            for i in 1..8 {
                let ax = weight[i] * xb[i] * xb[i];
                if ax < min {
                    min = ax;
                    imin = i;
                }
            }
            xval[imin] = -xval[imin];
            s ^= 1 << imin;
        }
        s & 127
    } else {
        s
    }
}
