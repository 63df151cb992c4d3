//! llama.cpp's built-in samplers (src/llama-sampler.cpp), one function each, over a
//! [`Candidates`] array, in llama.cpp's float order: float32 where it computes in float
//! (running sums left to right, no fused multiply-add), float64 where it uses double,
//! and the C library's `expf` / `logf` / `log2f` / `powf` (Rust's `f32::exp`, `ln`,
//! `log2`, `powf` call them). [`Sampler`] holds one sampler's parameters and state (RNG,
//! mirostat's mu, the penalty and DRY histories); a chain is a list of them applied in
//! turn (`pyllama.sampling.SamplerChain` hands a chain of built-ins to Rust in one call).
//!
//! Where llama.cpp would produce NaN from a non-finite maximum (a temperature so small
//! that the best logit overflows, a row of -inf), the softmax gives the +inf logits all
//! the mass, or every candidate the same, so a token is still chosen.

use super::rng::StdRng;
use super::top_k_indices;
use std::collections::{HashMap, HashSet, VecDeque};

/// `llama_token_data_array`: parallel ids / logits / probabilities, the selected index
/// (-1: none yet) and whether the logits are in descending order.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Candidates {
    pub ids: Vec<i32>,
    pub logits: Vec<f32>,
    pub p: Vec<f32>,
    pub selected: i64,
    pub sorted: bool,
}

impl Candidates {
    /// Every token of a vocabulary: ids 0..n with one row of logits, p 0, unsorted.
    pub fn from_row(row: &[f32]) -> Self {
        let n = row.len();
        Candidates { ids: (0..n as i32).collect(), logits: row.to_vec(), p: vec![0.0; n], selected: -1, sorted: false }
    }

    /// `from_row` followed by top-k `k` (> 0), without building the full array first.
    pub fn top_k_of_row(row: &[f32], k: usize) -> Self {
        let idx = top_k_indices(row, k.min(row.len()));
        Candidates {
            ids: idx.iter().map(|&i| i as i32).collect(),
            logits: idx.iter().map(|&i| row[i as usize]).collect(),
            p: vec![0.0; idx.len()],
            selected: -1,
            sorted: true,
        }
    }

    pub fn len(&self) -> usize {
        self.logits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.logits.is_empty()
    }

    /// The selected token id, when a sampler selected one.
    pub fn token(&self) -> Option<i32> {
        usize::try_from(self.selected).ok().and_then(|i| self.ids.get(i).copied())
    }

    fn take(&mut self, idx: &[u32]) {
        self.ids = idx.iter().map(|&i| self.ids[i as usize]).collect();
        self.logits = idx.iter().map(|&i| self.logits[i as usize]).collect();
        self.p = idx.iter().map(|&i| self.p[i as usize]).collect();
    }

    fn truncate(&mut self, n: usize) {
        self.ids.truncate(n);
        self.logits.truncate(n);
        self.p.truncate(n);
    }

    /// `llama_token_data_array_partial_sort_inplace`: keep the `k` best, best first (equal
    /// logits keep their order, NaN last).
    fn sort_top(&mut self, k: usize) {
        let idx = top_k_indices(&self.logits, k);
        self.take(&idx);
        self.sorted = true;
    }

    /// Positions of many tokens: the shortcut for each, then one pass for the rest.
    fn positions(&self, toks: &[i32]) -> HashMap<i32, usize> {
        let mut out = HashMap::with_capacity(toks.len());
        let mut rest = HashSet::new();
        for &tok in toks {
            let t = tok as usize;
            if tok >= 0 && t < self.len() && self.ids[t] == tok {
                out.insert(tok, t);
            } else {
                rest.insert(tok);
            }
        }
        if !rest.is_empty() {
            for (i, id) in self.ids.iter().enumerate() {
                if rest.remove(id) {
                    out.insert(*id, i);
                    if rest.is_empty() {
                        break;
                    }
                }
            }
        }
        out
    }
}

/// `std::max(a, b)` folded from the first element: NaN after the first is skipped, a NaN
/// first stays.
fn fold_max(v: &[f32]) -> f32 {
    v.iter().skip(1).fold(v[0], |m, &x| if m < x { x } else { m })
}

/// `expf(logit - max)`; a maximum of +inf gives the +inf logits 1 and the rest 0, a
/// maximum of -inf or NaN gives every candidate 1 (llama.cpp would give NaN).
#[inline]
fn exp_shifted(l: f32, max: f32) -> f32 {
    if max.is_finite() {
        (l - max).exp()
    } else if max == f32::INFINITY {
        if l == max { 1.0 } else { 0.0 }
    } else {
        1.0
    }
}

