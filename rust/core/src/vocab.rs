//! The vocabulary's tables (pipeline step 5) and the two merge loops that read them
//! (step 9), kept compact: a 262k-token vocabulary as Python dicts of str and bytes,
//! tuples for the merges and a float object per score took ~30 MiB per 50k tokens; here
//! it is one byte blob, end offsets and two open-addressing tables of u32 ids.
//!
//! Everything else about tokenizing (pre-tokenizer regexes, special tokens, the word
//! caches, UGM/WPM, detokenizing) stays in Python; the Python `Vocab` reads these tables
//! through `pyllama._core.VocabStore`.
//!
//! Semantics follow llama.cpp's `llama_vocab`:
//! - `token_to_id` is an `unordered_map` filled in id order, so for duplicate texts the
//!   later id wins;
//! - a merge `"a b"` is split at the first space after its first byte, and `bpe_ranks`
//!   is filled with `emplace`, so for duplicate pairs the first (lowest) rank wins;
//! - the BPE merge loop (`llm_tokenizer_bpe_session`) pops the lowest rank, leftmost on
//!   ties; the SPM loop (`llm_tokenizer_spm_session`) pops the highest score, leftmost on
//!   ties, and both skip queue entries made stale by an earlier merge.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Bytes to a 64-bit hash (multiply-rotate over 8-byte words; keys are short).
fn hash(b: &[u8]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (b.len() as u64).wrapping_mul(K) ^ 0x243F_6A88_85A3_08D3;
    let mut chunks = b.chunks_exact(8);
    for c in &mut chunks {
        h = (h ^ u64::from_le_bytes(c.try_into().unwrap())).wrapping_mul(K).rotate_left(31);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h ^ u64::from_le_bytes(w)).wrapping_mul(K).rotate_left(31);
    }
    h ^= h >> 32;
    h = h.wrapping_mul(K);
    h ^ (h >> 29)
}

fn pair_hash(l: &[u8], r: &[u8]) -> u64 {
    let h = hash(l).wrapping_mul(0xFF51_AFD7_ED55_8CCD) ^ hash(r);
    h ^ (h >> 31)
}

/// An open-addressing table of `id + 1` (0 = empty), linear probing.
struct Index {
    slots: Vec<u32>,
    mask: usize,
}

impl Index {
    fn with_len(n: usize) -> Index {
        let cap = (n.max(8) * 2).next_power_of_two();
        Index { slots: vec![0; cap], mask: cap - 1 }
    }

    /// The slot holding an id for which `eq` holds, or the empty slot where it would go.
    fn find(&self, h: u64, mut eq: impl FnMut(u32) -> bool) -> (usize, Option<u32>) {
        let mut i = h as usize & self.mask;
        loop {
            match self.slots[i] {
                0 => return (i, None),
                s if eq(s - 1) => return (i, Some(s - 1)),
                _ => i = (i + 1) & self.mask,
            }
        }
    }
}

/// Byte strings in one blob; `ends[i]` is where string `i` stops (4 GiB at most).
#[derive(Default)]
struct Strings {
    blob: Vec<u8>,
    ends: Vec<u32>,
}

const TOO_LARGE: &str = "the vocabulary's texts exceed 4 GiB";

impl Strings {
    fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.blob[start..self.ends[i] as usize]
    }
    /// False (and nothing stored) when the blob would pass 4 GiB.
    fn push(&mut self, b: &[u8]) -> bool {
        let Ok(end) = u32::try_from(self.blob.len() + b.len()) else { return false };
        self.blob.extend_from_slice(b);
        self.ends.push(end);
        true
    }
    fn len(&self) -> usize {
        self.ends.len()
    }
}

struct Merges {
    texts: Strings,
    /// Byte offset of the separating space in each merge (0: no such space, never matches).
    split: Vec<u32>,
    index: Index,
}

/// The token table, the text -> id index, scores, token types and the BPE merges.
pub struct VocabStore {
    tokens: Strings,
    index: Index,
    scores: Vec<f32>,
    types: Vec<i32>,
    merges: Option<Merges>,
    /// Ids whose text was empty (stored as `[EMPTY_<id>]`, as llama.cpp's loader does).
    pub empty: Vec<u32>,
    /// Token per byte for SPM byte fallback: `<0xXX>`, else the byte itself.
    byte_tokens: [Option<u32>; 256],
}

