//! GBNF grammar matching with llama.cpp's semantics (src/llama-grammar.cpp): the hot
//! runtime of pyllama.grammar (issue 13; a sampler in step 15 of the pipeline).
//!
//! The parser stays in Python (python/pyllama/grammar.py) and hands over llama.cpp's rule
//! elements laid out flat: `types[p]`, `values[p]` for every position p, and
//! `rule_start[r]`, the first position of rule r (each rule ends with END). A *stack* is a
//! list of positions, top last; a [`State`] is a set of stacks plus the partial UTF-8
//! sequence left by the last token. Stacks are always advanced until their top is a
//! terminal (a char class or a token) or they are empty (the grammar may end there).
//!
//! [`State::allows`] and [`State::accept_token`] give llama.cpp's verdict on one token;
//! [`Grammar::mask`] gives it for a whole vocabulary at once by walking a [`TokenTrie`]
//! (every token's code points, built once per vocabulary) against the stacks. Sets of
//! stacks met during walks are interned, and their code point -> next set transitions
//! kept (they depend on the grammar only), so later masks mostly cost one table lookup
//! per trie node. Whole subtrees whose code points all lead back to the same set (the
//! inside of a JSON string) are admitted without visiting them.
//!
//! Every input is checked: malformed rule arrays, left recursion or an explosive grammar
//! give an [`Error::Invalid`], never a panic or a hang.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;

use crate::error::{Error, Result};

// llama_gretype
pub const END: u8 = 0;
pub const ALT: u8 = 1;
pub const RULE_REF: u8 = 2;
pub const CHAR: u8 = 3;
pub const CHAR_NOT: u8 = 4;
pub const CHAR_RNG_UPPER: u8 = 5;
pub const CHAR_ALT: u8 = 6;
pub const CHAR_ANY: u8 = 7;
pub const TOKEN: u8 = 8;
pub const TOKEN_NOT: u8 = 9;

/// Stacks a grammar's closures may visit in all (beyond it the grammar is refused).
const CLOSURE_BUDGET: usize = 4_000_000;
/// The deepest stack a closure may build (left recursion grows stacks without end).
const MAX_STACK_DEPTH: usize = 10_000;
/// Interned stack sets kept between masks before the tables are dropped (memory bound).
const MAX_SETS: usize = 65_536;

/// FxHash (rustc's): fast for the short integer keys hashed here.
#[derive(Default, Clone, Copy)]
struct FxHasher(u64);

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.add(b as u64);
        }
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

