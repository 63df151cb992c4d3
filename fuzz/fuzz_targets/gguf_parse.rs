//! Any byte string must parse or return an error: never panic, never read out of bounds,
//! never allocate without bound. Whatever parses must give in-bounds tensor slices.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pyllama_core::gguf::{GgufFile, Storage};

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = GgufFile::from_storage("fuzz.gguf", Storage::from_bytes(data)) {
        for t in &f.tensors {
            let d = f.tensor_data(t);
            assert_eq!(d.len() as u64, t.nbytes);
        }
        // the vocabulary tables built from whatever tokenizer arrays parsed, and both merge loops
        for merges in [false, true] {
            if let Ok(v) = pyllama_core::vocab::store_from_metadata(|k| f.get(k), merges) {
                let mut out = Vec::new();
                v.bpe_word("hello world".as_bytes(), Default::default(), &mut out);
                let _ = v.spm("\u{2581}hello".as_bytes(), &mut out);
            }
        }
    }
});