/// Builds a [`VocabStore`] token by token.
#[derive(Default)]
pub struct VocabStoreBuilder {
    tokens: Strings,
    empty: Vec<u32>,
    too_large: bool,
}

impl VocabStoreBuilder {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn reserve(&mut self, n: usize, bytes: usize) {
        self.tokens.ends.reserve_exact(n);
        self.tokens.blob.reserve_exact(bytes);
    }
    pub fn push(&mut self, text: &[u8]) {
        let ok = if text.is_empty() {
            let id = self.tokens.len();
            self.empty.push(id as u32);
            self.tokens.push(format!("[EMPTY_{id}]").as_bytes())
        } else {
            self.tokens.push(text)
        };
        self.too_large |= !ok;
    }
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.len() == 0
    }

    /// `scores` and `types` have at least one entry per token (or are empty: all 0 and
    /// all 1 = normal); `merges` are the `"left right"` strings in rank order.
    pub fn finish<'m>(
        self,
        mut scores: Vec<f32>,
        mut types: Vec<i32>,
        merges: Option<impl Iterator<Item = &'m [u8]>>,
    ) -> std::result::Result<VocabStore, String> {
        if self.too_large {
            return Err(TOO_LARGE.into());
        }
        let mut tokens = self.tokens;
        tokens.blob.shrink_to_fit();
        let n = tokens.len();
        let mut index = Index::with_len(n);
        for id in 0..n {
            let t = tokens.get(id);
            let (slot, _) = index.find(hash(t), |o| tokens.get(o as usize) == t);
            index.slots[slot] = id as u32 + 1; // a later duplicate replaces the earlier id
        }
        scores.resize(n, 0.0);
        scores.truncate(n);
        types.resize(n, 1);
        types.truncate(n);
        // A BYTE token stands for the byte its text names ("<0x0A>"): detokenizing and SPM's
        // byte fallback read it from the text, so any other text is a broken vocabulary.
        for (id, &t) in types.iter().enumerate() {
            if t == TOKEN_TYPE_BYTE {
                let text = tokens.get(id);
                let ok = text.len() == 6 && text.starts_with(b"<0x") && text[5] == b'>' && text[3..5].iter().all(u8::is_ascii_hexdigit);
                if !ok {
                    return Err(format!(
                        "tokenizer.ggml.token_type: token {id} is a BYTE token (type 6) but its text {:?} is not of the form <0xXX>",
                        String::from_utf8_lossy(text)
                    ));
                }
            }
        }
        let merges = merges.map(|it| -> std::result::Result<Merges, String> {
            let mut texts = Strings::default();
            let mut split = Vec::new();
            for m in it {
                if !texts.push(m) {
                    return Err(TOO_LARGE.into());
                }
                let p = m.iter().skip(1).position(|&c| c == b' ').map_or(0, |p| p + 1);
                split.push(p as u32);
            }
            texts.blob.shrink_to_fit();
            let mut index = Index::with_len(texts.len());
            for rank in 0..texts.len() {
                let p = split[rank] as usize;
                if p == 0 {
                    continue;
                }
                let m = texts.get(rank);
                let (l, r) = (&m[..p], &m[p + 1..]);
                let (slot, found) = index.find(pair_hash(l, r), |o| {
                    let om = texts.get(o as usize);
                    let op = split[o as usize] as usize;
                    &om[..op] == l && &om[op + 1..] == r
                });
                if found.is_none() {
                    index.slots[slot] = rank as u32 + 1; // emplace: the first rank stays
                }
            }
            Ok(Merges { texts, split, index })
        });
        let merges = merges.transpose()?;
        let mut store = VocabStore { tokens, index, scores, types, merges, empty: self.empty, byte_tokens: [None; 256] };
        for b in 0..256usize {
            store.byte_tokens[b] = store.id(format!("<0x{b:02X}>").as_bytes()).or_else(|| store.id(&[b as u8]));
        }
        Ok(store)
    }
}

/// Lead-byte length of a UTF-8 sequence (llama.cpp's `unicode_len_utf8`).
fn utf8_len(b: u8) -> usize {
    const LEN: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LEN[(b >> 4) as usize]
}