/// `llama_sampler_softmax_impl`: p = expf(logit - max) / (float running sum).
pub fn softmax(cur: &mut Candidates, do_sort: bool) {
    if cur.is_empty() {
        return;
    }
    if do_sort && !cur.sorted {
        let n = cur.len();
        cur.sort_top(n);
    }
    let max = if cur.sorted { cur.logits[0] } else { fold_max(&cur.logits) };
    let mut sum = 0f32;
    for (p, &l) in cur.p.iter_mut().zip(&cur.logits) {
        *p = exp_shifted(l, max);
        sum += *p;
    }
    for p in cur.p.iter_mut() {
        *p /= sum;
    }
}

/// Greedy: the first candidate with the largest logit.
pub fn greedy(cur: &mut Candidates) {
    if cur.is_empty() {
        cur.selected = -1;
        return;
    }
    let mut sel = 0;
    for i in 1..cur.len() {
        if cur.logits[i] > cur.logits[sel] {
            sel = i;
        }
    }
    cur.selected = sel as i64;
}

/// Dist: softmax with a double sum, one uniform double picks by cumulative mass (one draw
/// also for a single candidate, as llama.cpp keeps its stream aligned).
pub fn dist(cur: &mut Candidates, rng: &mut StdRng) {
    let n = cur.len();
    if n == 0 {
        cur.selected = -1;
        return;
    }
    cur.selected = 0;
    if n == 1 {
        rng.uniform_double();
        cur.p[0] = 1.0;
        return;
    }
    let max = if cur.sorted { cur.logits[0] } else { fold_max(&cur.logits) };
    let mut sum = 0f64;
    for (p, &l) in cur.p.iter_mut().zip(&cur.logits) {
        *p = exp_shifted(l, max);
        sum += *p as f64;
    }
    let target = sum * rng.uniform_double();
    let mut run = 0f64;
    let mut found = false;
    for (i, p) in cur.p.iter_mut().enumerate() {
        if !found {
            run += *p as f64;
            if run >= target {
                cur.selected = i as i64;
                found = true;
            }
        }
        *p = (*p as f64 / sum) as f32;
    }
    if !found {
        cur.selected = n as i64 - 1;
    }
}

/// `llama_sampler_top_k_impl`.
pub fn top_k(cur: &mut Candidates, k: i64) {
    if k <= 0 {
        return;
    }
    let k = (k as usize).min(cur.len());
    if !cur.sorted {
        cur.sort_top(k);
    }
    cur.truncate(k);
}

/// First `i + 1` where the float running sum of `probs` reaches `p` with `i + 1 >= min_keep`.
fn top_p_cut(probs: impl Iterator<Item = f32>, p: f32, min_keep: i64) -> Option<usize> {
    let mut cum = 0f32;
    for (i, q) in probs.enumerate() {
        cum += q;
        if cum >= p && i as i64 + 1 >= min_keep {
            return Some(i + 1);
        }
    }
    None
}

/// Top-p: softmax (unsorted), then the smallest best-first prefix whose mass reaches `p`.
/// Unsorted arrays look at the best 256 first and sort everything only when those do not
/// reach `p` (llama.cpp's adaptive partial sort; the kept prefix is the same).
pub fn top_p(cur: &mut Candidates, p: f32, min_keep: i64) {
    if p >= 1.0 || cur.is_empty() {
        return;
    }
    softmax(cur, false);
    if cur.sorted {
        let last = top_p_cut(cur.p.iter().copied(), p, min_keep).unwrap_or(cur.len());
        cur.truncate(last);
        return;
    }
    let mut order = top_k_indices(&cur.logits, 256.min(cur.len()));
    let mut last = top_p_cut(order.iter().map(|&i| cur.p[i as usize]), p, min_keep);
    if last.is_none() && order.len() < cur.len() {
        order = top_k_indices(&cur.logits, cur.len());
        last = top_p_cut(order.iter().map(|&i| cur.p[i as usize]), p, min_keep);
    }
    order.truncate(last.unwrap_or(order.len()));
    cur.take(&order);
    cur.sorted = true;
}

/// Min-p: keep the candidates with logit >= max + logf(p) (at least `min_keep`, and the first).
pub fn min_p(cur: &mut Candidates, p: f32, min_keep: i64) {
    if p <= 0.0 || cur.is_empty() {
        return;
    }
    let log_p = p.ln();
    if !cur.sorted {
        let max = cur.logits.iter().fold(f32::MIN, |m, &x| if m < x { x } else { m });
        let min_logit = max + log_p;
        let keep: Vec<u32> = (0..cur.len() as u32).filter(|&i| cur.logits[i as usize] >= min_logit).collect();
        if !keep.is_empty() && keep.len() as i64 >= min_keep {
            cur.take(&keep);
            return;
        }
        let n = cur.len();
        cur.sort_top(n);
    }
    let min_logit = cur.logits[0] + log_p;
    let mut i = 1;
    while i < cur.len() {
        if cur.logits[i] < min_logit && i as i64 >= min_keep {
            break;
        }
        i += 1;
    }
    cur.truncate(i);
}