impl FxHasher {
    #[inline]
    fn add(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type FxMap<K, V> = HashMap<K, V, BuildHasherDefault<FxHasher>>;
type FxSet<K> = HashSet<K, BuildHasherDefault<FxHasher>>;

/// A partial UTF-8 sequence: (value so far, bytes still missing); n_remain -1 marks an
/// invalid sequence (llama_partial_utf8).
pub type Partial = (u32, i32);

const UTF8_LOOKUP: [i32; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 2, 2, 3, 4];

/// llama.cpp's decode_utf8(string, partial_start): the code points of `data` (a NUL byte
/// ends it, as in a C string) into `cps`, and the partial state left. An invalid sequence
/// gives no code points and n_remain -1.
pub fn decode_utf8(data: &[u8], partial: Partial, cps: &mut Vec<u32>) -> Partial {
    let data = match data.iter().position(|&b| b == 0) {
        Some(n) => &data[..n],
        None => data,
    };
    cps.clear();
    let (mut value, mut n_remain) = partial;
    let n = data.len();
    let mut i = 0;
    while i < n && n_remain > 0 {
        let b = data[i];
        if b >> 6 != 2 {
            cps.clear();
            return (0, -1);
        }
        value = (value << 6).wrapping_add((b & 0x3F) as u32);
        i += 1;
        n_remain -= 1;
    }
    if partial.1 > 0 && n_remain == 0 {
        cps.push(value);
    }
    while i < n {
        let b = data[i];
        n_remain = UTF8_LOOKUP[(b >> 4) as usize] - 1;
        if n_remain < 0 {
            cps.clear();
            return (0, n_remain);
        }
        value = (b & ((1u8 << (7 - n_remain)) - 1)) as u32;
        i += 1;
        while i < n && n_remain > 0 {
            value = (value << 6).wrapping_add((data[i] & 0x3F) as u32);
            i += 1;
            n_remain -= 1;
        }
        if n_remain == 0 {
            cps.push(value);
        }
    }
    // llama.cpp keeps the last value when nothing is pending; it is never read then
    if n_remain != 0 {
        (value, n_remain)
    } else {
        (0, 0)
    }
}

/// A char element and the CHAR_ALT / CHAR_RNG_UPPER elements after it.
#[derive(Clone, Debug)]
struct CharClass {
    positive: bool,
    any: bool,
    ranges: Vec<(u32, u32)>,
    /// the position after the class
    next: u32,
    /// one verdict for every code point >= 128 (the decoder's values stay below 2**31)
    uniform: bool,
}

impl CharClass {
    #[inline]
    fn matches(&self, c: u32) -> bool {
        let found = self.any || self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi);
        found == self.positive
    }

    /// llama_grammar_match_partial_char: could a code point starting with `partial` match?
    fn matches_partial(&self, partial: Partial) -> bool {
        let (value, n_remain) = partial;
        if n_remain < 0 || (n_remain == 1 && value < 2) {
            return false;
        }
        let shift = (n_remain as u32) * 6;
        let mut low = (value as u64) << shift;
        let high = low | ((1u64 << shift) - 1);
        if low == 0 {
            if n_remain == 2 {
                low = 1 << 11;
            } else if n_remain == 3 {
                low = 1 << 16;
            }
        }
        for &(lo, hi) in &self.ranges {
            if (lo as u64) <= high && low <= hi as u64 {
                return self.positive;
            }
        }
        // llama.cpp returns true at the '.' (ranges before it in the class come first)
        if self.any {
            return true;
        }
        !self.positive
    }
}

/// What a stack whose top is a RULE_REF expands to (llama_grammar_advance_stack),
/// relative to the rest of the stack: suffixes ending at a terminal, and whether the
/// reference can be consumed entirely (then the stack below is advanced too).
#[derive(Clone, Debug, Default)]
struct Closure {
    suffixes: Vec<Vec<u32>>,
    nullable: bool,
}

/// A stack set met during mask walks, with its cached transitions.
struct SetInfo {
    /// stacks whose top is a char element (sorted, unique)
    char_stacks: Vec<Vec<u32>>,
    /// (type, token id) of the tops of stacks that wait for a token
    token_tops: Vec<(u8, u32)>,
    uniform: bool,
    /// every code point some char stack accepts, sorted, when they are few (all classes
    /// positive, small ranges): a node with many children then looks these up instead
    cands: Option<Vec<u32>>,
    /// next set after code point c (c <= 128; 128 stands for every c > 128 when uniform):
    /// -2 not computed yet, -1 no stack survives
    ascii: Box<[i32; 129]>,
    other: FxMap<u32, i32>,
    /// code points c < 128 known to lead back to this very set (fix_yes) or not (fix_no)
    fix_yes: u128,
    fix_no: u128,
}

/// Interned stack sets and their transitions: shared by every state of one grammar.
#[derive(Default)]
struct Engine {
    ids: FxMap<Vec<Vec<u32>>, u32>,
    sets: Vec<SetInfo>,
    /// bumped whenever the tables are dropped (state keys of older epochs never recur)
    epoch: u64,
}

/// A checked grammar: flat elements, char classes, closures, the start stacks and the
/// (mutex-guarded) tables that masks share. Immutable apart from those tables.
pub struct Grammar {
    types: Vec<u8>,
    values: Vec<u32>,
    /// per position: the char class starting there (char elements only)
    classes: Vec<Option<CharClass>>,
    /// per position: the closure of a RULE_REF there
    closures: Vec<Option<Closure>>,
    start: Vec<Vec<u32>>,
    engine: Mutex<Engine>,
}

fn invalid<T>(msg: impl Into<String>) -> Result<T> {
    Err(Error::Invalid(format!("grammar: {}", msg.into())))
}

#[inline]
fn push_unique(out: &mut Vec<Vec<u32>>, st: Vec<u32>) {
    if !out.contains(&st) {
        out.push(st);
    }
}

impl Grammar {
    /// Check llama.cpp's rule elements (flat: `types`, `values`, `rule_start`) and prepare
    /// the matcher for rule `root`.
    pub fn new(types: Vec<u8>, values: Vec<u32>, rule_start: Vec<u32>, root: u32) -> Result<Grammar> {
        let n = types.len();
        if values.len() != n {
            return invalid(format!("{} element types but {} values", n, values.len()));
        }
        if n >= u32::MAX as usize {
            return invalid("too many elements");
        }
        if rule_start.is_empty() {
            return invalid("empty grammar (no rules)");
        }
        if root as usize >= rule_start.len() {
            return invalid(format!("root rule {root} out of range ({} rules)", rule_start.len()));
        }
        // rules are consecutive segments, each ending with its only END
        if rule_start[0] != 0 {
            return invalid("rule 0 does not start at position 0");
        }
        for r in 0..rule_start.len() {
            let s = rule_start[r] as usize;
            let e = if r + 1 < rule_start.len() { rule_start[r + 1] as usize } else { n };
            if s >= e || e > n {
                return invalid(format!("rule {r} is empty or out of range"));
            }
            for p in s..e {
                let t = types[p];
                if t > TOKEN_NOT {
                    return invalid(format!("element {p} has unknown type {t}"));
                }
                if (t == END) != (p == e - 1) {
                    return invalid(format!("rule {r} must end with its only END element"));
                }
                let prev = if p > s { Some(types[p - 1]) } else { None };
                match t {
                    RULE_REF if values[p] as usize >= rule_start.len() => {
                        return invalid(format!("element {p} refers to undefined rule {}", values[p]));
                    }
                    CHAR_RNG_UPPER if !matches!(prev, Some(CHAR | CHAR_NOT | CHAR_ALT)) => {
                        return invalid(format!("element {p}: a range end (CHAR_RNG_UPPER) must follow a char"));
                    }
                    CHAR_ALT if !matches!(prev, Some(CHAR | CHAR_NOT | CHAR_ALT | CHAR_RNG_UPPER | CHAR_ANY)) => {
                        return invalid(format!("element {p}: CHAR_ALT must follow a char element"));
                    }
                    _ => {}
                }
            }
        }
        check_left_recursion(&types, &values, &rule_start)?;
        let mut g = Grammar {
            types,
            values,
            classes: vec![None; n],
            closures: vec![None; n],
            start: Vec::new(),
            engine: Mutex::new(Engine::default()),
        };
        for p in 0..n {
            if matches!(g.types[p], CHAR | CHAR_NOT | CHAR_ANY) {
                g.classes[p] = Some(g.char_class(p));
            }
        }
        let mut budget = CLOSURE_BUDGET;
        for p in 0..n {
            if g.types[p] == RULE_REF {
                let c = g.compute_closure(p as u32, &rule_start, &mut budget)?;
                g.closures[p] = Some(c);
            }
        }
        let mut start = Vec::new();
        for alt in g.alternatives(rule_start[root as usize]) {
            let st = if g.is_eos(alt) { Vec::new() } else { vec![alt] };
            g.advance(st, &mut start);
        }
        g.start = start;
        Ok(g)
    }

    #[inline]
    fn is_eos(&self, p: u32) -> bool {
        let t = self.types[p as usize];
        t == END || t == ALT
    }

    /// First positions of the alternatives of the rule starting at `p`.
    fn alternatives(&self, mut p: u32) -> Vec<u32> {
        let mut out = Vec::new();
        loop {
            out.push(p);
            while !self.is_eos(p) {
                p += 1;
            }
            if self.types[p as usize] == ALT {
                p += 1;
            } else {
                return out;
            }
        }
    }

    fn char_class(&self, pos: usize) -> CharClass {
        let (types, values) = (&self.types, &self.values);
        let positive = matches!(types[pos], CHAR | CHAR_ANY);
        let mut ranges = Vec::new();
        let mut any = false;
        let mut p = pos;
        loop {
            if types[p + 1] == CHAR_RNG_UPPER {
                ranges.push((values[p], values[p + 1]));
                p += 2;
            } else if types[p] == CHAR_ANY {
                any = true;
                p += 1;
            } else {
                ranges.push((values[p], values[p]));
                p += 1;
            }
            if types[p] != CHAR_ALT {
                break;
            }
        }
        let uniform = any || ranges.iter().all(|&(lo, hi)| hi < 128 || (lo <= 128 && hi >= 0x7FFF_FFFF));
        CharClass { positive, any, ranges, next: p as u32, uniform }
    }