/// Symbols of a merge loop: byte ranges over the input with a doubly linked list.
struct Symbols {
    start: Vec<usize>,
    len: Vec<usize>,
    prev: Vec<isize>,
    next: Vec<isize>,
}

impl Symbols {
    /// One symbol per UTF-8 character (a truncated sequence at the end is one symbol).
    fn of(text: &[u8]) -> Symbols {
        let mut start = Vec::new();
        let mut len = Vec::new();
        let mut off = 0;
        while off < text.len() {
            let n = utf8_len(text[off]).min(text.len() - off);
            start.push(off);
            len.push(n);
            off += n;
        }
        let m = start.len() as isize;
        Symbols { start, len, prev: (-1..m - 1).collect(), next: (1..=m).map(|i| if i == m { -1 } else { i }).collect() }
    }
    fn text<'t>(&self, text: &'t [u8], i: usize) -> &'t [u8] {
        &text[self.start[i]..self.start[i] + self.len[i]]
    }
    /// llama.cpp's merge loop over the symbols of `text`: queue every adjacent pair that
    /// `key(left, right, both)` scores (greater key first, then leftmost), pop, skip entries
    /// made stale by an earlier merge, merge, and queue the merged symbol's new pairs.
    fn merged(text: &[u8], key: impl Fn(&[u8], &[u8], &[u8]) -> Option<f64>) -> Symbols {
        let mut sym = Symbols::of(text);
        let mut heap = BinaryHeap::new();
        let push = |heap: &mut BinaryHeap<Bigram>, sym: &Symbols, l: isize, r: isize| {
            if l < 0 || r < 0 {
                return;
            }
            let (l, r) = (l as usize, r as usize);
            let size = sym.len[l] + sym.len[r];
            let both = &text[sym.start[l]..sym.start[l] + size];
            if let Some(k) = key(sym.text(text, l), sym.text(text, r), both) {
                heap.push(Bigram { key: k, left: l, right: r, size });
            }
        };
        for i in 1..sym.start.len() {
            push(&mut heap, &sym, i as isize - 1, i as isize);
        }
        while let Some(b) = heap.pop() {
            let (ll, rl) = (sym.len[b.left], sym.len[b.right]);
            if ll == 0 || rl == 0 || ll + rl != b.size {
                continue;
            }
            sym.merge(b.left, b.right);
            push(&mut heap, &sym, sym.prev[b.left], b.left as isize);
            push(&mut heap, &sym, b.left as isize, sym.next[b.left]);
        }
        sym
    }

    /// The texts of the symbols left, in order.
    fn pieces<'t>(&'t self, text: &'t [u8]) -> impl Iterator<Item = &'t [u8]> + 't {
        let mut i: isize = if self.start.is_empty() { -1 } else { 0 };
        std::iter::from_fn(move || {
            if i < 0 {
                return None;
            }
            let s = self.text(text, i as usize);
            i = self.next[i as usize];
            Some(s)
        })
    }

    /// Merge `right` into `left`.
    fn merge(&mut self, left: usize, right: usize) {
        self.len[left] += self.len[right];
        self.len[right] = 0;
        let nx = self.next[right];
        self.next[left] = nx;
        if nx >= 0 {
            self.prev[nx as usize] = left as isize;
        }
    }
}

/// A queued bigram: BPE orders by lowest rank, SPM by highest score; then leftmost.
#[derive(PartialEq)]
struct Bigram {
    key: f64,
    left: usize,
    right: usize,
    size: usize,
}

impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Bigram {
    /// Max-heap: the greater key pops first, then the smaller left index.
    fn cmp(&self, o: &Self) -> Ordering {
        self.key.partial_cmp(&o.key).unwrap_or(Ordering::Equal).then_with(|| o.left.cmp(&self.left))
    }
}

/// Options of the BPE word loop (from the pre-tokenizer type).
#[derive(Clone, Copy, Debug, Default)]
pub struct BpeOptions {
    /// Words are GPT-2 byte-encoded: a leftover byte falls back to its own token.
    pub byte_encode: bool,
    /// A word that is itself a token is emitted whole (llama-3 style).
    pub ignore_merges: bool,
    /// A run of newlines that is a token stays whole (Gemma 4).
    pub newline_runs: bool,
}