/// Locally typical sampling: keep the candidates whose surprise is closest to the entropy
/// until their mass exceeds `p`.
pub fn typical(cur: &mut Candidates, p: f32, min_keep: i64) {
    if p >= 1.0 || cur.is_empty() {
        return;
    }
    softmax(cur, true);
    let mut entropy = 0f32;
    for &q in &cur.p {
        let t = -q * q.ln();
        if !t.is_nan() {
            entropy += t; // p = 0: 0 * -inf; llama.cpp's sum would turn NaN
        }
    }
    let shifted: Vec<f32> = cur.p.iter().map(|&q| (-q.ln() - entropy).abs()).collect();
    let mut order: Vec<u32> = (0..cur.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (shifted[a as usize], shifted[b as usize]);
        x.partial_cmp(&y).unwrap_or_else(|| x.is_nan().cmp(&y.is_nan()))
    });
    let mut cum = 0f32;
    let mut last = order.len();
    for (i, &idx) in order.iter().enumerate() {
        cum += cur.p[idx as usize];
        if cum > p && i as i64 >= min_keep - 1 {
            last = i + 1;
            break;
        }
    }
    order.truncate(last);
    cur.take(&order);
    cur.sorted = false;
}

/// `llama_sampler_temp_impl`: logits / t; t <= 0 keeps only the first maximum (the rest -inf).
pub fn temp(cur: &mut Candidates, t: f32) {
    if cur.is_empty() {
        return;
    }
    if t <= 0.0 {
        let mut max_i = 0;
        let mut max_l = cur.logits[0];
        for i in 1..cur.len() {
            if cur.logits[i] > max_l {
                cur.logits[max_i] = f32::NEG_INFINITY;
                max_i = i;
                max_l = cur.logits[i];
            } else {
                cur.logits[i] = f32::NEG_INFINITY;
            }
        }
        return;
    }
    for l in cur.logits.iter_mut() {
        *l /= t;
    }
}

/// Dynamic temperature: the entropy of the candidates maps into [t - delta, t + delta];
/// `delta <= 0` is plain temperature.
pub fn temp_ext(cur: &mut Candidates, t: f32, delta: f32, exponent: f32) {
    if delta <= 0.0 {
        temp(cur, t);
        return;
    }
    if cur.len() <= 1 {
        return;
    }
    let min_temp = (t - delta).max(0.0);
    let max_temp = t + delta;
    let max_entropy = -(1.0f32 / cur.len() as f32).ln();
    softmax(cur, true);
    let mut entropy = 0f32;
    for &q in &cur.p {
        if q > 0.0 {
            entropy -= q * q.ln();
        }
    }
    let normalized = entropy / max_entropy;
    let dyn_temp = min_temp + (max_temp - min_temp) * normalized.powf(exponent);
    temp(cur, dyn_temp);
    // probabilities again, in double
    let max = cur.logits[0] as f64;
    let mut sum = 0f64;
    for (p, &l) in cur.p.iter_mut().zip(&cur.logits) {
        let e = if max.is_finite() {
            (l as f64 - max).exp()
        } else if max == f64::INFINITY {
            if l as f64 == max { 1.0 } else { 0.0 }
        } else {
            1.0
        };
        *p = e as f32;
        sum += e;
    }
    for p in cur.p.iter_mut() {
        *p = (*p as f64 / sum) as f32;
    }
}

/// XTC: with probability `prob`, drop every candidate whose p reaches `threshold` except
/// the least likely of them.
pub fn xtc(cur: &mut Candidates, prob: f32, threshold: f32, min_keep: i64, rng: &mut StdRng) {
    if prob <= 0.0 || threshold > 0.5 || cur.len() < 2 {
        return;
    }
    if rng.uniform_float() > prob {
        return;
    }
    softmax(cur, true);
    let mut pos_last = 0usize;
    for (i, &q) in cur.p.iter().enumerate() {
        if q >= threshold {
            pos_last = i;
        } else {
            break;
        }
    }
    if (cur.len() - pos_last) as i64 >= min_keep && pos_last > 0 {
        cur.ids.drain(..pos_last);
        cur.logits.drain(..pos_last);
        cur.p.drain(..pos_last);
    }
}