    fn compute_closure(&self, pos: u32, rule_start: &[u32], budget: &mut usize) -> Result<Closure> {
        let mut out: Vec<Vec<u32>> = Vec::new();
        let mut out_set: FxSet<Vec<u32>> = FxSet::default();
        let mut seen: FxSet<Vec<u32>> = FxSet::default();
        let mut nullable = false;
        let mut todo = vec![vec![pos]];
        while let Some(st) = todo.pop() {
            if seen.contains(&st) {
                continue;
            }
            if *budget == 0 {
                return invalid("the grammar expands to too many alternatives (over 4 million stacks)");
            }
            *budget -= 1;
            seen.insert(st.clone());
            let Some(&top) = st.last() else {
                nullable = true;
                continue;
            };
            match self.types[top as usize] {
                RULE_REF => {
                    let mut base = st[..st.len() - 1].to_vec();
                    if !self.is_eos(top + 1) {
                        base.push(top + 1);
                    }
                    if base.len() >= MAX_STACK_DEPTH {
                        return invalid("rules nest too deeply without consuming input (left recursion?)");
                    }
                    for alt in self.alternatives(rule_start[self.values[top as usize] as usize]) {
                        let mut s = base.clone();
                        if !self.is_eos(alt) {
                            s.push(alt);
                        }
                        todo.push(s);
                    }
                }
                CHAR | CHAR_NOT | CHAR_ANY | TOKEN | TOKEN_NOT => {
                    if out_set.insert(st.clone()) {
                        out.push(st);
                    }
                }
                t => return invalid(format!("a stack reaches element {top} of type {t}, which cannot start a match")),
            }
        }
        Ok(Closure { suffixes: out, nullable })
    }

    /// Append to `out` the stacks `stack` expands to (no duplicates).
    fn advance(&self, mut stack: Vec<u32>, out: &mut Vec<Vec<u32>>) {
        loop {
            let Some(&top) = stack.last() else {
                push_unique(out, stack);
                return;
            };
            stack.pop();
            match &self.closures[top as usize] {
                Some(c) => {
                    for s in &c.suffixes {
                        let mut ns = Vec::with_capacity(stack.len() + s.len());
                        ns.extend_from_slice(&stack);
                        ns.extend_from_slice(s);
                        push_unique(out, ns);
                    }
                    if !c.nullable {
                        return;
                    }
                }
                None => {
                    // a terminal: the stack is already advanced
                    stack.push(top);
                    push_unique(out, stack);
                    return;
                }
            }
        }
    }

    /// Advance `stack` (top: a char element that matched) past its char class.
    fn after_char(&self, stack: &[u32], out: &mut Vec<Vec<u32>>) {
        let top = stack[stack.len() - 1] as usize;
        let next = self.classes[top].as_ref().map_or(top as u32 + 1, |c| c.next);
        let mut base = stack[..stack.len() - 1].to_vec();
        if !self.is_eos(next) {
            base.push(next);
        }
        self.advance(base, out);
    }

    #[inline]
    fn class(&self, p: u32) -> Option<&CharClass> {
        self.classes[p as usize].as_ref()
    }

    #[inline]
    fn is_token(&self, p: u32) -> bool {
        matches!(self.types[p as usize], TOKEN | TOKEN_NOT)
    }

    #[inline]
    fn token_matches(&self, p: u32, token: u32) -> bool {
        (self.values[p as usize] == token) == (self.types[p as usize] == TOKEN)
    }

    /// llama_grammar_accept: the stacks after one code point.
    fn accept_chr(&self, stacks: &[Vec<u32>], c: u32) -> Vec<Vec<u32>> {
        let mut out = Vec::new();
        for st in stacks {
            let Some(&top) = st.last() else { continue };
            if let Some(cc) = self.class(top) {
                if cc.matches(c) {
                    self.after_char(st, &mut out);
                }
            }
        }
        out
    }

    /// A matcher in the start state.
    pub fn start_state(&self) -> State {
        State { stacks: self.start.clone(), partial: (0, 0) }
    }

    pub fn n_elements(&self) -> usize {
        self.types.len()
    }

    // -- masks ----------------------------------------------------------------------

    /// The interned id of `stacks` (sorted, deduplicated), creating it if new.
    fn intern(&self, eng: &mut Engine, mut stacks: Vec<Vec<u32>>) -> u32 {
        stacks.sort_unstable();
        stacks.dedup();
        if let Some(&sid) = eng.ids.get(&stacks) {
            return sid;
        }
        let sid = eng.sets.len() as u32;
        let mut char_stacks = Vec::new();
        let mut token_tops = Vec::new();
        let mut uniform = true;
        let mut cands: Option<Vec<u32>> = Some(Vec::new());
        for st in &stacks {
            let Some(&top) = st.last() else { continue };
            if self.is_token(top) {
                token_tops.push((self.types[top as usize], self.values[top as usize]));
            } else {
                let cc = self.class(top);
                uniform &= cc.is_some_and(|c| c.uniform);
                match (cc, cands.as_mut()) {
                    (Some(cc), Some(list)) if cc.positive && !cc.any => {
                        for &(lo, hi) in &cc.ranges {
                            if hi >= lo && hi - lo < 64 && list.len() < 64 {
                                list.extend(lo..=hi);
                            } else if hi >= lo {
                                cands = None;
                                break;
                            }
                        }
                    }
                    (None, _) => {}
                    _ => cands = None,
                }
                char_stacks.push(st.clone());
            }
        }
        if let Some(list) = cands.as_mut() {
            list.sort_unstable();
            list.dedup();
        }
        eng.sets.push(SetInfo {
            char_stacks,
            token_tops,
            uniform,
            cands,
            ascii: Box::new([-2; 129]),
            other: FxMap::default(),
            fix_yes: 0,
            fix_no: 0,
        });
        eng.ids.insert(stacks, sid);
        sid
    }