impl VocabStore {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tokens.len() == 0
    }
    pub fn token(&self, id: usize) -> &[u8] {
        self.tokens.get(id)
    }
    pub fn id(&self, text: &[u8]) -> Option<u32> {
        self.index.find(hash(text), |o| self.tokens.get(o as usize) == text).1
    }
    pub fn scores(&self) -> &[f32] {
        &self.scores
    }
    pub fn types(&self) -> &[i32] {
        &self.types
    }
    pub fn has_merges(&self) -> bool {
        self.merges.is_some()
    }
    pub fn n_merges(&self) -> usize {
        self.merges.as_ref().map_or(0, |m| m.texts.len())
    }
    pub fn max_token_len(&self) -> usize {
        (0..self.len()).map(|i| self.token(i).len()).max().unwrap_or(0)
    }
    pub fn byte_token(&self, b: u8) -> Option<u32> {
        self.byte_tokens[b as usize]
    }

    /// Rank of the merge `left right` (lower merges first).
    pub fn rank(&self, left: &[u8], right: &[u8]) -> Option<u32> {
        let m = self.merges.as_ref()?;
        m.index
            .find(pair_hash(left, right), |o| {
                let om = m.texts.get(o as usize);
                let op = m.split[o as usize] as usize;
                &om[..op] == left && &om[op + 1..] == right
            })
            .1
    }

    /// Tokens with U+2581 right after some other character (SPM "bridge" tokens).
    pub fn bridge_tokens(&self) -> Vec<&[u8]> {
        const SP: &[u8] = "\u{2581}".as_bytes();
        let mut out: Vec<&[u8]> = (0..self.len())
            .map(|i| self.token(i))
            .filter(|t| {
                (1..t.len().saturating_sub(2)).any(|i| &t[i..i + 3] == SP && !(i >= 3 && &t[i - 3..i] == SP))
            })
            .collect();
        out.sort();
        out
    }

    /// Ids of one pre-tokenized word (already byte-encoded when `opts.byte_encode`).
    pub fn bpe_word(&self, word: &[u8], opts: BpeOptions, out: &mut Vec<u32>) {
        if opts.ignore_merges {
            if let Some(id) = self.id(word) {
                out.push(id);
                return;
            }
        }
        if opts.newline_runs && !word.is_empty() && word.iter().all(|&c| c == b'\n') {
            if let Some(id) = self.id(word) {
                out.push(id);
                return;
            }
        }
        // lowest rank first: the key is the negated rank
        let sym = Symbols::merged(word, |l, r, _| self.rank(l, r).map(|rank| -(rank as f64)));
        for s in sym.pieces(word) {
            if let Some(id) = self.id(s) {
                out.push(id);
                continue;
            }
            for &c in s {
                let t = if opts.byte_encode {
                    // the GPT-2 stand-in of a byte >= 0x80 is never a one-byte text
                    if c < 0x80 {
                        self.id(&[c])
                    } else {
                        None
                    }
                } else {
                    self.id(format!("<0x{c:02X}>").as_bytes())
                };
                out.extend(t); // bytes without a token are dropped, as in llama.cpp
            }
        }
    }

    /// SentencePiece BPE over `text` (spaces already escaped). Err(byte) when byte
    /// fallback needs a byte that has no token.
    pub fn spm(&self, text: &[u8], out: &mut Vec<u32>) -> Result<(), u8> {
        if text.is_empty() {
            return Ok(());
        }
        // highest score first: a pair is queued when its concatenation is a token
        let sym = Symbols::merged(text, |_, _, both| self.id(both).map(|id| self.scores[id as usize] as f64));
        for s in sym.pieces(text) {
            if let Some(id) = self.id(s) {
                out.push(id);
            } else {
                for &c in s {
                    out.push(self.byte_tokens[c as usize].ok_or(c)?);
                }
            }
        }
        Ok(())
    }
}

/// llama.h's LLAMA_TOKEN_TYPE_BYTE.
const TOKEN_TYPE_BYTE: i32 = 6;