/// Top-n-sigma: logits below max - n * (standard deviation) become -inf (-inf logits are
/// left out of the statistics).
pub fn top_n_sigma(cur: &mut Candidates, n: f32) {
    if n <= 0.0 || cur.len() <= 1 {
        return;
    }
    let mut max = cur.logits[0];
    let mut sum = 0f32;
    let mut count = 0usize;
    for &l in &cur.logits {
        if l != f32::NEG_INFINITY {
            max = if max < l { l } else { max };
            sum += l;
            count += 1;
        }
    }
    let mean = if count > 0 { sum / count as f32 } else { 0.0 };
    let mut acc = 0f32;
    for &l in &cur.logits {
        if l != f32::NEG_INFINITY {
            let d = (l - mean) as f64;
            acc = (acc as f64 + d * d) as f32;
        }
    }
    let std = if count > 0 { (acc / count as f32).sqrt() } else { 0.0 };
    let cut = max - n * std;
    for l in cur.logits.iter_mut() {
        if *l < cut {
            *l = f32::NEG_INFINITY;
        }
    }
}

/// C's `int(k)` for a float: truncation in range; NaN and out-of-range values are what the
/// CPU's conversion gives (x86's cvttss2si: INT_MIN; aarch64's fcvtzs saturates, NaN -> 0).
pub fn c_int(k: f32, x86: bool) -> i32 {
    if k.is_finite() && (k as f64) > -2147483649.0 && (k as f64) < 2147483648.0 {
        return k as i32;
    }
    if x86 { i32::MIN } else { k as i32 }
}

const X86: bool = cfg!(any(target_arch = "x86_64", target_arch = "x86"));

/// Mirostat 1.0: estimate the Zipf exponent from the `m` most likely candidates, keep the
/// k that give surprise `mu`, draw one, move `mu` toward `tau`.
pub fn mirostat(cur: &mut Candidates, n_vocab: i32, tau: f32, eta: f32, m: i32, mu: &mut f32, rng: &mut StdRng) {
    if cur.is_empty() {
        cur.selected = -1;
        return;
    }
    softmax(cur, true);
    let n = if m <= 0 { cur.len() - 1 } else { (m as usize - 1).min(cur.len() - 1) };
    let (mut sum_ti_bi, mut sum_ti_sq) = (0f32, 0f32);
    for i in 0..n {
        let t_i = ((i + 2) as f32 / (i + 1) as f32).ln();
        let b_i = (cur.p[i] / cur.p[i + 1]).ln();
        sum_ti_bi += t_i * b_i;
        sum_ti_sq += t_i * t_i;
    }
    let s_hat = sum_ti_bi / sum_ti_sq;
    let eps = s_hat - 1.0;
    let k = ((eps * 2f32.powf(*mu)) / (1.0 - (n_vocab as f32).powf(-eps))).powf(1.0 / s_hat);
    top_k(cur, c_int(k, X86).max(1) as i64);
    softmax(cur, true);
    let idx = rng.discrete(&cur.p);
    cur.selected = idx as i64;
    *mu -= eta * (-cur.p[idx].log2() - tau);
}

/// Mirostat 2.0: keep the candidates whose surprise -log2(p) is at most `mu` (at least
/// one), draw one, move `mu` toward `tau`.
pub fn mirostat_v2(cur: &mut Candidates, tau: f32, eta: f32, mu: &mut f32, rng: &mut StdRng) {
    if cur.is_empty() {
        cur.selected = -1;
        return;
    }
    softmax(cur, true);
    let cut = cur.p.iter().position(|&q| -q.log2() > *mu).unwrap_or(cur.len());
    cur.truncate(cut.max(1));
    softmax(cur, true);
    let idx = rng.discrete(&cur.p);
    cur.selected = idx as i64;
    *mu -= eta * (-cur.p[idx].log2() - tau);
}

/// Repeat / frequency / presence penalties for the tokens in `counts` (token -> times seen).
pub fn penalties(cur: &mut Candidates, counts: &HashMap<i32, i32>, repeat: f32, freq: f32, present: f32) {
    let toks: Vec<i32> = counts.keys().copied().collect();
    for (tok, pos) in cur.positions(&toks) {
        let count = counts[&tok];
        let l = &mut cur.logits[pos];
        if *l <= 0.0 {
            *l *= repeat;
        } else {
            *l /= repeat;
        }
        *l -= count as f32 * freq + if count > 0 { present } else { 0.0 };
    }
    cur.sorted = false;
}

