//! IQ3_XXS and IQ3_S quantizers (ggml-quants.c `quantize_row_iq3_xxs_impl` /
//! `quantize_row_iq3_s_impl`, with `iq3xs_init_impl`'s grid, map and neighbour lists):
//! groups of 4 values are snapped to a point of a 256- (IQ3_XXS) or 512-point (IQ3_S) grid
//! of odd levels 1..15, searching 31 / 19 scales per block of 32.

use super::grid::{cmax_of, signs8, sum_sq, Grid, Refit, Search};
use super::kernels::{cmax, nearest_int};
use crate::ggml_type::QK_K;
use crate::quant::fp::f32_to_f16;
use std::sync::OnceLock;

/// 3-bit patterns of 4 levels.
const KMAP_SIZE: usize = 4096;
const GROUP_MAX_EPS_IQ3_XXS: f32 = 1e-8;
const KMAXQ: i32 = 8;

pub(super) fn grid(size: usize) -> &'static Grid<4> {
    static G256: OnceLock<Grid<4>> = OnceLock::new();
    static G512: OnceLock<Grid<4>> = OnceLock::new();
    if size == 256 {
        G256.get_or_init(|| Grid::build(&KGRID_256, 3, KMAP_SIZE, 2))
    } else {
        G512.get_or_init(|| Grid::build(&KGRID_512, 3, KMAP_SIZE, 3))
    }
}

#[inline(always)]
fn block_weights(xb: &[f32], qw: Option<&[f32]>, sigma2: f32, weight: &mut [f32; 32], waux: &mut [f32; 32]) {
    match qw {
        Some(q) => {
            for i in 0..32 {
                weight[i] = q[i] * (sigma2 + xb[i] * xb[i]).sqrt();
            }
        }
        None => {
            for i in 0..32 {
                weight[i] = xb[i] * xb[i];
            }
        }
    }
    for i in 0..32 {
        waux[i] = weight[i].sqrt();
    }
}

/// One row of IQ3_XXS (98-byte blocks: d, 64 grid indices, 8 x u32 signs + 4-bit scale).
#[inline(always)]
pub(super) fn iq3_xxs_row(x: &[f32], y: &mut [u8], qw_row: Option<&[f32]>) {
    let g = grid(256);
    for (ibl, (xbl, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(98)).enumerate() {
        b[0..2].copy_from_slice(&f32_to_f16(0.0).to_le_bytes());
        let mut q3 = [0u8; 104];
        let mut sas = [0u32; 8];
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let mut weight = [0f32; 32];
            let mut waux = [0f32; 32];
            block_weights(xb, qw_row.map(|q| &q[QK_K * ibl + 32 * ib..]), sigma2, &mut weight, &mut waux);
            let mut xval = [0f32; 32];
            let mut block_signs = [0u8; 4];
            for k in 0..4 {
                block_signs[k] = signs8(&xb[8 * k..], &weight[8 * k..], &mut xval[8 * k..8 * k + 8], true);
            }
            let max = cmax_of(&xval);
            if max < GROUP_MAX_EPS_IQ3_XXS {
                scales[ib] = 0.0;
                continue;
            }
            let mut l = [0i8; 32];
            let p = Search { kmaxq: KMAXQ, nis: 15, step: 0.2, on_grid_init: true, refit: Refit::OffGrid };
            let mut scale = g.search(&p, &xval, &weight, &waux, max, max / (2 * KMAXQ - 1) as f32, &mut l);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s & 127;
                }
            }
            for k in 0..8 {
                let u = g.pattern(&l[4 * k..]);
                let gi = g.map[u];
                assert!(gi >= 0, "IQ3_XXS: point {u} not on the grid");
                q3[8 * ib + k] = gi as u8;
            }
            sas[ib] = block_signs[0] as u32 | (block_signs[1] as u32) << 7 | (block_signs[2] as u32) << 14 | (block_signs[3] as u32) << 21;
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            b[2..98].fill(0);
            continue;
        }
        let d = max_scale / 31.0;
        b[0..2].copy_from_slice(&f32_to_f16(d * 1.0125).to_le_bytes());
        let id = 1.0 / d;
        for ib in 0..8 {
            let lv = nearest_int(0.5 * (id * scales[ib] - 1.0)).min(15).max(0);
            sas[ib] |= (lv as u32) << 28;
        }
        for ib in 0..8 {
            q3[64 + 4 * ib..68 + 4 * ib].copy_from_slice(&sas[ib].to_le_bytes());
        }
        b[2..98].copy_from_slice(&q3[..96]);
    }
}