    /// The set after code point `c` (already folded to 128 where the set is uniform), or -1.
    #[inline]
    fn transition(&self, eng: &mut Engine, sid: u32, c: u32) -> i32 {
        let info = &eng.sets[sid as usize];
        let cached = if c <= 128 { info.ascii[c as usize] } else { *info.other.get(&c).unwrap_or(&-2) };
        if cached != -2 {
            return cached;
        }
        let next = self.accept_chr(&info.char_stacks, c);
        let nsid = if next.is_empty() { -1 } else { self.intern(eng, next) as i32 };
        let info = &mut eng.sets[sid as usize];
        if c <= 128 {
            info.ascii[c as usize] = nsid;
        } else {
            info.other.insert(c, nsid);
        }
        nsid
    }

    /// Does every code point in `sub` (what lies below a trie node: [`Edge::sub`]) lead
    /// from set `sid` back to `sid` itself? Then every token below the node is admitted.
    fn fix_covers(&self, eng: &mut Engine, sid: u32, sub: u128, flags: u8) -> bool {
        let info = &eng.sets[sid as usize];
        if !info.token_tops.is_empty() || flags & SUB_PARTIAL != 0 || sub & info.fix_no != 0 {
            return false;
        }
        if flags & SUB_NONASCII != 0 && !info.uniform {
            return false;
        }
        let mut unknown = sub & !info.fix_yes;
        while unknown != 0 {
            let c = unknown.trailing_zeros();
            let back = self.transition(eng, sid, c) == sid as i32;
            let info = &mut eng.sets[sid as usize];
            if back {
                info.fix_yes |= 1u128 << c;
            } else {
                info.fix_no |= 1u128 << c;
                return false;
            }
            unknown &= unknown - 1;
        }
        if flags & SUB_NONASCII != 0 {
            return self.transition(eng, sid, 128) == sid as i32;
        }
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Engine> {
        // a poisoned lock only means a panic elsewhere mid-walk: the tables are caches, drop them
        match self.engine.lock() {
            Ok(g) => g,
            Err(p) => {
                let mut g = p.into_inner();
                let epoch = g.epoch + 1;
                *g = Engine { epoch, ..Engine::default() };
                self.engine.clear_poison();
                g
            }
        }
    }

    /// Enter the tables for a new mask or key: drop them when they grew too large.
    fn enter(&self) -> std::sync::MutexGuard<'_, Engine> {
        let mut eng = self.lock();
        if eng.sets.len() > MAX_SETS {
            let epoch = eng.epoch + 1;
            *eng = Engine { epoch, ..Engine::default() };
        }
        eng
    }

    /// A key that is equal for two states exactly when they are the same state (same set
    /// of stacks, same partial sequence), for caching masks: (epoch, set id, partial).
    pub fn state_key(&self, state: &State) -> (u64, u32, u32, i32) {
        let mut eng = self.enter();
        let sid = self.intern(&mut eng, state.stacks.clone());
        (eng.epoch, sid, state.partial.0, state.partial.1)
    }

    /// The tokens of `trie`'s vocabulary that `state` accepts: `out[t]` is llama.cpp's
    /// verdict on token t (end-of-generation tokens: where the grammar may end).
    pub fn mask(&self, trie: &TokenTrie, state: &State, out: &mut [bool]) -> Result<()> {
        if out.len() != trie.n_vocab {
            return invalid(format!("mask of {} entries for a vocabulary of {}", out.len(), trie.n_vocab));
        }
        out.fill(false);
        if state.partial.1 > 0 {
            // inside a UTF-8 sequence only tokens starting with continuation bytes can
            // follow: check those one by one (llama.cpp's way)
            let mut cps = Vec::new();
            for &t in &trie.continuations {
                out[t as usize] = state.allows_with(self, t, trie.piece(t), &mut cps);
            }
        } else if !state.stacks.is_empty() {
            let mut eng = self.enter();
            let sid = self.intern(&mut eng, state.stacks.clone());
            self.walk(&mut eng, trie, sid, out);
        }
        if state.can_end() {
            for &t in &trie.eog {
                out[t as usize] = true;
            }
        }
        Ok(())
    }

    /// One walk of the trie from set `sid`: admitted tokens -> `out` (token order).
    fn walk(&self, eng: &mut Engine, trie: &TokenTrie, sid: u32, out: &mut [bool]) {
        // admitted candidates in the trie's order first (ranges are memsets there), then
        // written in token order: the fewer of admitted / rejected ones one by one
        let order = &trie.order;
        let m = order.len();
        let mut ok = vec![0u8; m];
        self.walk_sorted(eng, trie, sid, &mut ok);
        let n_ok: usize = ok.iter().map(|&b| b as usize).sum();
        let want = if 2 * n_ok > m {
            out.fill(true);
            for &t in &trie.non_candidates {
                out[t as usize] = false;
            }
            0u8
        } else {
            1u8
        };
        let word = u64::from_ne_bytes([want ^ 1; 8]);
        let mut i = 0;
        for chunk in ok.chunks_exact(8) {
            if u64::from_ne_bytes(chunk.try_into().unwrap_or([0; 8])) != word {
                for (j, &b) in chunk.iter().enumerate() {
                    if b == want {
                        out[order[i + j] as usize] = want == 1;
                    }
                }
            }
            i += 8;
        }
        for j in i..m {
            if ok[j] == want {
                out[order[j] as usize] = want == 1;
            }
        }
    }