/// Logit bias: add each bias to its token's logit (the first entry for a token that is
/// listed twice and not at its own position, as llama.cpp's search).
pub fn logit_bias(cur: &mut Candidates, biases: &[(i32, f32)]) {
    if biases.is_empty() {
        return;
    }
    let mut search = Vec::new();
    for &(tok, bias) in biases {
        let t = tok as usize;
        if tok >= 0 && t < cur.len() && cur.ids[t] == tok {
            cur.logits[t] += bias;
        } else {
            search.push((tok, bias));
        }
    }
    if search.is_empty() {
        return;
    }
    for i in 0..cur.len() {
        if let Some(&(_, bias)) = search.iter().find(|&&(tok, _)| tok == cur.ids[i]) {
            cur.logits[i] += bias;
        }
    }
}

/// DRY parameters: breakers map a head token to the tails that complete a sequence breaker
/// (an empty tail: the head alone is one).
#[derive(Clone, Debug)]
pub struct Dry {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: i64,
    pub penalty_last_n: usize,
    pub breakers: HashMap<i32, Vec<Vec<i32>>>,
}

impl Dry {
    fn enabled(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.penalty_last_n != 0
    }
}

/// DRY ("don't repeat yourself"): penalize the tokens that would extend a repetition of
/// the recent context `last` (oldest first), except across sequence breakers. llama.cpp's
/// reverse Z-algorithm.
pub fn dry(cur: &mut Candidates, d: &Dry, last: &VecDeque<i32>) {
    if !d.enabled() {
        return;
    }
    let n = last.len().min(d.penalty_last_n) as i64;
    if n <= d.allowed_length {
        return;
    }
    let rat = |i: i64| last[last.len() - 1 - i as usize];
    // step 1: the nearest sequence breaker limits the repetition length
    let mut rep_limit = n;
    for i in 0..n {
        let Some(tails) = d.breakers.get(&rat(i)) else { continue };
        let mut longest = -1i64;
        for tail in tails {
            let sl = tail.len() as i64;
            if longest < sl && sl <= i && (0..sl).all(|o| tail[o as usize] == rat(i - o - 1)) {
                longest = sl;
            }
        }
        if longest >= 0 {
            rep_limit = i - longest;
            break;
        }
    }
    if rep_limit < d.allowed_length {
        return;
    }
    // step 2: repeat[last - k] = length of the suffix repeated k tokens back
    let nu = n as usize;
    let mut repeat = vec![0i64; nu];
    let lastp = n - 1;
    let (mut lt, mut rt) = (0i64, 0i64);
    for k in 1..n {
        if k > rt {
            let mut m = 0;
            while m + k < n && rat(m) == rat(m + k) {
                m += 1;
            }
            repeat[(lastp - k) as usize] = m.min(rep_limit);
            if m > 0 {
                lt = k;
                rt = k + m - 1;
            }
        } else {
            let p = k - lt;
            let right_len = rt - k + 1;
            if repeat[(lastp - p) as usize] < right_len {
                repeat[(lastp - k) as usize] = repeat[(lastp - p) as usize].min(rep_limit);
            } else {
                let mut i = rt + 1;
                while i < n && rat(i) == rat(i - k) {
                    i += 1;
                }
                repeat[(lastp - k) as usize] = (i - k).min(rep_limit);
                lt = k;
                rt = i - 1;
            }
        }
    }
    // step 3: the token after each repeat would extend it
    let mut max_rep: HashMap<i32, i64> = HashMap::new();
    for i in 0..(n - 1) {
        let rl = repeat[i as usize];
        if rl >= d.allowed_length {
            let tok = rat(n - 2 - i);
            let e = max_rep.entry(tok).or_insert(-1);
            if *e < rl {
                *e = rl;
            }
        }
    }
    if max_rep.is_empty() {
        cur.sorted = false;
        return;
    }
    // step 4: penalties, the exponent clamped so base^exp stays a finite float
    let max_exp = if d.base > 1.000001 { (88.7228391f32 / d.base.ln()) as i64 } else { 0 };
    let toks: Vec<i32> = max_rep.keys().copied().collect();
    for (tok, pos) in cur.positions(&toks) {
        if d.breakers.get(&tok).is_some_and(|t| t.iter().any(|s| s.is_empty())) {
            continue;
        }
        let mut e = max_rep[&tok] - d.allowed_length;
        if max_exp > 0 && e > max_exp {
            e = max_exp;
        }
        let pen = (d.multiplier as f64 * (d.base as f64).powf(e as f64)) as f32;
        cur.logits[pos] -= pen;
    }
    cur.sorted = false;
}

/// `std::clamp(v, lo, hi)` (NaN passes through).
fn clamp(v: f32, lo: f32, hi: f32) -> f32 {
    if v < lo { lo } else if hi < v { hi } else { v }
}

/// Adaptive-p's state: the target, the EMA of the chosen tokens' original probabilities,
/// and what the last apply chose (for accept).
#[derive(Clone, Debug)]
pub struct AdaptiveP {
    pub target: f32,
    pub decay: f32,
    pub weighted_sum: f32,
    pub total_weight: f32,
    original: Vec<f32>,
    pending: Option<(i32, usize)>,
}