/// One row of IQ3_S (110-byte blocks: d, qs[64], qh[8], signs[32], scales[4]).
#[inline(always)]
pub(super) fn iq3_s_row(x: &[f32], y: &mut [u8], qw_row: Option<&[f32]>) {
    let g = grid(512);
    for (ibl, (xbl, b)) in x.chunks_exact(QK_K).zip(y.chunks_exact_mut(110)).enumerate() {
        b.fill(0);
        b[0..2].copy_from_slice(&f32_to_f16(0.0).to_le_bytes());
        let mut qs_off = 2usize;
        let mut signs_off = 74usize;
        let mut scales = [0f32; 8];
        let mut max_scale = 0f32;
        let sigma2 = 2.0 * sum_sq(xbl) / QK_K as f32;
        for ib in 0..8 {
            let xb = &xbl[32 * ib..32 * ib + 32];
            let mut weight = [0f32; 32];
            let mut waux = [0f32; 32];
            block_weights(xb, qw_row.map(|q| &q[QK_K * ibl + 32 * ib..]), sigma2, &mut weight, &mut waux);
            let mut xval = [0f32; 32];
            let mut block_signs = [0u8; 4];
            for k in 0..4 {
                block_signs[k] = signs8(&xb[8 * k..], &weight[8 * k..], &mut xval[8 * k..8 * k + 8], false);
            }
            let max = cmax_of(&xval);
            if max == 0.0 {
                // ggml skips the block without advancing its qs / signs pointers
                scales[ib] = 0.0;
                continue;
            }
            let mut l = [0i8; 32];
            let p = Search { kmaxq: KMAXQ, nis: 9, step: 0.2, on_grid_init: false, refit: Refit::AllIfOffGrid };
            let mut scale = g.search(&p, &xval, &weight, &waux, max, max / (2 * KMAXQ - 1) as f32, &mut l);
            if scale < 0.0 {
                scale = -scale;
                for s in &mut block_signs {
                    *s = !*s;
                }
            }
            for k in 0..8 {
                let u = g.pattern(&l[4 * k..]);
                let gi = g.map[u];
                assert!(gi >= 0, "IQ3_S: point {u} not on the grid");
                b[qs_off + k] = (gi & 255) as u8;
                b[66 + (ib * 8 + k) / 8] |= ((gi >> 8) << ((ib * 8 + k) % 8)) as u8;
            }
            qs_off += 8;
            b[signs_off..signs_off + 4].copy_from_slice(&block_signs);
            signs_off += 4;
            scales[ib] = scale;
            max_scale = cmax(max_scale, scale);
        }
        if max_scale == 0.0 {
            continue;
        }
        let d = max_scale / 31.0;
        b[0..2].copy_from_slice(&f32_to_f16(d * 1.033).to_le_bytes());
        let id = 1.0 / d;
        for ib in (0..8).step_by(2) {
            let l1 = nearest_int(0.5 * (id * scales[ib] - 1.0)).min(15).max(0);
            let l2 = nearest_int(0.5 * (id * scales[ib + 1] - 1.0)).min(15).max(0);
            b[106 + ib / 2] = (l1 | (l2 << 4)) as u8;
        }
    }
}