    fn walk_sorted(&self, eng: &mut Engine, trie: &TokenTrie, sid: u32, ok: &mut [u8]) {
        let set_range = |ok: &mut [u8], lo: u32, hi: u32| {
            ok[lo as usize..hi as usize].fill(1);
        };
        let mut todo: Vec<(u32, u32)> = vec![(0, sid)];
        while let Some((ni, sid)) = todo.pop() {
            let node = &trie.nodes[ni as usize];
            // tokens that end here with no partial sequence: any live stack accepts them
            if node.n_complete > 0 {
                set_range(ok, node.lo, node.lo + node.n_complete);
            }
            let rest_lo = node.lo + node.n_complete + node.n_partial;
            let info = &eng.sets[sid as usize];
            for &(ty, tok) in &info.token_tops {
                // every token below continues with a code point: only the id decides
                let p = trie.pos_of.get(tok as usize).copied().unwrap_or(u32::MAX);
                let inside = p != u32::MAX && rest_lo <= p && p < node.hi;
                if ty == TOKEN {
                    if inside {
                        ok[p as usize] = 1;
                    }
                } else if inside {
                    set_range(ok, rest_lo, p);
                    set_range(ok, p + 1, node.hi);
                } else {
                    set_range(ok, rest_lo, node.hi);
                }
            }
            if info.char_stacks.is_empty() {
                continue;
            }
            for idx in node.lo + node.n_complete..rest_lo {
                let partial = trie.partial[idx as usize];
                if info.char_stacks.iter().any(|st| {
                    self.class(st[st.len() - 1]).is_some_and(|c| c.matches_partial(partial))
                }) {
                    ok[idx as usize] = 1;
                }
            }
            let (e0, e1) = (node.edge_start, node.edge_end);
            if e0 == e1 {
                continue;
            }
            let uniform = info.uniform;
            if ni == 0 && self.fix_covers(eng, sid, trie.root_sub, trie.root_flags) {
                // every path below spells only code points that lead back to this very
                // set, and every token below ends complete: all of them are admitted
                set_range(ok, rest_lo, node.hi);
                continue;
            }
            let edges = &trie.edges[e0 as usize..e1 as usize];
            let few = eng.sets[sid as usize].cands.as_ref().filter(|c| 4 * c.len() < edges.len()).cloned();
            // the shortcut is decided here, from the edge's copy of the child's summary,
            // so that admitted subtrees (most of them inside a string) are never visited
            let mut visit = |eng: &mut Engine, e: &Edge| {
                let c = if uniform && e.cp > 128 { 128 } else { e.cp }; // classes cannot tell c >= 128 apart
                let nsid = self.transition(eng, sid, c);
                if nsid < 0 {
                    return;
                }
                let sub = (e.sub[0] as u128) | ((e.sub[1] as u128) << 64);
                if e.flags & OWN_PARTIAL == 0 && self.fix_covers(eng, nsid as u32, sub, e.flags) {
                    ok[e.lo as usize..e.hi as usize].fill(1);
                } else {
                    todo.push((e.child, nsid as u32));
                }
            };
            match few {
                // only these code points can match: look them up among the children
                Some(cands) => {
                    for c in cands {
                        if let Ok(k) = edges.binary_search_by_key(&c, |e| e.cp) {
                            visit(eng, &edges[k]);
                        }
                    }
                }
                None => {
                    // a node with many children (the root: every first character of the
                    // vocabulary): where the set cannot tell code points >= 128 apart, its
                    // non-ASCII children all go to one set, and an index says which of them
                    // cannot be admitted whole, so the others are never looked at
                    let block = if uniform && edges.len() >= BIG { trie.big.get(&ni) } else { None };
                    let mut split = edges.len();
                    let mut block_sid = -1;
                    if let Some(b) = block {
                        split = (b.na_start - e0) as usize;
                        block_sid = self.transition(eng, sid, 128);
                        if block_sid >= 0 && !eng.sets[block_sid as usize].token_tops.is_empty() {
                            split = edges.len(); // one by one
                        }
                    }
                    for e in &edges[..split] {
                        visit(eng, e);
                    }
                    if let (Some(b), true) = (block, split < edges.len() && block_sid >= 0) {
                        self.admit_block(eng, &trie.edges, b, block_sid as u32, e1, ok, &mut todo);
                    }
                }
            }
        }
    }
}

impl Grammar {
    /// The non-ASCII children `edges[b.na_start..e1]` of a big node, all going to set `ns`
    /// (no token stacks): admit whole the subtrees that spell only code points leading
    /// back to `ns` (as [`Grammar::fix_covers`] would decide one by one), push the others.
    #[allow(clippy::too_many_arguments)]
    fn admit_block(
        &self,
        eng: &mut Engine,
        edges: &[Edge],
        b: &Big,
        ns: u32,
        e1: u32,
        ok: &mut [u8],
        todo: &mut Vec<(u32, u32)>,
    ) {
        let info = &eng.sets[ns as usize];
        let mut unknown = b.or_sub & !(info.fix_yes | info.fix_no);
        while unknown != 0 {
            let c = unknown.trailing_zeros();
            let back = self.transition(eng, ns, c) == ns as i32;
            let info = &mut eng.sets[ns as usize];
            if back {
                info.fix_yes |= 1u128 << c;
            } else {
                info.fix_no |= 1u128 << c;
            }
            unknown &= unknown - 1;
        }
        let leaving = eng.sets[ns as usize].fix_no & b.or_sub;
        let nonascii_back = eng.sets[ns as usize].uniform && self.transition(eng, ns, 128) == ns as i32;
        let mut bad: Vec<u32> = b.partial.clone();
        if !nonascii_back {
            bad.extend_from_slice(&b.nonascii);
        }
        let mut bits = leaving;
        while bits != 0 {
            let c = bits.trailing_zeros() as usize;
            bad.extend_from_slice(&b.items[b.offsets[c] as usize..b.offsets[c + 1] as usize]);
            bits &= bits - 1;
        }
        bad.sort_unstable();
        bad.dedup();
        // siblings' token ranges are adjacent: a run of admitted children is one range
        let mut run = b.na_start;
        for &k in &bad {
            if k > run {
                ok[edges[run as usize].lo as usize..edges[k as usize - 1].hi as usize].fill(1);
            }
            todo.push((edges[k as usize].child, ns));
            run = k + 1;
        }
        if run < e1 {
            ok[edges[run as usize].lo as usize..edges[e1 as usize - 1].hi as usize].fill(1);
        }
    }
}

fn check_left_recursion(types: &[u8], values: &[u32], rule_start: &[u32]) -> Result<()> {
    // llama.cpp's llama_grammar_detect_left_recursion, with an explicit stack
    let n = rule_start.len();
    let seg = |r: usize| {
        let s = rule_start[r] as usize;
        let e = if r + 1 < n { rule_start[r + 1] as usize } else { types.len() };
        s..e
    };
    let eos = |t: u8| t == END || t == ALT;
    let mut may_be_empty = vec![false; n];
    for r in 0..n {
        let mut at_start = true;
        for p in seg(r) {
            if eos(types[p]) {
                if at_start {
                    may_be_empty[r] = true;
                    break;
                }
                at_start = true;
            } else {
                at_start = false;
            }
        }
    }
    // llama.cpp computes may_be_empty while it recurses; a rule's emptiness only depends on
    // its own elements, so computing it first gives the same verdicts
    let mut visited = vec![false; n];
    let mut in_progress = vec![false; n];
    for r0 in 0..n {
        if visited[r0] {
            continue;
        }
        // frames: (rule, position of the next element to look at, recurse flag)
        let mut frames: Vec<(usize, usize, bool)> = vec![(r0, rule_start[r0] as usize, true)];
        in_progress[r0] = true;
        while let Some(&mut (r, ref mut p, ref mut recurse)) = frames.last_mut() {
            let end = seg(r).end;
            let mut descend = None;
            while *p < end {
                let t = types[*p];
                if t == RULE_REF && *recurse {
                    let callee = values[*p] as usize;
                    if !may_be_empty[callee] {
                        *recurse = false;
                    }
                    *p += 1;
                    if in_progress[callee] {
                        return invalid(format!(
                            "unsupported grammar, left recursion detected for nonterminal (rule index {callee})"
                        ));
                    }
                    if !visited[callee] {
                        descend = Some(callee);
                        break;
                    }
                } else {
                    *recurse = eos(t);
                    *p += 1;
                }
            }
            match descend {
                Some(c) => {
                    in_progress[c] = true;
                    frames.push((c, rule_start[c] as usize, true));
                }
                None => {
                    in_progress[r] = false;
                    visited[r] = true;
                    frames.pop();
                }
            }
        }
    }
    Ok(())
}

/// The mutable part of llama_grammar: the stacks and the partial UTF-8 sequence.
#[derive(Clone, Debug)]
pub struct State {
    pub stacks: Vec<Vec<u32>>,
    pub partial: Partial,
}

impl State {
    /// An empty stack: the grammar may end here (end-of-generation is allowed).
    pub fn can_end(&self) -> bool {
        self.stacks.iter().any(|s| s.is_empty())
    }