impl AdaptiveP {
    /// `decay` is clamped to [0, 0.99].
    pub fn new(target: f32, decay: f32) -> Self {
        let decay = clamp(decay, 0.0, 0.99);
        let mut a = AdaptiveP { target, decay, weighted_sum: 0.0, total_weight: 0.0, original: Vec::new(), pending: None };
        a.reset();
        a
    }

    fn reset(&mut self) {
        self.weighted_sum = self.target / (1.0 - self.decay);
        self.total_weight = 1.0 / (1.0 - self.decay);
        self.pending = None;
    }

    fn accept(&mut self, token: i32) {
        if let Some((id, idx)) = self.pending.take() {
            if id == token {
                self.weighted_sum = self.original[idx] + self.decay * self.weighted_sum;
                self.total_weight = 1.0 + self.decay * self.total_weight;
            }
        }
    }
}

/// Adaptive-p: select tokens whose original probability is near the target, steered by the
/// EMA of the chosen tokens' probabilities (a negative target samples the distribution as is).
pub fn adaptive_p(cur: &mut Candidates, a: &mut AdaptiveP, rng: &mut StdRng) {
    if cur.is_empty() {
        cur.selected = -1;
        return;
    }
    softmax(cur, false);
    if a.target < 0.0 {
        cur.selected = rng.discrete(&cur.p) as i64;
        return;
    }
    a.original.clone_from(&cur.p);
    let target = clamp(a.target, 0.0, 1.0);
    let adapted = clamp(
        if a.total_weight == 0.0 { target } else { 2.0 * target - a.weighted_sum / a.total_weight },
        0.0,
        1.0,
    );
    const INV_WIDTH: f32 = 1.0 / 0.3;
    for (l, &q) in cur.logits.iter_mut().zip(&cur.p) {
        if *l != f32::NEG_INFINITY {
            let d = ((q - adapted) * INV_WIDTH).abs();
            *l = 5.0 - 10.0 * d * d / (1.0 + d);
        }
    }
    softmax(cur, false);
    let idx = rng.discrete(&cur.p);
    cur.selected = idx as i64;
    a.pending = Some((cur.ids[idx], idx));
}

/// Fill-in-the-middle (llama.cpp's infill sampler; use it after top-k / top-p): softmax
/// (sorted); when 3 * p(EOG) * n > p(text) keep only the end-of-generation tokens;
/// otherwise merge the probability of each token into a token its piece prefixes (the
/// likelier of the two keeps it), drop text tokens under p = 0.2, renormalize, and drop
/// text tokens under 1 / (text tokens + 1); when no text token is left, the one candidate
/// is `eot` (logit 1). `piece` gives a token's text (llama_token_to_piece, not special);
/// Err when `eot` is needed and is -1.
pub fn infill(cur: &mut Candidates, is_eog: impl Fn(i32) -> bool, piece: impl Fn(i32) -> Vec<u8>, eot: i32) -> Result<(), String> {
    if cur.is_empty() {
        return Ok(());
    }
    softmax(cur, true);
    let eog: Vec<bool> = cur.ids.iter().map(|&t| is_eog(t)).collect();
    let (mut p_txt, mut p_eog) = (0f32, 0f32);
    for (i, &q) in cur.p.iter().enumerate() {
        if eog[i] {
            p_eog += q;
        } else {
            p_txt += q;
        }
    }
    let n = cur.len();
    if 3.0 * p_eog * n as f32 > p_txt {
        let keep: Vec<u32> = (0..n as u32).filter(|&i| eog[i as usize]).collect();
        let sum = keep.iter().fold(0f32, |a, &i| a + cur.p[i as usize]);
        cur.take(&keep);
        for q in cur.p.iter_mut() {
            *q /= sum;
        }
        return Ok(());
    }
    let pieces: Vec<Vec<u8>> = cur.ids.iter().map(|&t| piece(t)).collect();
    for i0 in 0..n {
        for i1 in 0..n {
            if cur.logits[i0] == f32::NEG_INFINITY {
                break;
            }
            if i0 == i1 || cur.logits[i1] == f32::NEG_INFINITY {
                continue;
            }
            let (a, b) = (&pieces[i0], &pieces[i1]);
            if !a.is_empty() && a.len() <= b.len() && b[..a.len()] == a[..] {
                let (dst, src) = if cur.p[i1] > cur.p[i0] { (i1, i0) } else { (i0, i1) };
                cur.p[dst] += cur.p[src];
                cur.logits[src] = f32::NEG_INFINITY;
                cur.p[src] = 0.0;
            }
        }
    }
    let mut keep = Vec::new();
    let mut n_text = 0usize;
    let mut sum = 0f32;
    for i in 0..n {
        if cur.p[i] < 0.2 && !eog[i] {
            continue;
        }
        n_text += usize::from(!eog[i]);
        sum += cur.p[i];
        keep.push(i as u32);
    }
    if n_text == 0 {
        if eot < 0 {
            return Err("infill sampler: the vocabulary has neither an EOT nor an EOS token".into());
        }
        let p0 = cur.p[keep.first().copied().unwrap_or(0) as usize];
        *cur = Candidates { ids: vec![eot], logits: vec![1.0], p: vec![p0], selected: cur.selected, sorted: cur.sorted };
        return Ok(());
    }
    let eog: Vec<bool> = keep.iter().map(|&i| eog[i as usize]).collect();
    cur.take(&keep);
    for q in cur.p.iter_mut() {
        *q /= sum;
    }
    let thold = (1.0f64 / (n_text + 1) as f64) as f32;
    let keep: Vec<u32> = (0..cur.len() as u32).filter(|&i| !(cur.p[i as usize] < thold && !eog[i as usize])).collect();
    let sum = keep.iter().fold(0f32, |a, &i| a + cur.p[i as usize]);
    cur.take(&keep);
    for q in cur.p.iter_mut() {
        *q /= sum;
    }
    Ok(())
}