/// Build the store from GGUF metadata (`tokenizer.ggml.tokens`, `scores`, `token_type`,
/// and `merges` when `want_merges`), with llama.cpp's checks. Errors are messages without
/// the file name (the caller adds it).
pub fn store_from_metadata<'a>(
    get: impl Fn(&str) -> Option<&'a crate::gguf::Value>,
    want_merges: bool,
) -> std::result::Result<VocabStore, String> {
    use crate::gguf::{vtype, Value};
    const K: &str = "tokenizer.ggml.";
    let merges = if want_merges {
        match get("tokenizer.ggml.merges") {
            None => return Err(format!("cannot find tokenizer merges ({K}merges) in model file")),
            Some(Value::Array(a)) if a.elem_type == vtype::STRING => Some(a),
            Some(_) => return Err(format!("{K}merges must be an array of strings")),
        }
    } else {
        None
    };
    let tokens = match get("tokenizer.ggml.tokens") {
        None => return Err(format!("cannot find tokenizer vocab ({K}tokens) in model file")),
        Some(Value::Array(a)) if a.elem_type == vtype::STRING => a,
        Some(_) => return Err(format!("{K}tokens must be an array of strings")),
    };
    let n = tokens.len();
    let numbers = |key: &str, what: &str, ints_only: bool| -> std::result::Result<Option<&crate::gguf::Array>, String> {
        let Some(v) = get(&format!("{K}{key}")) else { return Ok(None) };
        let Value::Array(a) = v else { return Err(format!("{K}{key} must be an array")) };
        if a.len() < n {
            return Err(format!("Index out of array bounds for {what} ({} < {n})", a.len()));
        }
        let ok = match a.elem_type {
            vtype::F32 | vtype::F64 => !ints_only,
            vtype::U8 | vtype::I8 | vtype::U16 | vtype::I16 | vtype::U32 | vtype::I32 | vtype::U64 | vtype::I64 => true,
            _ => false,
        };
        if !ok {
            return Err(if ints_only {
                format!("{K}{key} must be an array of int32")
            } else {
                format!("{K}{key} must be an array of float32 or int32")
            });
        }
        Ok(Some(a))
    };
    let scores: Vec<f32> = numbers("scores", "scores", false)?
        .map(|a| a.iter().take(n).map(|v| v.as_f64().unwrap_or(0.0) as f32).collect())
        .unwrap_or_default();
    let types: Vec<i32> = numbers("token_type", "toktypes", true)?
        .map(|a| a.iter().take(n).map(|v| v.as_i64().map_or(0, |x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32)).collect())
        .unwrap_or_default();
    let mut b = VocabStoreBuilder::new();
    b.reserve(n, (0..n).map(|i| tokens.str_at(i).map_or(0, |t| t.len())).sum());
    for i in 0..n {
        b.push(tokens.str_at(i).unwrap_or(&[]));
    }
    b.finish(scores, types, merges.map(|m| (0..m.len()).map(move |i| m.str_at(i).unwrap_or(&[]))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(tokens: &[&str], merges: Option<&[&str]>, scores: Vec<f32>) -> VocabStore {
        let mut b = VocabStoreBuilder::new();
        for t in tokens {
            b.push(t.as_bytes());
        }
        b.finish(scores, vec![], merges.map(|m| m.iter().map(|s| s.as_bytes()))).unwrap()
    }

    #[test]
    fn duplicates_later_token_and_first_merge_win() {
        let s = store(&["a", "b", "a", ""], Some(&["a b", "x y", "a b", "nospace", " lead"]), vec![]);
        assert_eq!(s.id(b"a"), Some(2));
        assert_eq!(s.id(b"[EMPTY_3]"), Some(3));
        assert_eq!(s.empty, vec![3]);
        assert_eq!(s.rank(b"a", b"b"), Some(0));
        assert_eq!(s.rank(b"x", b"y"), Some(1));
        assert_eq!(s.rank(b"nospace", b""), None);
        assert_eq!(s.rank(b"", b"lead"), None);
        assert_eq!(s.id(b"zz"), None);
    }

    #[test]
    fn bpe_merges_lowest_rank_first_with_byte_fallback() {
        // "abc": ranks b+c (0) before a+b (1), so "a" "bc"; then "a bc" merges (2)
        let s = store(&["a", "b", "c", "bc", "abc", "<0x64>"], Some(&["b c", "a b", "a bc"]), vec![]);
        let mut out = vec![];
        s.bpe_word(b"abc", BpeOptions::default(), &mut out);
        assert_eq!(out, vec![4]);
        out.clear();
        s.bpe_word(b"abd", BpeOptions::default(), &mut out);
        assert_eq!(out, vec![5]); // "ab" is no token: bytes <0x61> <0x62> (absent, dropped) and <0x64>
        out.clear();
        s.bpe_word(b"abd", BpeOptions { byte_encode: true, ..Default::default() }, &mut out);
        assert_eq!(out, vec![0, 1]); // byte-encoded: "a" and "b" are their own texts; no "d" token
    }

    #[test]
    fn spm_highest_score_first_and_missing_byte_is_an_error() {
        let s = store(&["a", "b", "ab", "bb", "<0x63>"], None, vec![0.0, 0.0, -1.0, -0.5, 0.0]);
        let mut out = vec![];
        s.spm(b"abb", &mut out).unwrap();
        assert_eq!(out, vec![0, 3]); // "bb" scores higher than "ab"
        out.clear();
        s.spm(b"ac", &mut out).unwrap();
        assert_eq!(out, vec![0, 4]);
        assert_eq!(s.spm(b"d", &mut out), Err(b'd'));
    }

    /// A GGUF header with tokenizer arrays, byte-flipped at random: parsing either fails or
    /// gives tables whose build and merge loops never panic.
    #[test]
    fn corrupted_tokenizer_arrays_never_panic() {
        use crate::gguf::{GgufFile, Storage};
        fn s(b: &mut Vec<u8>, t: &str) {
            b.extend((t.len() as u64).to_le_bytes());
            b.extend(t.as_bytes());
        }
        fn strs(b: &mut Vec<u8>, key: &str, items: &[&str]) {
            s(b, key);
            b.extend(9u32.to_le_bytes());
            b.extend(8u32.to_le_bytes());
            b.extend((items.len() as u64).to_le_bytes());
            for t in items {
                s(b, t);
            }
        }
        let mut base = Vec::new();
        base.extend(b"GGUF");
        base.extend(3u32.to_le_bytes());
        base.extend(0u64.to_le_bytes());
        base.extend(4u64.to_le_bytes());
        strs(&mut base, "tokenizer.ggml.tokens", &["a", "b", "ab", "\u{2581}", "<0x61>", ""]);
        strs(&mut base, "tokenizer.ggml.merges", &["a b", "\u{2581} a", "ab ab"]);
        s(&mut base, "tokenizer.ggml.scores");
        base.extend(9u32.to_le_bytes());
        base.extend(6u32.to_le_bytes());
        base.extend(6u64.to_le_bytes());
        for v in [0.0f32, -1.0, -0.5, 2.0, 0.0, 1.0] {
            base.extend(v.to_le_bytes());
        }
        s(&mut base, "tokenizer.ggml.token_type");
        base.extend(9u32.to_le_bytes());
        base.extend(5u32.to_le_bytes());
        base.extend(6u64.to_le_bytes());
        for v in [1i32, 1, 1, 1, 6, 3] {
            base.extend(v.to_le_bytes());
        }
        let mut seed = 0x5eed_0f_70c3u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut parsed = 0;
        for _ in 0..3000 {
            let mut b = base.clone();
            for _ in 0..1 + next() % 3 {
                let i = (next() % b.len() as u64) as usize;
                b[i] = next() as u8;
            }
            let Ok(f) = GgufFile::from_storage("t.gguf", Storage::from_bytes(&b)) else { continue };
            parsed += 1;
            for merges in [false, true] {
                if let Ok(v) = store_from_metadata(|k| f.get(k), merges) {
                    let mut out = vec![];
                    v.bpe_word("abab\u{2581}ab".as_bytes(), BpeOptions::default(), &mut out);
                    v.bpe_word(&[0xff, 0x61, 0xc3], BpeOptions { byte_encode: true, ..Default::default() }, &mut out);
                    let _ = v.spm("\u{2581}abba\u{2581}".as_bytes(), &mut out);
                    let _ = v.spm(&[0xe2, 0x96], &mut out);
                    assert!(out.iter().all(|&id| (id as usize) < v.len()));
                }
            }
        }
        assert!(parsed > 100, "only {parsed} corrupted files parsed: the test exercises too little");
    }

    #[test]
    fn bridges() {
        let s = store(&["\u{2581}a", "a\u{2581}b", "\u{2581}\u{2581}", "x"], None, vec![]);
        assert_eq!(s.bridge_tokens(), vec!["a\u{2581}b".as_bytes()]);
    }
}