    /// The state after token `token` spelled `piece`, or None where no stack survives
    /// (llama_grammar_accept_token, which throws there; this state is unchanged).
    pub fn next(&self, g: &Grammar, token: u32, piece: &[u8]) -> Option<State> {
        let mut cps = Vec::new();
        let partial = decode_utf8(piece, self.partial, &mut cps);
        let mut out: Vec<Vec<u32>> = Vec::new();
        for st in &self.stacks {
            let Some(&top) = st.last() else { continue };
            if g.is_token(top) {
                if g.token_matches(top, token) {
                    let mut base = st[..st.len() - 1].to_vec();
                    if !g.is_eos(top + 1) {
                        base.push(top + 1);
                    }
                    g.advance(base, &mut out);
                }
                continue;
            }
            let mut cur = vec![st.clone()];
            for &c in &cps {
                cur = g.accept_chr(&cur, c);
                if cur.is_empty() {
                    break;
                }
            }
            for s in cur {
                push_unique(&mut out, s);
            }
        }
        if out.is_empty() {
            None
        } else {
            Some(State { stacks: out, partial })
        }
    }

    /// llama_grammar_accept_str (text only): returns false when no stack is left (the
    /// state is then the failed one, as llama.cpp leaves it).
    pub fn accept_bytes(&mut self, g: &Grammar, data: &[u8]) -> bool {
        let mut cps = Vec::new();
        let partial = decode_utf8(data, self.partial, &mut cps);
        for &c in &cps {
            self.stacks = g.accept_chr(&self.stacks, c);
        }
        self.partial = partial;
        !self.stacks.is_empty()
    }

    /// llama_grammar_reject_candidates for one candidate (not an end-of-generation token).
    pub fn allows(&self, g: &Grammar, token: u32, piece: &[u8]) -> bool {
        self.allows_with(g, token, piece, &mut Vec::new())
    }