/// One built-in sampler: its parameters and its state.
#[derive(Clone, Debug)]
pub enum Sampler {
    Greedy,
    Dist { rng: StdRng },
    TopK { k: i64 },
    TopP { p: f32, min_keep: i64 },
    MinP { p: f32, min_keep: i64 },
    Typical { p: f32, min_keep: i64 },
    Temp { t: f32 },
    TempExt { t: f32, delta: f32, exponent: f32 },
    Xtc { p: f32, t: f32, min_keep: i64, rng: StdRng },
    TopNSigma { n: f32 },
    Mirostat { n_vocab: i32, tau: f32, eta: f32, m: i32, mu: f32, rng: StdRng },
    MirostatV2 { tau: f32, eta: f32, mu: f32, rng: StdRng },
    Penalties { last_n: usize, repeat: f32, freq: f32, present: f32, prev: VecDeque<i32>, counts: HashMap<i32, i32> },
    Dry { params: Dry, last: VecDeque<i32> },
    LogitBias { biases: Vec<(i32, f32)> },
    AdaptiveP { state: AdaptiveP, rng: StdRng },
}

impl Sampler {
    pub fn apply(&mut self, cur: &mut Candidates) {
        match self {
            Sampler::Greedy => greedy(cur),
            Sampler::Dist { rng } => dist(cur, rng),
            Sampler::TopK { k } => top_k(cur, *k),
            Sampler::TopP { p, min_keep } => top_p(cur, *p, *min_keep),
            Sampler::MinP { p, min_keep } => min_p(cur, *p, *min_keep),
            Sampler::Typical { p, min_keep } => typical(cur, *p, *min_keep),
            Sampler::Temp { t } => temp(cur, *t),
            Sampler::TempExt { t, delta, exponent } => temp_ext(cur, *t, *delta, *exponent),
            Sampler::Xtc { p, t, min_keep, rng } => xtc(cur, *p, *t, *min_keep, rng),
            Sampler::TopNSigma { n } => top_n_sigma(cur, *n),
            Sampler::Mirostat { n_vocab, tau, eta, m, mu, rng } => mirostat(cur, *n_vocab, *tau, *eta, *m, mu, rng),
            Sampler::MirostatV2 { tau, eta, mu, rng } => mirostat_v2(cur, *tau, *eta, mu, rng),
            Sampler::Penalties { last_n, repeat, freq, present, counts, .. } => {
                if *last_n == 0 || (*repeat == 1.0 && *freq == 0.0 && *present == 0.0) {
                    return;
                }
                penalties(cur, counts, *repeat, *freq, *present)
            }
            Sampler::Dry { params, last } => dry(cur, params, last),
            Sampler::LogitBias { biases } => logit_bias(cur, biases),
            Sampler::AdaptiveP { state, rng } => adaptive_p(cur, state, rng),
        }
    }

    /// The chain chose `token`.
    pub fn accept(&mut self, token: i32) {
        match self {
            Sampler::Penalties { last_n, prev, counts, .. } => {
                if *last_n == 0 {
                    return;
                }
                *counts.entry(token).or_insert(0) += 1;
                if prev.len() >= *last_n {
                    if let Some(old) = prev.pop_front() {
                        if let Some(c) = counts.get_mut(&old) {
                            *c -= 1;
                            if *c == 0 {
                                counts.remove(&old);
                            }
                        }
                    }
                }
                prev.push_back(token);
            }
            Sampler::AdaptiveP { state, .. } => state.accept(token),
            Sampler::Dry { params, last } => {
                if !params.enabled() {
                    return;
                }
                last.push_back(token);
                if last.len() > params.penalty_last_n {
                    last.pop_front();
                }
            }
            _ => {}
        }
    }