pub(super) const KGRID_256: [u16; 256] = [
    0, 2, 4, 9, 11, 15, 16, 18, 25, 34, 59, 61, 65, 67, 72, 74,
    81, 85, 88, 90, 97, 108, 120, 128, 130, 132, 137, 144, 146, 153, 155, 159,
    169, 175, 189, 193, 199, 200, 202, 213, 248, 267, 287, 292, 303, 315, 317, 321,
    327, 346, 362, 413, 436, 456, 460, 462, 483, 497, 513, 515, 520, 522, 529, 531,
    536, 538, 540, 551, 552, 576, 578, 585, 592, 594, 641, 643, 648, 650, 657, 664,
    698, 704, 706, 720, 729, 742, 758, 769, 773, 808, 848, 852, 870, 889, 901, 978,
    992, 1024, 1026, 1033, 1035, 1040, 1042, 1046, 1049, 1058, 1089, 1091, 1093, 1096, 1098, 1105,
    1112, 1139, 1143, 1144, 1152, 1154, 1161, 1167, 1168, 1170, 1183, 1184, 1197, 1217, 1224, 1228,
    1272, 1276, 1309, 1323, 1347, 1367, 1377, 1404, 1473, 1475, 1486, 1509, 1537, 1544, 1546, 1553,
    1555, 1576, 1589, 1594, 1600, 1602, 1616, 1625, 1636, 1638, 1665, 1667, 1672, 1685, 1706, 1722,
    1737, 1755, 1816, 1831, 1850, 1856, 1862, 1874, 1901, 1932, 1950, 1971, 2011, 2032, 2052, 2063,
    2077, 2079, 2091, 2095, 2172, 2192, 2207, 2208, 2224, 2230, 2247, 2277, 2308, 2345, 2356, 2389,
    2403, 2424, 2501, 2504, 2506, 2520, 2570, 2593, 2616, 2624, 2630, 2646, 2669, 2700, 2714, 2746,
    2754, 2795, 2824, 2835, 2839, 2874, 2882, 2905, 2984, 3028, 3042, 3092, 3108, 3110, 3124, 3153,
    3185, 3215, 3252, 3288, 3294, 3364, 3397, 3434, 3483, 3523, 3537, 3587, 3589, 3591, 3592, 3610,
    3626, 3670, 3680, 3722, 3749, 3754, 3776, 3789, 3803, 3824, 3857, 3873, 3904, 3906, 3924, 3992,
];
pub(super) const KGRID_512: [u16; 512] = [
    0, 1, 2, 5, 7, 8, 9, 10, 12, 14, 16, 17, 21, 27, 32, 34,
    37, 39, 41, 43, 48, 50, 57, 60, 63, 64, 65, 66, 68, 72, 73, 77,
    80, 83, 87, 89, 93, 100, 113, 117, 122, 128, 129, 133, 135, 136, 139, 142,
    145, 149, 152, 156, 162, 165, 167, 169, 171, 184, 187, 195, 201, 205, 208, 210,
    217, 219, 222, 228, 232, 234, 247, 249, 253, 256, 267, 271, 273, 276, 282, 288,
    291, 297, 312, 322, 324, 336, 338, 342, 347, 353, 357, 359, 374, 379, 390, 393,
    395, 409, 426, 441, 448, 450, 452, 464, 466, 470, 475, 488, 492, 512, 513, 514,
    516, 520, 521, 523, 525, 527, 528, 530, 537, 540, 542, 556, 558, 561, 570, 576,
    577, 579, 582, 584, 588, 593, 600, 603, 609, 616, 618, 632, 638, 640, 650, 653,
    655, 656, 660, 666, 672, 675, 685, 688, 698, 705, 708, 711, 712, 715, 721, 727,
    728, 732, 737, 754, 760, 771, 773, 778, 780, 793, 795, 802, 806, 808, 812, 833,
    840, 843, 849, 856, 858, 873, 912, 916, 919, 932, 934, 961, 963, 968, 970, 977,
    989, 993, 1010, 1016, 1024, 1025, 1027, 1029, 1031, 1032, 1034, 1036, 1038, 1041, 1043, 1047,
    1048, 1050, 1057, 1059, 1061, 1064, 1066, 1079, 1080, 1083, 1085, 1088, 1090, 1096, 1099, 1103,
    1106, 1109, 1113, 1116, 1122, 1129, 1153, 1156, 1159, 1169, 1171, 1176, 1183, 1185, 1195, 1199,
    1209, 1212, 1216, 1218, 1221, 1225, 1234, 1236, 1241, 1243, 1250, 1256, 1270, 1281, 1287, 1296,
    1299, 1306, 1309, 1313, 1338, 1341, 1348, 1353, 1362, 1375, 1376, 1387, 1400, 1408, 1410, 1415,
    1425, 1453, 1457, 1477, 1481, 1494, 1496, 1507, 1512, 1538, 1545, 1547, 1549, 1551, 1554, 1561,
    1563, 1565, 1570, 1572, 1575, 1577, 1587, 1593, 1601, 1603, 1605, 1612, 1617, 1619, 1632, 1648,
    1658, 1662, 1664, 1674, 1680, 1690, 1692, 1704, 1729, 1736, 1740, 1745, 1747, 1751, 1752, 1761,
    1763, 1767, 1773, 1787, 1795, 1801, 1806, 1810, 1817, 1834, 1840, 1844, 1857, 1864, 1866, 1877,
    1882, 1892, 1902, 1915, 1934, 1953, 1985, 1987, 2000, 2002, 2013, 2048, 2052, 2058, 2064, 2068,
    2071, 2074, 2081, 2088, 2104, 2114, 2119, 2121, 2123, 2130, 2136, 2141, 2147, 2153, 2157, 2177,
    2179, 2184, 2189, 2193, 2203, 2208, 2223, 2226, 2232, 2244, 2249, 2251, 2256, 2258, 2265, 2269,
    2304, 2306, 2324, 2335, 2336, 2361, 2373, 2375, 2385, 2418, 2443, 2460, 2480, 2504, 2509, 2520,
    2531, 2537, 2562, 2568, 2572, 2578, 2592, 2596, 2599, 2602, 2614, 2620, 2625, 2627, 2629, 2634,
    2641, 2650, 2682, 2688, 2697, 2707, 2712, 2718, 2731, 2754, 2759, 2760, 2775, 2788, 2793, 2805,
    2811, 2817, 2820, 2832, 2842, 2854, 2890, 2902, 2921, 2923, 2978, 3010, 3012, 3026, 3081, 3083,
    3085, 3097, 3099, 3120, 3136, 3152, 3159, 3188, 3210, 3228, 3234, 3245, 3250, 3256, 3264, 3276,
    3281, 3296, 3349, 3363, 3378, 3392, 3395, 3420, 3440, 3461, 3488, 3529, 3531, 3584, 3588, 3591,
    3600, 3602, 3614, 3616, 3628, 3634, 3650, 3657, 3668, 3683, 3685, 3713, 3716, 3720, 3726, 3729,
    3736, 3753, 3778, 3802, 3805, 3819, 3841, 3845, 3851, 3856, 3880, 3922, 3938, 3970, 3993, 4032,
];