    fn allows_with(&self, g: &Grammar, token: u32, piece: &[u8], cps: &mut Vec<u32>) -> bool {
        if piece.first().map_or(true, |&b| b == 0) {
            return false;
        }
        let partial = decode_utf8(piece, self.partial, cps);
        // the stacks still alive after i code points; a stack waiting for a token decides
        // by the id as soon as it is reached inside the piece
        let mut cur: Vec<Vec<u32>> = Vec::new();
        let mut first = true;
        for &c in cps.iter() {
            let stacks = if first { &self.stacks } else { &cur };
            let mut next: Vec<Vec<u32>> = Vec::new();
            for st in stacks {
                let Some(&top) = st.last() else { continue };
                if g.is_token(top) {
                    if g.token_matches(top, token) {
                        return true;
                    }
                    continue;
                }
                if g.class(top).is_some_and(|cc| cc.matches(c)) {
                    g.after_char(st, &mut next);
                }
            }
            if next.is_empty() {
                return false;
            }
            cur = next;
            first = false;
        }
        let stacks = if first { &self.stacks } else { &cur };
        stacks.iter().any(|st| match st.last() {
            None => partial.1 == 0,
            Some(&top) if g.is_token(top) => partial.1 == 0,
            Some(&top) => partial.1 == 0 || g.class(top).is_some_and(|cc| cc.matches_partial(partial)),
        })
    }
}

// -- the vocabulary trie --------------------------------------------------------------

const SUB_NONASCII: u8 = 1;
const SUB_PARTIAL: u8 = 2;
/// (edges only) the child itself has tokens ending in a partial sequence
const OWN_PARTIAL: u8 = 4;

/// A trie node; its tokens are `order[lo..hi]`: first `n_complete` that end here, then
/// `n_partial` that end here inside a UTF-8 sequence, then those that go on below.
#[derive(Clone, Copy, Debug, Default)]
struct Node {
    lo: u32,
    hi: u32,
    n_complete: u32,
    n_partial: u32,
    /// children: `edges[edge_start..edge_end]`
    edge_start: u32,
    edge_end: u32,
    /// what lies strictly below: bit c for each code point c < 128 on an edge below
    /// (sub[0] bits 0-63, sub[1] bits 64-127)
    sub: [u64; 2],
    /// SUB_NONASCII: a code point >= 128 below; SUB_PARTIAL: a partial end below
    flags: u8,
}

/// Nodes with at least this many children get a [`Big`] index.
const BIG: usize = 256;

/// The index of a node with many children, over its children with code points >= 128
/// (edges `na_start..`): which of them have each ASCII code point below, or a partial
/// sequence, or a code point >= 128.
#[derive(Debug, Default)]
struct Big {
    na_start: u32,
    /// OR of those children's `sub`
    or_sub: u128,
    /// per ASCII code point c: the edges whose child's subtree spells c below the child:
    /// `items[offsets[c]..offsets[c + 1]]`
    offsets: Vec<u32>,
    items: Vec<u32>,
    /// edges whose child has or is above a token ending in a partial sequence
    partial: Vec<u32>,
    /// edges whose child has a code point >= 128 below
    nonascii: Vec<u32>,
}

/// An edge to a child, with a copy of the child's range and summary (siblings' edges are
/// contiguous, so deciding about a child does not touch the child).
#[derive(Clone, Copy, Debug, Default)]
struct Edge {
    cp: u32,
    child: u32,
    lo: u32,
    hi: u32,
    sub: [u64; 2],
    /// the child's flags, plus OWN_PARTIAL
    flags: u8,
}

/// Every token's code points (decoded from the start state) as a trie whose nodes cover
/// contiguous ranges of `order` (candidate tokens sorted by code points). Built once per
/// vocabulary; immutable and shared by every grammar used with it.
pub struct TokenTrie {
    n_vocab: usize,
    /// pieces: token t is `bytes[offsets[t]..offsets[t + 1]]`
    bytes: Vec<u8>,
    offsets: Vec<usize>,
    eog: Vec<u32>,
    nodes: Vec<Node>,
    edges: Vec<Edge>,
    /// node -> index of its non-ASCII children (nodes with at least BIG children)
    big: FxMap<u32, Big>,
    root_sub: u128,
    root_flags: u8,
    /// sorted position -> token id
    order: Vec<u32>,
    /// token id -> sorted position (u32::MAX: not a candidate)
    pos_of: Vec<u32>,
    /// sorted position -> the partial sequence the token ends in ((0, 0) when complete)
    partial: Vec<Partial>,
    /// tokens (not EOG) whose first byte is a UTF-8 continuation byte
    continuations: Vec<u32>,
    /// tokens that are not in the trie (EOG, empty, starting with NUL, invalid UTF-8)
    non_candidates: Vec<u32>,
}

impl TokenTrie {
    /// `pieces[t]`: token t's bytes (llama_token_to_piece with special tokens rendered);
    /// `eog`: the end-of-generation ids.
    pub fn new(pieces: &[&[u8]], eog: &[u32]) -> Result<TokenTrie> {
        let n = pieces.len();
        if n >= u32::MAX as usize {
            return invalid("vocabulary too large");
        }
        let mut is_eog = vec![false; n];
        let mut eog_ids = Vec::new();
        for &t in eog {
            if (t as usize) < n && !is_eog[t as usize] {
                is_eog[t as usize] = true;
                eog_ids.push(t);
            }
        }
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for p in pieces {
            bytes.extend_from_slice(p);
            offsets.push(bytes.len());
        }
        // candidates: not EOG, non-empty, first byte not NUL, decodes without error
        let mut keys: Vec<(Vec<u32>, Partial, u32)> = Vec::new();
        let mut continuations = Vec::new();
        let mut cps = Vec::new();
        for (t, p) in pieces.iter().enumerate() {
            if is_eog[t] || p.is_empty() || p[0] == 0 {
                continue;
            }
            if p[0] >> 6 == 2 {
                continuations.push(t as u32);
            }
            let partial = decode_utf8(p, (0, 0), &mut cps);
            if partial.1 < 0 {
                continue;
            }
            keys.push((cps.clone(), partial, t as u32));
        }
        keys.sort_unstable();
        let m = keys.len();
        let mut order = Vec::with_capacity(m);
        let mut partial = Vec::with_capacity(m);
        let mut pos_of = vec![u32::MAX; n];
        for (i, k) in keys.iter().enumerate() {
            order.push(k.2);
            partial.push(k.1);
            pos_of[k.2 as usize] = i as u32;
        }
        let non_candidates = (0..n as u32).filter(|&t| pos_of[t as usize] == u32::MAX).collect();
        // nodes in creation order (preorder); edges as (parent, code point, child), each
        // parent's children created in increasing code point order
        let mut nodes = vec![Node { hi: m as u32, ..Node::default() }];
        let mut raw_edges: Vec<(u32, u32, u32)> = Vec::new();
        let mut path: Vec<u32> = vec![0];
        let mut prev: &[u32] = &[];
        fn close(nodes: &mut [Node], path: &mut Vec<u32>, prev: &[u32], idx: u32) {
            let node = path.pop().unwrap_or(0) as usize;
            nodes[node].hi = idx;
            let c = prev[path.len() - 1];
            let mut sub = nodes[node].sub;
            let mut flags = nodes[node].flags;
            if c < 128 {
                sub[(c / 64) as usize] |= 1u64 << (c % 64);
            } else {
                flags |= SUB_NONASCII;
            }
            if nodes[node].n_partial > 0 {
                flags |= SUB_PARTIAL;
            }
            let parent = &mut nodes[*path.last().unwrap_or(&0) as usize];
            parent.sub[0] |= sub[0];
            parent.sub[1] |= sub[1];
            parent.flags |= flags;
        }
        for (idx, (k_cps, k_partial, _)) in keys.iter().enumerate() {
            let idx = idx as u32;
            let mut k = 0;
            let lim = prev.len().min(k_cps.len());
            while k < lim && prev[k] == k_cps[k] {
                k += 1;
            }
            while path.len() > k + 1 {
                close(&mut nodes, &mut path, prev, idx);
            }
            for &c in &k_cps[path.len() - 1..] {
                let child = nodes.len() as u32;
                nodes.push(Node { lo: idx, hi: idx, ..Node::default() });
                raw_edges.push((*path.last().unwrap_or(&0), c, child));
                path.push(child);
            }
            let node = &mut nodes[*path.last().unwrap_or(&0) as usize];
            if k_partial.1 == 0 {
                node.n_complete += 1; // complete ends sort first at a node
            } else {
                node.n_partial += 1;
            }
            prev = k_cps;
        }
        while path.len() > 1 {
            close(&mut nodes, &mut path, prev, m as u32);
        }
        // children as contiguous ranges (a stable counting sort by parent)
        let mut counts = vec![0u32; nodes.len() + 1];
        for &(p, _, _) in &raw_edges {
            counts[p as usize + 1] += 1;
        }
        for i in 0..nodes.len() {
            counts[i + 1] += counts[i];
        }
        let mut edges = vec![Edge::default(); raw_edges.len()];
        let mut fill = counts.clone();
        for &(p, c, child) in &raw_edges {
            let ch = &nodes[child as usize];
            let own = if ch.n_partial > 0 { OWN_PARTIAL } else { 0 };
            edges[fill[p as usize] as usize] =
                Edge { cp: c, child, lo: ch.lo, hi: ch.hi, sub: ch.sub, flags: ch.flags | own };
            fill[p as usize] += 1;
        }
        let root_sub = (nodes[0].sub[0] as u128) | ((nodes[0].sub[1] as u128) << 64);
        let root_flags = nodes[0].flags;
        for (i, node) in nodes.iter_mut().enumerate() {
            node.edge_start = counts[i];
            node.edge_end = counts[i + 1];
        }
        let mut big: FxMap<u32, Big> = FxMap::default();
        for (ni, node) in nodes.iter().enumerate() {
            let (e0, e1) = (node.edge_start as usize, node.edge_end as usize);
            if e1 - e0 < BIG {
                continue;
            }
            let na_start = e0 + edges[e0..e1].partition_point(|e| e.cp < 128);
            let mut b = Big { na_start: na_start as u32, ..Big::default() };
            let mut per_c: Vec<Vec<u32>> = vec![Vec::new(); 128];
            for (k, e) in edges.iter().enumerate().take(e1).skip(na_start) {
                let sub = (e.sub[0] as u128) | ((e.sub[1] as u128) << 64);
                b.or_sub |= sub;
                let mut bits = sub;
                while bits != 0 {
                    per_c[bits.trailing_zeros() as usize].push(k as u32);
                    bits &= bits - 1;
                }
                if e.flags & (SUB_PARTIAL | OWN_PARTIAL) != 0 {
                    b.partial.push(k as u32);
                }
                if e.flags & SUB_NONASCII != 0 {
                    b.nonascii.push(k as u32);
                }
            }
            b.offsets.push(0);
            for list in &per_c {
                b.items.extend_from_slice(list);
                b.offsets.push(b.items.len() as u32);
            }
            big.insert(ni as u32, b);
        }
        Ok(TokenTrie {
            n_vocab: n,
            bytes,
            offsets,
            eog: eog_ids,
            nodes,
            edges,
            big,
            root_sub,
            root_flags,
            order,
            pos_of,
            partial,
            continuations,
            non_candidates,
        })
    }

    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// Token t's bytes (t < n_vocab).
    pub fn piece(&self, t: u32) -> &[u8] {
        &self.bytes[self.offsets[t as usize]..self.offsets[t as usize + 1]]
    }