    /// Back to the freshly built state; samplers with an RNG reseed it with `seed`.
    pub fn reset(&mut self, seed: u32) {
        match self {
            Sampler::Dist { rng } | Sampler::Xtc { rng, .. } => rng.seed(seed),
            Sampler::Mirostat { tau, mu, rng, .. } | Sampler::MirostatV2 { tau, mu, rng, .. } => {
                *mu = 2.0 * *tau;
                rng.seed(seed);
            }
            Sampler::Penalties { prev, counts, .. } => {
                prev.clear();
                counts.clear();
            }
            Sampler::Dry { last, .. } => last.clear(),
            Sampler::AdaptiveP { state, rng } => {
                state.reset();
                rng.seed(seed);
            }
            _ => {}
        }
    }
}

/// The candidates a chain starting with `first` works on for one row of logits, and how
/// many samplers that already applied: the whole vocabulary, or for a leading top-k its
/// candidates taken straight from the row (the same array, without building the full one).
pub fn start(row: &[f32], first: Option<&Sampler>) -> (Candidates, usize) {
    match first {
        Some(Sampler::TopK { k }) if *k > 0 => (Candidates::top_k_of_row(row, *k as usize), 1),
        _ => (Candidates::from_row(row), 0),
    }
}

/// Applies `chain` to one row of logits: the samplers in turn on the whole vocabulary (a
/// leading top-k takes its candidates straight from the row). Accepts the selected token
/// in every sampler when `accept` and one was selected.
pub fn sample_row(chain: &mut [&mut Sampler], row: &[f32], accept: bool) -> Candidates {
    let (mut cur, skip) = start(row, chain.first().map(|s| &**s));
    for s in chain.iter_mut().skip(skip) {
        s.apply(&mut cur);
    }
    if accept {
        if let Some(tok) = cur.token() {
            for s in chain.iter_mut() {
                s.accept(tok);
            }
        }
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(l: &[f32]) -> Candidates {
        Candidates::from_row(l)
    }

    #[test]
    fn llama_cpp_test_sampling_cases() {
        // tests/test-sampling.cpp: top-k 1 / 3, top-p .3 / .7 / 1, min-p .76
        let l: Vec<f32> = [0.1f32, 0.2, 0.3, 0.4].iter().map(|p| p.ln()).collect();
        let mut c = cands(&l);
        top_k(&mut c, 3);
        softmax(&mut c, true);
        let want = [4.0 / 9.0, 3.0 / 9.0, 2.0 / 9.0];
        for (a, b) in c.p.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{:?}", c.p);
        }
        let mut c = cands(&l);
        top_p(&mut c, 0.7, 1);
        assert_eq!(c.ids, vec![3, 2]);
        let mut c = cands(&l);
        min_p(&mut c, 0.76, 1);
        assert_eq!(c.ids, vec![3]); // 0.3 / 0.4 = 0.75 < 0.76
    }

    #[test]
    fn top_k_of_row_equals_full_array_then_top_k() {
        let row: Vec<f32> = (0..5000).map(|i| ((i * 7919) % 1000) as f32 * 0.01).collect();
        let mut full = cands(&row);
        top_k(&mut full, 40);
        assert_eq!(Candidates::top_k_of_row(&row, 40), full);
    }

    #[test]
    fn chain_selects_and_accepts() {
        let row = [0.0f32, 3.0, 1.0, 2.0];
        let mut pen = Sampler::Penalties { last_n: 4, repeat: 2.0, freq: 0.0, present: 0.0, prev: VecDeque::new(), counts: HashMap::new() };
        let mut g = Sampler::Greedy;
        let c = sample_row(&mut [&mut pen, &mut g], &row, true);
        assert_eq!(c.token(), Some(1));
        // 3.0 / 2 = 1.5 now loses to 2.0
        let c = sample_row(&mut [&mut pen, &mut g], &row, true);
        assert_eq!(c.token(), Some(3));
    }

    #[test]
    fn c_int_follows_the_cpu() {
        assert_eq!(c_int(f32::NAN, true), i32::MIN);
        assert_eq!(c_int(f32::NAN, false), 0);
        assert_eq!(c_int(f32::INFINITY, false), i32::MAX);
        assert_eq!(c_int(7.9, true), 7);
        assert_eq!(c_int(-2.5, false), -2);
    }
}