    pub fn is_eog(&self, t: u32) -> bool {
        self.eog.contains(&t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// root ::= "a" [b-c]* | <[7]>   (flat, as the Python parser lays it out)
    fn small() -> Grammar {
        // rule 0: root ::= "a" r1 | <[7]> ; rule 1: r1 ::= [b-c] r1 |
        let types = vec![CHAR, RULE_REF, ALT, TOKEN, END, CHAR, CHAR_RNG_UPPER, RULE_REF, ALT, END];
        let values = vec![b'a' as u32, 1, 0, 7, 0, b'b' as u32, b'c' as u32, 1, 0, 0];
        Grammar::new(types, values, vec![0, 5], 0).unwrap()
    }

    #[test]
    fn accepts_and_masks() {
        let g = small();
        let pieces: Vec<&[u8]> = vec![b"</s>", b"a", b"ab", b"abc", b"b", b"cb", b"d", b"x", b"\xc3", b"a\xc3"];
        let trie = TokenTrie::new(&pieces, &[0]).unwrap();
        let s = g.start_state();
        let mut mask = vec![false; pieces.len()];
        g.mask(&trie, &s, &mut mask).unwrap();
        let per: Vec<bool> = (0..pieces.len() as u32).map(|t| t != 0 && s.allows(&g, t, pieces[t as usize])).collect();
        assert_eq!(mask, per);
        assert_eq!(mask, vec![false, true, true, true, false, false, false, true, false, false]);
        let s = s.next(&g, 2, b"ab").unwrap();
        assert!(s.can_end());
        g.mask(&trie, &s, &mut mask).unwrap();
        assert_eq!(mask, vec![true, false, false, false, true, true, false, false, false, false]);
        assert!(s.next(&g, 6, b"d").is_none());
    }

    #[test]
    fn rejects_bad_arrays_and_left_recursion() {
        assert!(Grammar::new(vec![CHAR], vec![1], vec![0], 0).is_err()); // no END
        assert!(Grammar::new(vec![RULE_REF, END], vec![3, 0], vec![0], 0).is_err()); // undefined
        assert!(Grammar::new(vec![CHAR_RNG_UPPER, END], vec![3, 0], vec![0], 0).is_err());
        // root ::= root "a"
        let e = Grammar::new(vec![RULE_REF, CHAR, END], vec![0, 97, 0], vec![0], 0);
        assert!(e.err().unwrap().to_string().contains("left recursion"));
    }

    #[test]
    fn decodes_like_llama_cpp() {
        let mut cps = Vec::new();
        assert_eq!(decode_utf8("é".as_bytes(), (0, 0), &mut cps), (0, 0));
        assert_eq!(cps, vec![0xE9]);
        assert_eq!(decode_utf8(b"\xc3", (0, 0), &mut cps), (3, 1));
        assert_eq!(decode_utf8(b"\xa9x", (3, 1), &mut cps), (0, 0));
        assert_eq!(cps, vec![0xE9, b'x' as u32]);
        assert_eq!(decode_utf8(b"\x80", (0, 0), &mut cps), (0, -1));
        assert_eq!(decode_utf8(b"a\0b", (0, 0), &mut cps), (0, 0));
        assert_eq!(cps, vec![b'a' as u32]);
    }
}
